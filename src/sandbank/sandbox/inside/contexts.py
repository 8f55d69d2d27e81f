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

    def __init__(self, main: PythonRunner, owner_pid: int, workspace: str) -> None:
        self.main = main
        self.owner_pid = owner_pid
        self.workspace = workspace
        self.runners: dict[str, PythonRunner] = {}
        self.cwds: dict[str | None, str] = {}

    def _runner(self, context: str | None) -> PythonRunner:
        if context is None:
            return self.main
        runner = self.runners.get(context)
        if runner is None:
            runner = self.runners[context] = PythonRunner(
                self.main.shell, self.owner_pid, types.ModuleType("__main__")
            )
        return runner

    @contextlib.contextmanager
    def entered(self, msg: dict[str, Any]) -> Iterator[PythonRunner]:
        """The call's runner, in its context's directory, with the call's variables set."""
        global show_figure
        context = msg.get(p.CONTEXT)
        context = str(context) if context is not None else None
        runner = self._runner(context)
        cwd = self.cwds.get(context) or str(msg.get(p.CWD) or self.workspace)
        with contextlib.suppress(OSError):
            if os.getcwd() != cwd:
                os.chdir(cwd)
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
            with contextlib.suppress(OSError):
                self.cwds[context] = os.getcwd()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def drop(self, context: str) -> None:
        self.runners.pop(context, None)
        self.cwds.pop(context, None)
