"""The fork backend: each sandbox is a fork of a warm template that isolates itself.

Host resources (uid, cgroups, workspace disk) are a host slot, as for bwrap; only the start
differs: the template (`fork_template.Template`) forks a child that joins the session's
cgroups, unshares its namespaces, builds its root, drops to the sandbox uid under the same
seccomp filter and runs the worker on the pipes the server passed. See `inside/template.py`
for the child's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
from pathlib import Path
from typing import Any

from ...config import Settings
from ...egress import sandboxing as egress
from ..channel import WorkerGone, WorkerProcess, read_frame
from ..host import disk, layout, trust
from ..host.machine import IsolatedHost, check_tools
from ..host.slot import IsolatedBox, Slot
from ..inside import protocol
from ..limits import Limits
from ..supervisor import SupervisedSandbox
from .base import new_sandbox_id
from .fork_template import CACHE, Template, TemplateConfig
from .isolated import IsolatedBackend

INTERRUPT_FD = 3  # where the sandbox's init puts the interrupt pipe (inside/template.py)
INIT_PROGRAM = "libexec/sb-init"  # in the runtime; PID 1 of each sandbox (runtime/sb-init.c)


def check_available() -> None:
    """What the fork backend needs beyond Python: util-linux to boot the template, cgroups, root."""
    check_tools((("unshare", "util-linux"), ("mount", "mount")), "SANDBANK_ISOLATION=bwrap")


def new_template(settings: Settings, runtime_dir: Path, limits: Limits, seccomp: bytes) -> Template:
    env = layout.sandbox_env(limits, preimport=False, egress_on=False)
    # Its caches go to a tmpfs of its own mount namespace (fork_template.CACHE): no host path
    # reaches the environment its children find in /proc/<pid>/environ.
    env.update(MPLCONFIGDIR=f"{CACHE}/mpl", XDG_CACHE_HOME=CACHE)
    # pyarrow's jemalloc would start a purging thread at import: the template stays
    # single-threaded, so a fork copies the whole process (its children purge inline).
    env["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    modules = [m.strip() for m in settings.fork_preimport_modules.split(",") if m.strip()]
    return Template(
        TemplateConfig(
            runtime_dir=runtime_dir,
            runtime_mount=layout.RUNTIME_MOUNT,
            inside_dir=layout.INSIDE_DIR,
            inside_mount=layout.INSIDE_MOUNT,
            env=env,
            seccomp=seccomp,
            modules=modules,
            max_forks=settings.fork_template_max_forks,
            max_age=settings.fork_template_max_age_seconds,
        )
    )


class ForkedWorker(WorkerProcess):
    """A worker reached through pipes the server made, not an asyncio subprocess of ours."""

    def __init__(
        self,
        pidfd: int,
        pid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stderr: asyncio.StreamReader,
        status: asyncio.StreamReader,
        interrupts: int,
    ) -> None:
        # No asyncio subprocess here: the parent's __init__ would want one.
        self._interrupts = interrupts
        self._pidfd = pidfd
        self._pid = pid
        self._reader = reader
        self._writer = writer
        self._stderr = stderr
        self._stderr_tail = b""
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        self._exit = asyncio.create_task(self._read_status(status))

    @classmethod
    async def attach(cls, pidfd: int, pid: int, fds: dict[str, int]) -> ForkedWorker:
        loop = asyncio.get_running_loop()

        async def read_end(fd: int) -> asyncio.StreamReader:
            reader = asyncio.StreamReader(limit=1 << 16)
            proto = asyncio.StreamReaderProtocol(reader)
            await loop.connect_read_pipe(lambda: proto, os.fdopen(fd, "rb", buffering=0))
            return reader

        transport, proto = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin,
            os.fdopen(fds["in"], "wb", buffering=0),
        )
        writer = asyncio.StreamWriter(transport, proto, None, loop)
        return cls(
            pidfd,
            pid,
            await read_end(fds["out"]),
            writer,
            await read_end(fds["err"]),
            await read_end(fds["status"]),
            fds["interrupt"],
        )

    @property
    def pid(self) -> int:
        return self._pid

    async def _drain_stderr(self) -> None:
        with contextlib.suppress(Exception):
            while chunk := await self._stderr.read(4096):
                self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    async def _read_status(self, status: asyncio.StreamReader) -> int:
        try:
            (code,) = struct.unpack(">i", await status.readexactly(4))
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return -signal.SIGKILL  # the init itself was killed: so was everything inside
        return int(code)

    async def send(self, msg: dict[str, Any]) -> None:
        try:
            self._writer.write(protocol.encode(msg))
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as e:
            raise WorkerGone from e

    async def _read_frame(self) -> dict[str, Any]:
        return await read_frame(self._reader)

    async def wait(self, timeout: float = 5.0) -> int | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self._exit), timeout)
        except TimeoutError:
            return None

    def kill(self) -> None:
        # The init is PID 1 of the sandbox: its death takes every process of the namespace.
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        self.stop_reading()
        await self.wait()
        for task in (self._stderr_task, self._exit):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._writer.close()
        self._close_interrupts()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class ForkStarter:
    """Starts a sandbox's worker as a fork of the template, on its slot's uid, cgroups, disk."""

    def __init__(
        self,
        slot: Slot,
        *,
        limits: Limits,
        preimport: bool,
        template: Template,
        trust_store: Path | None = None,
    ) -> None:
        self.trust_store = trust_store  # bound at /etc/ssl/certs (host/trust.py)
        # The template has imported the data stack. `preimport` (the warm pool's sandboxes)
        # runs its first-use paths once more in the child, so the pages they write are copied
        # before a lease rather than during the client's first pandas call.
        self.slot = slot
        self.limits = limits
        self.preimport = preimport
        self.template = template

    def _order(self) -> dict[str, Any]:
        slot = self.slot
        egress_on = slot.egress_proxy is not None
        env = layout.sandbox_env(self.limits, self.preimport, egress_on, self.trust_store)
        env["SANDBANK_INTERRUPT_FD"] = str(INTERRUPT_FD)
        binds = [(str(slot.egress_dir), egress.SOCKET_DIR_INSIDE)] if egress_on else []
        binds += trust.binds(self.trust_store)
        return {
            "uid": slot.uid,
            "cgroup_procs": slot.cgroup.procs_files(),
            "root": str(slot.dir / "root"),
            "workspace": str(slot.workspace),
            "runtime_mount": layout.RUNTIME_MOUNT,
            "inside_mount": layout.INSIDE_MOUNT,
            "init": f"{layout.RUNTIME_MOUNT}/{INIT_PROGRAM}",
            "etc_binds": list(layout.ETC_BINDS),
            "ro_binds": binds,  # (host path, sandbox path)
            "symlinks": layout.SYMLINKS,  # in the sandbox's root: link -> target
            "etc_files": layout.etc_files(slot.uid),  # written into the sandbox's own root
            "tmp_bytes": self.limits.tmp_bytes,
            "open_files": self.limits.open_files,
            "env": env,
        }

    async def launch(self) -> WorkerProcess:
        (self.slot.dir / "root").mkdir(mode=0o700, exist_ok=True)  # the new root's mount point
        order = self._order()
        ours: dict[str, int] = {}
        theirs: list[int] = []
        try:
            # The child's ends, in the order its init expects: in, out, err, interrupt,
            # status, go (one byte once the workspace is mounted; closed without it if not).
            for name, child_reads in (
                ("in", True), ("out", False), ("err", False), ("interrupt", True),
                ("status", False), ("go", True),
            ):  # fmt: skip
                r, w = os.pipe()
                ours[name], child = (w, r) if child_reads else (r, w)
                theirs.append(child)
            pid, pidfd = await self.template.fork(order, theirs)
        except BaseException:
            for fd in ours.values():
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        go = ours.pop("go")
        try:
            worker = await ForkedWorker.attach(pidfd, pid, ours)
        except BaseException:
            os.close(go)
            os.close(pidfd)
            raise
        try:
            await self.slot.disk_made()
            os.write(go, b"g")
        except BaseException:
            await worker.close()  # the child reads no byte and leaves; the init is killed
            raise
        finally:
            os.close(go)
        return worker


class ForkBackend(IsolatedBackend):
    """Sandboxes forked from a warm template, on isolated host slots."""

    name = "fork"
    durable = True

    def __init__(self, settings: Settings, host: IsolatedHost | None = None) -> None:
        super().__init__(settings, host)
        self.template: Template | None = None

    def check(self) -> None:
        check_available()
        super().check()
        self.template = new_template(
            self.settings, self.runtime_dir, self.limits, self.host.seccomp
        )

    @property
    def formatted_disk(self) -> Path:
        return self.settings.data_dir.resolve() / f"workspace-{self.limits.disk_bytes}.img"

    async def prepare(self) -> None:
        await super().prepare()
        assert self.template is not None, "check() first"
        await asyncio.to_thread(disk.format_image, self.formatted_disk, self.limits.disk_bytes)
        await self.template.start()

    def new(self, preimport: bool) -> SupervisedSandbox:
        return self._sandbox(preimport, None)

    def resumed(self, image: Path, previous_uid: int) -> SupervisedSandbox:
        return self._sandbox(False, (image, previous_uid))

    def _sandbox(self, preimport: bool, kept: tuple[Path, int] | None) -> SupervisedSandbox:
        assert self.template is not None, "check() first"
        sandbox_id = new_sandbox_id()
        slot = self.host.slot(sandbox_id, formatted_disk=self.formatted_disk, kept_disk=kept)
        starter = ForkStarter(
            slot,
            limits=self.limits,
            preimport=preimport,
            template=self.template,
            trust_store=self.host.trust_store,
        )
        return SupervisedSandbox(sandbox_id, IsolatedBox(slot, starter.launch), self.limits)

    def memory(self) -> dict[str, int]:
        # The templates' pages are shared by every sandbox forked from them; their PSS is what
        # they cost beyond the sandboxes' own charge (which counts only pages a fork copied).
        template = self.template.memory()["pss"] if self.template is not None else 0
        return {**super().memory(), "template": template}

    async def close(self) -> None:
        if self.template is not None:
            await self.template.stop()
        self.formatted_disk.unlink(missing_ok=True)
        await super().close()
