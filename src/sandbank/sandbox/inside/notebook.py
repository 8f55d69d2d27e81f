"""IPython's InteractiveShell, adapted to a sandbox: each call runs as a Jupyter kernel's cell.

IPython's own `InteractiveShell` runs the code (magics, `!cmd`, top-level `await`, the last
expression echoed, `IPython.display`), adapted where a sandbox differs from a kernel:
- an echoed value's text goes to stdout, and its rich forms (a DataFrame's table...) become a
  display bundle, as `display(obj)`'s do (`display.py`): no `Out[n]` caches of old values;
- tracebacks go to stderr, without colour, from the user's frames on;
- `SystemExit(n)` ends the call with return code n, as it ends a script;
- `!cmd` and `x = !cmd` run in bash; `%pip` runs the sandbox's pip (which says what the
  network policy allows); `%matplotlib` keeps the backend that saves figures as files;
- no history database, no history thread, no output kept after a call.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import os
import pathlib
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from IPython.core.compilerop import CachingCompiler
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.profiledir import ProfileDir
from IPython.utils.text import LSString, SList
from traitlets import Type
from traitlets.config import Config

from .display import MAX_BUNDLES, bundle_of, figure_png

CONDA_REFUSAL = (
    "%{0} is not available in this sandbox (there is no conda): packages come from PyPI "
    "with %pip, as the session's network policy allows; otherwise the server's operator "
    "installs them."
)
GUI_NOTE = (
    "[sandbank] figures are saved as PNG files here (and display(fig) shows one inline); "
    "`%matplotlib {0}` changes nothing."
)


class Publisher(DisplayPublisher):  # type: ignore[misc]
    """Where `display()` sends a formatted object: the call's display bundles, as they come."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bundles: list[dict[str, Any]] = []
        self.ids: list[str | None] = []  # each bundle's display_id, for update_display
        self.on_display: Callable[[dict[str, Any]], None] | None = None
        self.clear_pending = False

    def begin(self) -> None:
        self.bundles, self.ids, self.clear_pending = [], [], False

    def publish(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        source: Any = None,
        *,
        transient: dict[str, Any] | None = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        if self.clear_pending:
            self.begin()
        display_id = (transient or {}).get("display_id")
        shown = bundle_of(data)
        if update and display_id in self.ids:
            self.bundles[self.ids.index(display_id)] = shown
        elif len(self.bundles) >= MAX_BUNDLES:
            return
        else:
            self.bundles.append(shown)
            self.ids.append(display_id)
        if self.on_display is not None:
            self.on_display(shown)

    def clear_output(self, wait: bool = False) -> None:
        """The call's display bundles so far are dropped (now, or at the next display)."""
        if wait:
            self.clear_pending = True
        else:
            self.begin()


class EchoHook(DisplayHook):  # type: ignore[misc]
    """The last expression's value: its text on stdout; a display bundle when it has more.

    `_`, `__` and `___` are kept; `Out` and `_N` are not (they would hold every value ever
    echoed for the session's life).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.do_full_cache = 0

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(
        self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None
    ) -> None:
        if self.shell.on_echo is not None:  # a notebook call: the value is its main result
            self.shell.on_echo(format_dict)
            return
        text = format_dict.get("text/plain")
        if text is not None:
            sys.stdout.write(f"{text}\n")
        if set(format_dict) - {"text/plain"}:
            self.shell.display_pub.publish(format_dict)

    def log_output(self, format_dict: dict[str, Any]) -> None:
        pass

    def finish_displayhook(self) -> None:
        sys.stdout.flush()
        self._is_active = False


@magics_class
class SandboxMagics(Magics):  # type: ignore[misc]
    """Magics whose kernel versions assume a machine the sandbox is not."""

    @line_magic  # type: ignore[untyped-decorator]
    def pip(self, line: str) -> None:
        """Run the sandbox's pip (the one `!pip` runs): its network policy decides."""
        self.shell.system(f"pip {line}")

    @line_magic  # type: ignore[untyped-decorator]
    def conda(self, line: str) -> None:
        print(CONDA_REFUSAL.format("conda"), file=sys.stderr)

    @line_magic  # type: ignore[untyped-decorator]
    def mamba(self, line: str) -> None:
        print(CONDA_REFUSAL.format("mamba"), file=sys.stderr)


class ParsedOnce(CachingCompiler):  # type: ignore[misc]
    """IPython's compiler, handed the tree `transform_cell` already parsed for a cell.

    IPython parses each cell again before compiling it: for a cell of ~130 lines that is ~1 ms
    here, once more than needed. The tree is handed over once (the shell's AST transformers may
    change it) and only for the very source it was parsed from, with the same flags.
    """

    parsed: tuple[str, ast.AST] | None = None

    def ast_parse(self, source: str, filename: str = "<unknown>", symbol: str = "exec") -> ast.AST:
        parsed, self.parsed = self.parsed, None
        if parsed is not None and symbol == "exec" and parsed[0] == source:
            return parsed[1]
        tree: ast.AST = super().ast_parse(source, filename, symbol)
        return tree


class SandboxShell(InteractiveShell):  # type: ignore[misc]
    compiler_class = Type(ParsedOnce)
    displayhook_class = Type(EchoHook)
    display_pub_class = Type(Publisher)
    # In a notebook call (contexts.py): where the last value and an exception go, not text.
    on_echo: Callable[[dict[str, Any]], None] | None = None
    on_error: Callable[[str, str, str], None] | None = None
    # Whether a failing cell has run (then been rewound): the first traceback's formatting costs
    # ~0.1 s natively and ~0.6 s under gVisor, too long for a timed-out call's interrupt.
    errors_warm = False

    def init_ipython_dir(self, ipython_dir: str | None) -> None:
        pass  # no ~/.ipython: the workspace is the user's, and no profile is read

    def init_profile_dir(self, profile_dir: Any) -> None:
        self.profile_dir = ProfileDir()  # without a location: nothing is made on disk

    def init_magics(self) -> None:
        super().init_magics()
        self.register_magics(SandboxMagics)

    def transform_cell(self, raw_cell: str) -> str:
        """IPython's, except that valid Python no transform would change is taken as it is.

        IPython's transforms re-tokenize every cell in Python code whose first run in each
        sandbox copies ~0.4 MiB of the template's pages; on valid Python they change nothing
        but a single line naming a magic (`pwd`, `env`: automagic), which still goes through.
        """
        cell = raw_cell if raw_cell.endswith("\n") else raw_cell + "\n"
        try:  # as IPython's compiler will parse it: its flags (earlier cells' __future__s)
            tree = compile(cell, "<cell>", "exec", self.compile.flags | ast.PyCF_ONLY_AST, True)
        except (SyntaxError, ValueError):
            return str(super().transform_cell(raw_cell))
        lines = raw_cell.strip().splitlines()
        first = lines[0].split(None, 1)[0] if lines else ""
        if len(lines) == 1 and first in self.magics_manager.magics["line"]:
            return str(super().transform_cell(raw_cell))
        self.compile.parsed = (cell, tree)
        return cell

    def should_run_async(
        self,
        raw_cell: str,
        *,
        transformed_cell: str | None = None,
        preprocessing_exc_tuple: Any = None,
    ) -> bool:
        """IPython's answer, which compiles the cell once more, only for a cell that may await."""
        cell = transformed_cell if transformed_cell is not None else raw_cell
        if "await" not in cell and "async" not in cell:
            return False
        return bool(
            super().should_run_async(
                raw_cell,
                transformed_cell=transformed_cell,
                preprocessing_exc_tuple=preprocessing_exc_tuple,
            )
        )

    @contextlib.contextmanager
    def _tee(self, channel: str) -> Iterator[None]:
        # IPython copies every write of a cell into its history: nothing here reads it back.
        yield

    def _showtraceback(self, etype: Any, evalue: Any, stb: Any) -> None:
        if self.on_error is not None:
            name = getattr(etype, "__name__", str(etype))
            self.on_error(name, str(evalue), self.InteractiveTB.stb2text(stb))
            return
        sys.stdout.flush()
        sys.stderr.write(self.InteractiveTB.stb2text(stb) + "\n")
        sys.stderr.flush()

    async def run_code(self, code_obj: Any, result: Any = None, *, async_: bool = False) -> bool:
        """IPython's, but `SystemExit` ends the call quietly (the worker returns its code)."""
        __tracebackhide__ = "__ipython_bottom__"  # read by IPython's tracebacks
        old_excepthook, sys.excepthook = sys.excepthook, self.excepthook
        self.sys_excepthook = old_excepthook
        try:
            try:
                if async_:
                    await eval(code_obj, self.user_global_ns, self.user_ns)  # noqa: S307
                else:
                    exec(code_obj, self.user_global_ns, self.user_ns)  # noqa: S102 - the product
            finally:
                sys.excepthook = old_excepthook
        except SystemExit as e:
            if result is not None:
                result.error_in_exec = e
            return True
        except BaseException as e:
            if result is not None:
                result.error_in_exec = e
            tb = e.__traceback__
            # From the user's code on: this frame is not theirs (IPython drops its own).
            self.showtraceback((type(e), e, tb.tb_next if tb else None), running_compiled_code=True)
            return True
        return False

    def system(self, cmd: str) -> None:
        """`!cmd`: bash, its output the cell's (our descriptors are the captured ones)."""
        cmd = self.var_expand(cmd, depth=1)
        _flush()
        try:
            code = subprocess.run(["bash", "-c", cmd], check=False).returncode
        except KeyboardInterrupt:
            print("\n" + self.get_exception_only(), file=sys.stderr)
            code = 130
        self.user_ns["_exit_code"] = -(code - 128) if code > 128 else code

    def getoutput(self, cmd: str, split: bool = True, depth: int = 0) -> SList | LSString:
        """`x = !cmd`: bash's output (stderr with it, as IPython gives) as a list of lines."""
        if cmd.rstrip().endswith("&"):
            raise OSError("Background processes not supported.")
        cmd = self.var_expand(cmd, depth=depth + 1)
        _flush()
        done = subprocess.run(
            ["bash", "-c", cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        out = done.stdout.decode("utf-8", "replace")
        return SList(out.splitlines()) if split else LSString(out)

    def enable_matplotlib(self, gui: str | None = None) -> tuple[str | None, str]:
        """`%matplotlib [inline]`: the backend stays ours (figures saved as files)."""
        import matplotlib.pyplot  # noqa: F401 - as the magic does

        if gui not in (None, "auto", "inline"):
            print(GUI_NOTE.format(gui), file=sys.stderr)
        return gui, str(sys.modules["matplotlib"].get_backend())

    def enable_gui(self, gui: str | None = None) -> None:
        pass  # no event loop of a GUI toolkit in a sandbox

    def forget(self) -> None:
        """Drop what IPython keeps of a finished cell beyond its inputs (`In`, `_i`)."""
        hm = self.history_manager
        hm.outputs.clear()
        hm.exceptions.clear()
        hm.output_hist_reprs.clear()
        with hm.db_input_cache_lock:
            hm.db_input_cache.clear()  # no database to write it to


def session_shell() -> SandboxShell:
    """The process's shell: made here, or in the fork template before this sandbox was forked.

    Its namespace is a fresh module, which becomes `__main__`; what depends on where it was
    made (the working directory) is taken from this process.
    """
    if SandboxShell.initialized():
        shell: SandboxShell = SandboxShell.instance()
    else:
        shell = new_shell(types.ModuleType("__main__"))
    sys.modules["__main__"] = shell.user_module
    shell.starting_dir = os.getcwd()
    shell.history_manager.dir_hist[:] = [pathlib.Path.cwd()]
    return shell


# Walked by the fork template: what these first reach (formatters' and the history's lazy
# state, a table's HTML) is then made once, in pages every sandbox shares; left for each
# sandbox, it costs ~1 MiB of its memory and ~5 ms of its first call (bench/fork.py, runtime.py).
WALK = (
    "None", "1", "import pandas as _pd\n_pd.DataFrame({'a': [1]})\n", "_pd.Series([1]).sum()",
    "1 / 0",
)  # fmt: skip


def prepare() -> None:
    """In the fork template: make the shell and walk first cells, for every sandbox to share.

    Made in each sandbox instead, it would cost ~20 ms of each start and ~7 MiB of each
    session's memory (the pages its imports and objects write). The walk leaves the shell as
    it was made: no inputs, no results, the count at 1.
    """
    shell = new_shell(types.ModuleType("__main__"))
    with (
        open(os.devnull, "w") as null,
        contextlib.redirect_stdout(null),
        contextlib.redirect_stderr(null),
    ):
        for code in WALK:
            shell.run_cell(code, store_history=True)
    shell.user_ns.pop("_pd", None)
    shell.errors_warm = True
    rewind(shell)


def rewind(shell: SandboxShell) -> None:
    """Back to a new shell's inputs and results (after cells run to warm it up): In[1] next."""
    hm = shell.history_manager
    for n in range(1, shell.execution_count):
        shell.user_ns.pop(f"_i{n}", None)
        shell.user_ns_hidden.pop(f"_i{n}", None)
    hm.input_hist_parsed[:] = [""]
    hm.input_hist_raw[:] = [""]
    hm._i00 = hm._i = hm._ii = hm._iii = ""
    hook = shell.displayhook
    hook._ = hook.__ = hook.___ = ""
    blank = dict.fromkeys(("_", "__", "___", "_i", "_ii", "_iii"), "")
    shell.push(blank, interactive=False)  # as a new shell has them
    shell.execution_count = 1
    shell.forget()
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):  # `%tb` shows none
        if hasattr(sys, name):
            delattr(sys, name)


def new_shell(main: Any) -> SandboxShell:
    """A shell whose namespace is the module `main`."""
    config = Config()
    config.HistoryManager.enabled = False  # no SQLite file, no saving thread
    config.InteractiveShell.colors = "nocolor"
    shell: SandboxShell = SandboxShell.instance(config=config, user_module=main)
    for name in ("exit", "quit"):  # Python's own, which raise SystemExit as in a script
        if hasattr(builtins, name):
            shell.user_ns[name] = shell.user_ns_hidden[name] = getattr(builtins, name)
    png = shell.display_formatter.formatters["image/png"]
    png.for_type_by_name("matplotlib.figure", "Figure", figure_png)
    return shell


def _flush() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
