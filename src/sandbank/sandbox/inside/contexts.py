"""Python contexts: namespaces beside the session's main one, each with its working directory.

A call names its context (none: the main namespace). Whatever engine runs a cell, a context is
only which namespace it runs in, the directory it runs in (kept from one call to the next),
and, for the call alone, its environment variables and how it reports its last value.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

from . import protocol as p
from .pyexec import PythonRunner

# While a notebook call runs: how a figure shown (plt.show(), or open at the end) is displayed,
# read by the matplotlib backend (sandbank_mplbackend), which otherwise saves it as a file.
show_figure: Callable[[Any], None] | None = None


class Contexts:
    """The main runner and one per context id, made on first use."""

    def __init__(self, main: PythonRunner, workspace: str) -> None:
        self.main = main
        self.workspace = workspace
        self.runners: dict[str, PythonRunner] = {}
        self.cwds: dict[str | None, str] = {}
        # The context the process's working directory belongs to now (its directory is asked
        # for only when another context is entered: no getcwd, no chdir on a call's path).
        self.current: str | None = None

    def _runner(self, context: str | None) -> PythonRunner:
        if context is None:
            return self.main
        runner = self.runners.get(context)
        if runner is None:
            runner = self.runners[context] = PythonRunner(
                self.main.shell, self.main.forked, types.ModuleType("__main__")
            )
        return runner

    @contextlib.contextmanager
    def entered(self, msg: dict[str, Any]) -> Iterator[PythonRunner]:
        """The call's runner, in its context's directory, with the call's variables set."""
        global show_figure
        context = msg.get(p.CONTEXT)
        context = str(context) if context is not None else None
        runner = self._runner(context)
        self._enter_directory(context, msg)
        envs = {str(k): str(v) for k, v in (msg.get(p.ENVS) or {}).items()}
        saved = {k: os.environ.get(k) for k in envs}
        os.environ.update(envs)
        notebook = bool(msg.get(p.NOTEBOOK))
        runner.notebook = notebook
        if notebook:
            show_figure = runner.display
        try:
            yield runner
        finally:
            show_figure = None
            runner.notebook = False
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _enter_directory(self, context: str | None, msg: dict[str, Any]) -> None:
        """Into the context's directory: where its last call left it, or on its first use the
        call's `cwd` (else the workspace). The context left keeps the directory it was in."""
        if context == self.current and context in self.cwds:
            return  # the same context as the last call: the process is where it left it
        if self.current in self.cwds:
            with contextlib.suppress(OSError):
                self.cwds[self.current] = os.getcwd()
        cwd = self.cwds.get(context) or str(msg.get(p.CWD) or self.workspace)
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        self.cwds[context] = cwd
        self.current = context

    def drop(self, context: str) -> None:
        self.runners.pop(context, None)
        self.cwds.pop(context, None)
