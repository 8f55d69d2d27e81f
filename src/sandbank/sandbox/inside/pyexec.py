"""The persistent Python namespace: one shell for the session's life, a call's status and outputs.

The code runs in IPython's shell as adapted in `notebook.py`; here a call becomes an exit
status (0, 1, 130 for an interrupt, `SystemExit`'s code), its display bundles, and its figures
saved; a fork of user code that comes back here ends. A runner has a namespace of its own (the
session's main one, or a context's: contexts.py), swapped into the one shell while it runs. In
a notebook call the last value becomes `main` and an exception `error` instead of text.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

from .display import bundle_of
from .notebook import Publisher, SandboxShell, rewind


class PythonRunner:
    """One shell for the session's life; `run` returns the call's exit status.

    The call's display bundles (`display(obj)`, an echoed value's rich forms) are in
    `displays` after `run`, and handed to `on_display` as each is made.
    """

    def __init__(
        self,
        shell: SandboxShell,
        forked: Callable[[], bool],
        module: types.ModuleType | None = None,
    ) -> None:
        self.shell = shell
        self.forked = forked  # true in a fork of user code (os.fork) that came back here
        self.publisher: Publisher = shell.display_pub
        # Its namespace: the shell's own (the session's main one), or a context's.
        self.module = module
        # A notebook call (contexts.py): the last value is `main`, an exception `error`.
        self.notebook = False
        self.main: dict[str, Any] | None = None
        self.error: dict[str, str] | None = None

    def display(self, obj: Any) -> None:
        """Show an object as `display(obj)` does (a figure in a notebook call, say)."""
        data, metadata = self.shell.display_formatter.format(obj)
        self.publisher.publish(data, metadata)

    @property
    def displays(self) -> list[dict[str, Any]]:
        return self.publisher.bundles

    @property
    def on_display(self) -> Callable[[dict[str, Any]], None] | None:
        return self.publisher.on_display

    @on_display.setter
    def on_display(self, fn: Callable[[dict[str, Any]], None] | None) -> None:
        self.publisher.on_display = fn

    def warm_up(self) -> None:
        """Run a first cell as a client's would run (then forget it), so theirs finds all made.

        It echoes a value: the formatters' pages are then copied before a lease, not during a
        first call (bench/fork.py, a burst of 40 first calls: p50 ~70 ms with "None" here, ~35 ms
        with "1", ~20 ms before IPython).

        Then one that fails, unless the fork template did (`notebook.prepare`): IPython's first
        traceback costs ~0.1 s natively and ~0.6 s under gVisor (imports, source reads), which a
        timed-out call's interrupt did not have (the worker was killed, its state lost).
        """
        self.run("1")
        if not self.shell.errors_warm:
            self.run("1 / 0")
            self.shell.errors_warm = True
        rewind(self.shell)

    def run(self, code: str) -> int:
        self.publisher.begin()
        status = self._run(code)
        if self.forked():
            # A fork of user code (os.fork) came back here: it ends, and never answers a call.
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status & 0xFF)
        save_figures()
        return status

    def _run(self, code: str) -> int:
        self.main = self.error = None
        shell = self.shell
        shell.on_echo = self._echoed if self.notebook else None
        shell.on_error = self._failed if self.notebook else None
        try:
            with in_namespace(shell, self.module):
                result = shell.run_cell(code, store_history=True)
        finally:
            shell.on_echo = shell.on_error = None
            shell.forget()
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            return 0
        if isinstance(error, SystemExit):
            if error.code is None:
                return 0
            if isinstance(error.code, int):
                return error.code
            print(error.code, file=sys.stderr)
            return 1
        return 130 if isinstance(error, KeyboardInterrupt) else 1

    def _echoed(self, format_dict: dict[str, Any]) -> None:
        self.main = bundle_of(format_dict)

    def _failed(self, name: str, value: str, text: str) -> None:
        self.error = {"name": name, "value": value, "traceback": text}


@contextlib.contextmanager
def in_namespace(shell: SandboxShell, module: types.ModuleType | None) -> Iterator[None]:
    """The shell runs in `module`'s namespace for a while (None: its own, the main one)."""
    if module is None or module is shell.user_module:
        yield
        return
    own_module, own_ns = shell.user_module, shell.user_ns
    namespace = module.__dict__
    # What IPython keeps in a namespace of its own (`_oh`, `In`, `exit`...), shared.
    for name in shell.user_ns_hidden:
        if name in own_ns:
            namespace.setdefault(name, own_ns[name])
    shell.user_module, shell.user_ns = module, namespace
    try:
        yield
    finally:
        shell.user_module, shell.user_ns = own_module, own_ns


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
