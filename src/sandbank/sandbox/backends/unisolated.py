"""The UNISOLATED development backend: the worker runs as a plain child process, with no limits.

Only for machines where bubblewrap or cgroups cannot run, chosen explicitly with
SANDBANK_ISOLATION=none; the server logs a loud warning at start-up. Code can read the
host's files and reach the network. The environment is still built fresh (no secrets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from ...errors import Conflict
from ..channel import WorkerProcess
from ..egress import EgressConfig
from ..host.layout import INSIDE_DIR
from ..supervisor import SupervisedSandbox
from .base import INTERPRETERS, RUNTIME, Backend, new_sandbox_id

log = logging.getLogger(__name__)


class PlainBox:
    """A worker as a plain child process: no isolation (development only)."""

    def __init__(self, directory: Path, *, runtime_dir: Path, preimport: bool) -> None:
        self.dir = directory
        self.runtime_dir = runtime_dir
        self.preimport = preimport
        self.uid = 0  # the server's own user owns the files
        self.root_policy: tuple[int, int, int] | None = None

    @property
    def workspace(self) -> Path:
        return self.dir / "ws"

    async def acquire(self) -> None:
        self.workspace.mkdir(parents=True, mode=0o700)

    async def launch(self) -> WorkerProcess:
        python = self.runtime_dir / "bin" / "python3"
        if not python.exists():
            python = Path(sys.executable)
        ws = str(self.workspace)
        env = {
            "PATH": f"{self.runtime_dir}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": ws,
            "LANG": "C.UTF-8",
            "SANDBANK_WORKSPACE": ws,
            "SANDBANK_PREIMPORT": "1" if self.preimport else "0",
            "MPLBACKEND": "module://sandbank_mplbackend",
            "MPLCONFIGDIR": str(self.dir / ".matplotlib"),
            "PYTHONPATH": f"{self._lib()}:{INSIDE_DIR / 'mpl'}",
        }
        argv = [str(python), "-s", "-m", "sandbank_inside.worker"]
        pipe = WorkerProcess.interrupt_pipe()
        env["SANDBANK_INTERRUPT_FD"] = str(pipe[0])
        return await WorkerProcess.spawn(argv, env=env, pass_fds=[], interrupt_pipe=pipe, cwd=ws)

    def _lib(self) -> Path:
        """A directory where the in-sandbox package is importable as `sandbank_inside`."""
        lib = self.dir / "lib"
        if not lib.exists():
            lib.mkdir()
            (lib / "sandbank_inside").symlink_to(INSIDE_DIR)
        return lib

    async def kill_everything(self, worker: WorkerProcess | None) -> None:
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)  # the worker and its children
            await worker.wait(timeout=2.0)

    async def release(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.dir, True)

    def oom_count(self) -> int:
        return 0

    async def keep_disk(self, dest: Path) -> None:
        raise Conflict("sessions cannot be paused without isolation (SANDBANK_ISOLATION=none)")

    async def freeze_copy(self, dest: Path) -> None:
        raise Conflict("sessions cannot be paused without isolation (SANDBANK_ISOLATION=none)")


class UnisolatedBackend(Backend):
    """Workers as plain child processes of the server: development only."""

    name = "none"
    claims = frozenset({RUNTIME, INTERPRETERS})

    def check(self) -> None:
        log.warning(
            "!!! SANDBANK_ISOLATION=none: sandboxes are NOT isolated. Code runs as this "
            "server's user with its file system and network. Development use only. !!!"
        )
        if EgressConfig.from_settings(self.settings).enabled:
            log.warning("egress policies are not enforced without isolation: code has the network")

    def new(self, preimport: bool) -> SupervisedSandbox:
        sandbox_id = new_sandbox_id()
        box = PlainBox(
            self.base_dir / sandbox_id, runtime_dir=self.runtime_dir, preimport=preimport
        )
        return SupervisedSandbox(sandbox_id, box, self.limits)
