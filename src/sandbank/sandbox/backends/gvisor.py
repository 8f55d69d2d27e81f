"""The gvisor backend: each sandbox a gVisor container (`runsc run`), over a host slot.

The worker runs on gVisor's user-space kernel, so user code's system calls reach the Sentry,
not the host's kernel; the Sentry and its gofer run in the slot's cgroups (memory, pids, CPU),
the workspace is the slot's disk. runsc passes no descriptor but stdio: the frames travel on
stdin/stdout as with bwrap, and interrupts on a unix socket in the sandbox's `ctl` directory,
which the worker connects to first (`inside/worker.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ...config import MiB, Settings
from ...errors import IsolationUnavailable
from ..channel import WorkerProcess
from ..host import layout, runsc
from ..host.image import mounted_runtime
from ..host.machine import IsolatedHost, check_tools, reap_orphans
from ..host.slot import IsolatedBox, Slot
from ..limits import Limits
from ..supervisor import READY_TIMEOUT, SupervisedSandbox
from .base import new_sandbox_id
from .isolated import IsolatedBackend

log = logging.getLogger(__name__)

# Runs as root: joins the cgroups while the process is tiny (the Sentry and the gofer it
# starts are then in them), then becomes runsc with nothing of the server's environment.
LAUNCHER = """
n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n-1)); done
ulimit -c 0
exec env -i "$@"
"""
# The Sentry's and the gofer's own threads count against the pids cgroup (the sandbox's
# processes are the Sentry's tasks, bounded by RLIMIT_NPROC inside), and their memory
# against the memory cgroup: room for them on top of the session's limits.
SENTRY_PIDS = 512
SENTRY_MEMORY = 96 * MiB
STOP_TIMEOUT = 2.0  # for a stopped sandbox's processes to be gone (then the cgroup kills)


def host_limits(limits: Limits) -> Limits:
    return dataclasses.replace(
        limits,
        pids=limits.pids + SENTRY_PIDS,
        memory_bytes=limits.memory_bytes + SENTRY_MEMORY,
    )


class GvisorStarter:
    """Starts a sandbox's worker in a gVisor container on its slot's cgroups and disk."""

    def __init__(
        self,
        slot: Slot,
        *,
        runsc_host: runsc.Runsc,
        container: str,
        runtime_dir: Path,
        limits: Limits,
        preimport: bool,
        trust_store: Path | None,
    ) -> None:
        self.slot = slot
        self.runsc = runsc_host
        self.container = container
        self.runtime_dir = runtime_dir
        self.limits = limits
        self.preimport = preimport
        self.trust_store = trust_store

    @property
    def bundle(self) -> Path:
        return self.slot.dir / "bundle"

    @property
    def ctl(self) -> Path:
        return self.slot.dir / "ctl"

    def _prepare(self) -> socket.socket:
        """The bundle and the interrupt socket (listening), fresh for each start."""
        egress_on = self.slot.egress_proxy is not None
        env = layout.sandbox_env(self.limits, self.preimport, egress_on, self.trust_store)
        self.ctl.mkdir(mode=0o755, exist_ok=True)
        spec = self.runsc.spec(
            uid=self.slot.uid,
            env=env,
            limits=self.limits,
            sandbox_dir=self.slot.dir,
            workspace=self.slot.workspace,
            runtime=self.runtime_dir,
            egress_dir=self.slot.egress_dir if egress_on else None,
            trust_store=self.trust_store,
        )
        self.runsc.write_bundle(self.bundle, spec)
        path = self.ctl / runsc.INTERRUPT_SOCKET
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chown(path, self.slot.uid, self.slot.uid)
        listener.listen(1)
        listener.setblocking(False)
        return listener

    def _argv(self) -> list[str]:
        procs = self.slot.cgroup.procs_files()
        argv = ["sh", "-c", LAUNCHER, "launcher", str(len(procs)), *procs]
        argv += [*self.runsc.base_args(), "run", f"--bundle={self.bundle}", self.container]
        return argv

    async def launch(self) -> WorkerProcess:
        await self.slot.disk_made()
        listener = await asyncio.to_thread(self._prepare)
        try:
            pipe = WorkerProcess.interrupt_pipe()
            worker = await WorkerProcess.spawn(
                self._argv(), env={"PATH": layout.HOST_PATH}, pass_fds=(), interrupt_pipe=pipe
            )
            # The worker connects before anything else; its end replaces the pipe's (dup2
            # keeps the descriptor number the WorkerProcess writes to).
            loop = asyncio.get_running_loop()
            accept = asyncio.ensure_future(loop.sock_accept(listener))
            exited = asyncio.ensure_future(worker.proc.wait())
            try:
                await asyncio.wait(
                    {accept, exited}, timeout=READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
                )
            except BaseException:
                await worker.close()  # a cancelled start: the container goes with the cgroup
                raise
            finally:
                exited.cancel()
                if not accept.done():
                    accept.cancel()  # the worker died or hangs: the supervisor sees it at READY
            if not accept.cancelled() and accept.exception() is None:
                conn, _ = accept.result()
                os.dup2(conn.fileno(), pipe[1])
                conn.close()
            return worker
        finally:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                (self.ctl / runsc.INTERRUPT_SOCKET).unlink()


class GvisorBackend(IsolatedBackend):
    """Sandboxes in gVisor containers, with cgroups, a uid and a loop disk each."""

    name = "gvisor"

    def __init__(self, settings: Settings, host: IsolatedHost | None = None) -> None:
        super().__init__(settings, host)
        self.runtime_source = self.runtime_dir  # the image's mount once checked
        self.runsc = runsc.Runsc((settings.data_dir / "gvisor").resolve(), settings.gvisor_platform)

    def check(self) -> None:
        check_tools((("runsc", "runsc"),), "SANDBANK_ISOLATION=fork")
        super().check()
        self.runtime_source = mounted_runtime(self.runtime_dir)
        if self.settings.gvisor_platform == "auto":
            self.runsc.platform = probe_platform()

    async def prepare(self) -> None:
        await super().prepare()
        await asyncio.to_thread(self.runsc.prepare)
        log.info("gvisor: runsc platform %s", self.runsc.platform)

    def new(self, preimport: bool) -> SupervisedSandbox:
        sandbox_id = new_sandbox_id()
        slot = self.host.slot(sandbox_id, limits=host_limits(self.limits))
        container = f"{self.instance}-{sandbox_id}"
        starter = GvisorStarter(
            slot,
            runsc_host=self.runsc,
            container=container,
            runtime_dir=self.runtime_source,
            limits=self.limits,
            preimport=preimport,
            trust_store=self.host.trust_store,
        )

        def stop() -> None:
            # Killed through the cgroup (runsc's own `delete -force` waits ~5 s for them);
            # the Sentry's helpers (ptrace stubs) come to us, the subreaper, as zombies the
            # cgroup holds until reaped. Then runsc forgets the container.
            end = time.monotonic() + STOP_TIMEOUT
            while time.monotonic() < end:
                left = set(slot.cgroup.pids()) - WorkerProcess.spawned
                if not left:
                    break
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)
                reap_orphans(WorkerProcess.spawned)
            self.runsc.delete(container)

        async def stopped() -> None:
            await asyncio.to_thread(stop)

        box = IsolatedBox(slot, starter.launch, before_kill=stopped)
        return SupervisedSandbox(sandbox_id, box, self.limits)

    async def close(self) -> None:
        await asyncio.to_thread(self.runsc.delete_all)
        await super().close()

    def leftovers(self) -> dict[str, list[str]]:
        return {
            **super().leftovers(),
            "containers": self.runsc.containers(),
            "processes": runsc_processes(self.runsc.root),
        }


def runsc_processes(root: Path) -> list[str]:
    """The pids of runsc processes of this state root (a leak when no sandbox is open)."""
    found = []
    needle = f"--root={root}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(name)
        except OSError:
            continue
    return found


def probe_platform() -> str:
    """The first of runsc's platforms that runs a program here (kvm hangs on some machines)."""
    for platform in runsc.PLATFORMS:
        if _runs_on(platform):
            return platform
    raise IsolationUnavailable(
        "runsc runs no program here on any platform (kvm, ptrace): check `runsc --platform="
        "ptrace do true` as root, or run with SANDBANK_ISOLATION=fork"
    )


def _runs_on(platform: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="sandbank-runsc-probe-") as root:
        argv = ["runsc", f"--root={root}", f"--platform={platform}", "--network=none",
                "do", "/bin/true"]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            env={"PATH": layout.HOST_PATH},
            stdin=subprocess.DEVNULL,  # runsc takes a terminal it is given (stopping its caller)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return proc.wait(runsc.PROBE_TIMEOUT) == 0
        except subprocess.TimeoutExpired:
            log.info("gvisor: platform %s does not start a program here", platform)
            return False
        finally:
            _kill_probe(proc, root)


def _kill_probe(proc: subprocess.Popen[bytes], root: str) -> None:
    """Kill a probe's whole tree, found before anything dies (orphans lose their parent), and
    remove the state directory `runsc do` made for itself."""
    tree = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in [*tree, *(int(p) for p in runsc_processes(Path(root)))]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    for pid in tree:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # orphans come to us, the subreaper
    for state in Path(tempfile.gettempdir()).glob("runsc-do*"):
        if not any(runsc_processes(state)):
            shutil.rmtree(state, ignore_errors=True)


def _descendants(parent: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                rest = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        children.setdefault(int(rest[1]), []).append(int(name))
    found, todo = [], [parent]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
