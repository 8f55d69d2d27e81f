"""The persistent Python namespace: run a cell as a notebook does, echo its last expression."""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .display import MAX_BUNDLES, REPR_METHODS, bundle

_HERE = {__file__}


def hide_frames_of(*files: str) -> None:
    """Frames of these files are dropped from users' tracebacks (the worker's own code)."""
    _HERE.update(files)


class PythonRunner:
    """One namespace for the session's life; `run` returns the cell's exit status.

    `display(obj)` is in the namespace, as in IPython: it adds a bundle of the object's
    representations to the call's `displays` (and hands it to `on_display` as it is made).
    """

    def __init__(self, namespace: dict[str, Any], owner_pid: int) -> None:
        self.namespace = namespace
        self.namespace["__builtins__"] = __builtins__
        self.namespace["display"] = self.display
        self.namespace[SHELL_HOOK] = run_shell_line
        self.namespace[PIP_HOOK] = refuse_pip
        self.owner_pid = owner_pid
        self.cell = 0
        self.displays: list[dict[str, Any]] = []
        self.on_display: Callable[[dict[str, Any]], None] | None = None
        # A notebook call (contexts.py): the last value is `main`, an exception `error`.
        self.notebook = False
        self.main: dict[str, Any] | None = None
        self.error: dict[str, str] | None = None

    def display(self, *objs: Any) -> None:
        """Show objects as a notebook does (a table for a DataFrame, an image for a figure)."""
        for obj in objs:
            if len(self.displays) >= MAX_BUNDLES:
                return
            shown = bundle(obj)
            self.displays.append(shown)
            if self.on_display is not None:
                self.on_display(shown)

    def run(self, code: str) -> int:
        self.displays = []
        self.main = self.error = None
        status = self._run(code)
        if os.getpid() != self.owner_pid:
            # A fork of user code (os.fork) came back here: it ends, and never answers a call.
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status & 0xFF)
        save_figures()
        return status

    def _run(self, code: str) -> int:
        self.cell += 1
        filename = f"<cell {self.cell}>"
        # Tracebacks show the offending line, as in a notebook.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
        except SyntaxError as e:
            converted = convert_magics(code)
            try:
                if converted is None:
                    raise e from None
                tree = ast.parse(converted, filename, "exec")
            except (SyntaxError, ValueError) as e2:
                self._report(e2, None)
                return 1
        except ValueError as e:
            self._report(e, None)
            return 1
        last = None
        # As in Jupyter, a bare last expression is echoed, unless a `;` ends the cell.
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not ends_with_semicolon(code):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        try:
            exec(compile(tree, filename, "exec"), self.namespace)  # noqa: S102 - the product
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)  # noqa: S307
                if value is not None and self.notebook:
                    self.main = bundle(value)
                elif value is not None:
                    print(repr(value))
                    if _is_rich(value):
                        self.display(value)
            return 0
        except SystemExit as e:
            if e.code is None:
                return 0
            if isinstance(e.code, int):
                return e.code
            print(e.code, file=sys.stderr)
            return 1
        except BaseException as e:
            tb = e.__traceback__
            # Drop our own frames: the user sees only their cell's.
            while tb is not None and tb.tb_frame.f_code.co_filename in _HERE:
                tb = tb.tb_next
            self._report(e, tb)
            return 130 if isinstance(e, KeyboardInterrupt) else 1

    def _report(self, e: BaseException, tb: Any) -> None:
        if self.notebook:
            text = "".join(traceback.format_exception(type(e), e, tb))
            self.error = {"name": type(e).__name__, "value": str(e), "traceback": text}
        else:
            traceback.print_exception(type(e), e, tb)


SHELL_HOOK, PIP_HOOK = "_sandbank_shell_line", "_sandbank_pip_line"
PIP_REFUSAL = (
    "%pip is not available in this sandbox: it has no network access. Packages are installed "
    'by the server\'s operator (make install SANDBANK_EXTRA_PACKAGES="name ...").'
)


def convert_magics(code: str) -> str | None:
    """IPython's conveniences LLM-written code uses: `!command` lines and `%pip`; None if none."""
    out, changed = [], False
    for line in code.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith("!"):
            out.append(f"{indent}{SHELL_HOOK}({stripped[1:]!r})")
            changed = True
        elif stripped.startswith(("%pip", "%%pip")):
            out.append(f"{indent}{PIP_HOOK}({stripped!r})")
            changed = True
        else:
            out.append(line)
    return "\n".join(out) if changed else None


def run_shell_line(command: str) -> int:
    """`!command`: run in bash, its output in the cell's output, as IPython's `!` does."""
    import subprocess

    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run(["bash", "-c", command], check=False).returncode


def refuse_pip(line: str) -> None:
    print(PIP_REFUSAL, file=sys.stderr)


def _is_rich(value: Any) -> bool:
    """Whether an echoed value has more than its text (its text is already on stdout)."""
    if isinstance(value, str | int | float | bool | bytes | list | tuple | dict | set):
        return False
    return any(hasattr(value, method) for method, _ in REPR_METHODS) or (
        type(value).__name__ == "Figure"
    )


def ends_with_semicolon(code: str) -> bool:
    lines = [line for line in code.rstrip().splitlines() if line.strip()]
    return bool(lines) and lines[-1].split("#", 1)[0].rstrip().endswith(";")


def save_figures() -> None:
    """Figures still open at the end of a call are saved and closed, as `plt.show()` does."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not plt.get_fignums():
        return
    try:
        import sandbank_mplbackend

        sandbank_mplbackend.save_all()
    except Exception:
        traceback.print_exc()
