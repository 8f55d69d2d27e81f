"""The persistent Python namespace: one shell for the session's life, a call's status and outputs.

The code runs in IPython's shell as adapted in `notebook.py`; here a call becomes an exit
status (0, 1, 130 for an interrupt, `SystemExit`'s code), its display bundles, and its figures
saved; a fork of user code that comes back here ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .notebook import Publisher, SandboxShell, rewind


class PythonRunner:
    """One shell for the session's life; `run` returns the call's exit status.

    The call's display bundles (`display(obj)`, an echoed value's rich forms) are in
    `displays` after `run`, and handed to `on_display` as each is made.
    """

    def __init__(self, shell: SandboxShell, owner_pid: int) -> None:
        self.shell = shell
        self.owner_pid = owner_pid
        self.publisher: Publisher = shell.display_pub

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
        """
        self.run("1")
        rewind(self.shell)

    def run(self, code: str) -> int:
        self.publisher.begin()
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
        try:
            result = self.shell.run_cell(code, store_history=True)
        finally:
            self.shell.forget()
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
