"""The fork backend: each sandbox is a fork of a warm template that isolates itself.

Host resources (uid, cgroups, workspace disk) are bwrap's; only the start differs: the
template (`template.Template`) forks a child that joins the session's cgroups, unshares its
namespaces, builds its root, drops to the sandbox uid under the same seccomp filter and runs
the worker on the pipes the server passed. See `inside/template.py` for the child's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
from pathlib import Path
from typing import Any

from ..config import Settings
from ..egress import sandboxing as egress
from ..egress.proxy import EgressProxy
from . import bwrap, disk, trust
from .backend import new_sandbox_id
from .bwrap import (
    ETC_BINDS,
    INSIDE_DIR,
    INSIDE_MOUNT,
    LIB_MOUNT,
    RUNTIME_MOUNT,
    BwrapBackend,
    BwrapSandbox,
)
from .channel import WorkerBroken, WorkerGone, WorkerProcess
from .inside import protocol
from .managed import Limits
from .template import CACHE, Template, TemplateConfig
from .uids import UidAllocator

INTERRUPT_FD = 3  # where the sandbox's init puts the interrupt pipe (inside/template.py)
INIT_PROGRAM = "libexec/sb-init"  # in the runtime; PID 1 of each sandbox (runtime/sb-init.c)


def check_available() -> None:
    """What the fork backend needs beyond Python: util-linux to boot the template, cgroups, root."""
    bwrap.check_available(
        (("unshare", "util-linux"), ("mount", "mount")), "SANDBANK_ISOLATION=bwrap"
    )


def sandbox_env(limits: Limits, preimport: bool) -> dict[str, str]:
    """The environment every sandboxed worker starts with (the template's too)."""
    threads = str(max(1, int(limits.cpus)))
    return {
        "PATH": f"{RUNTIME_MOUNT}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/workspace",
        "USER": "sandbox",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",  # noqa: S108 - the sandbox's own private /tmp
        "SANDBANK_WORKSPACE": "/workspace",
        "SANDBANK_PREIMPORT": "1" if preimport else "0",
        "MPLBACKEND": "module://sandbank_mplbackend",
        "MPLCONFIGDIR": "/tmp/.matplotlib",  # noqa: S108
        "XDG_CACHE_HOME": "/tmp/.cache",  # noqa: S108
        "PYTHONPATH": f"{LIB_MOUNT}:{INSIDE_MOUNT}/mpl",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": threads,
        "OMP_NUM_THREADS": threads,
    }


def new_template(settings: Settings, runtime_dir: Path, limits: Limits, seccomp: bytes) -> Template:
    env = sandbox_env(limits, preimport=False)
    # Its caches go to a tmpfs of its own mount namespace (template.CACHE): no host path
    # reaches the environment its children find in /proc/<pid>/environ.
    env.update(MPLCONFIGDIR=f"{CACHE}/mpl", XDG_CACHE_HOME=CACHE)
    # pyarrow's jemalloc would start a purging thread at import: the template stays
    # single-threaded, so a fork copies the whole process (its children purge inline).
    env["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    modules = [m.strip() for m in settings.fork_preimport_modules.split(",") if m.strip()]
    return Template(
        TemplateConfig(
            runtime_dir=runtime_dir,
            runtime_mount=RUNTIME_MOUNT,
            inside_dir=INSIDE_DIR,
            inside_mount=INSIDE_MOUNT,
            env=env,
            seccomp=seccomp,
            modules=modules,
            max_forks=settings.fork_template_max_forks,
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

    async def recv(self) -> dict[str, Any]:
        try:
            head = await self._reader.readexactly(protocol.HEADER.size)
            (size,) = protocol.HEADER.unpack(head)
            protocol.check_size(size, protocol.MAX_REPLY)
            return protocol.decode(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionResetError) as e:
            raise WorkerGone from e
        except protocol.ProtocolViolation as e:
            raise WorkerBroken(str(e)) from e

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
        await self.wait()
        for task in (self._stderr_task, self._exit):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._writer.close()
        if self._interrupts >= 0:
            os.close(self._interrupts)
            self._interrupts = -1
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class ForkedSandbox(BwrapSandbox):
    """bwrap's host resources (uid, cgroups, disk); the process tree comes from the template."""

    def __init__(
        self,
        sandbox_id: str,
        *,
        instance: str,
        base_dir: Path,
        runtime_dir: Path,
        uids: UidAllocator,
        limits: Limits,
        preimport: bool,
        template: Template,
        formatted_disk: Path,
        egress_proxy: EgressProxy | None,
        trust_store: Path | None = None,
    ) -> None:
        # The template has imported the data stack. `preimport` (the warm pool's sandboxes)
        # runs its first-use paths once more in the child, so the pages they write are copied
        # before a lease rather than during the client's first pandas call.
        super().__init__(
            sandbox_id,
            instance=instance,
            base_dir=base_dir,
            runtime_dir=runtime_dir,
            uids=uids,
            limits=limits,
            preimport=preimport,
            seccomp_program=b"",
            egress_proxy=egress_proxy,
            trust_store=trust_store,
        )
        self.template = template
        self.formatted_disk = formatted_disk  # copied for each workspace (disk.create_from)
        self._fast = False
        self._disk: asyncio.Future[None] | None = None

    async def _acquire_all(self) -> None:
        await super()._acquire_all()
        if self._fast:
            self.root_policy = None  # nothing to restore until the disk is there (`_disk_made`)
            # The workspace disk (~5 ms of copying and mounting) is made while the template
            # forks and the child isolates itself; the child waits for it (`_launch`).
            self._disk = asyncio.ensure_future(
                asyncio.to_thread(
                    disk.create_from, self.formatted_disk, self.image, self.workspace, self.uid
                )
            )

    def _acquire_sync(self) -> None:
        self._fast = self.formatted_disk.exists()
        if not self._fast:  # the factory was not started: the slow way
            super()._acquire_sync()
        else:
            self.dir.mkdir(mode=0o711, parents=True)
            lim = self.limits
            self.cgroup.create(lim.memory_bytes, lim.pids, lim.cpus)
            self.workspace.mkdir(mode=0o700)  # the disk's mount point
        (self.dir / "root").mkdir(mode=0o700)  # the new root's mount point

    async def _disk_made(self) -> None:
        """Wait for the workspace disk started in `_acquire_all` (raises what making it did)."""
        if self._disk is not None:
            try:
                await asyncio.shield(self._disk)
                self.root_policy = (self.uid, self.uid, 0o700)
            finally:
                # Done or failed, it is no longer pending; a cancelled wait leaves it to
                # `_release`, which waits for the thread before removing anything.
                if self._disk.done():
                    self._disk = None

    async def _release(self) -> None:
        if self._disk is not None:
            with contextlib.suppress(BaseException):
                await self._disk  # its thread mounts on our directory: let it finish first
            self._disk = None
        await super()._release()

    def _etc_files(self) -> dict[str, str]:
        uid = self.uid
        return {
            "passwd": f"sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"sandbox:x:{uid}:\nnogroup:x:65534:\n",
            "hostname": "sandbox\n",
            "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
        }

    def _order(self) -> dict[str, Any]:
        env = sandbox_env(self.limits, preimport=self.preimport)
        env["SANDBANK_INTERRUPT_FD"] = str(INTERRUPT_FD)
        self._egress_env(env)
        env.update(trust.sandbox_env(self.trust_store))
        binds = [(str(self.dir / "egress"), egress.SOCKET_DIR_INSIDE)] if self.egress_proxy else []
        binds += trust.binds(self.trust_store)
        return {
            "uid": self.uid,
            "cgroup_procs": self.cgroup.procs_files(),
            "root": str(self.dir / "root"),
            "workspace": str(self.workspace),
            "runtime_mount": RUNTIME_MOUNT,
            "inside_mount": INSIDE_MOUNT,
            "init": f"{RUNTIME_MOUNT}/{INIT_PROGRAM}",
            "etc_binds": list(ETC_BINDS),
            "ro_binds": binds,  # (host path, sandbox path)
            "etc_files": self._etc_files(),  # written into the sandbox's own root
            "tmp_bytes": self.limits.tmp_bytes,
            "open_files": self.limits.open_files,
            "env": env,
        }

    async def _launch(self) -> WorkerProcess:
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
            await self._disk_made()
            os.write(go, b"g")
        except BaseException:
            await worker.close()  # the child reads no byte and leaves; the init is killed
            raise
        finally:
            os.close(go)
        return worker


class ForkBackend(BwrapBackend):
    """Sandboxes forked from a warm template, with bwrap's host resources and isolation."""

    name = "fork"
    claims = BwrapBackend.claims

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.template: Template | None = None

    def check(self) -> None:
        check_available()
        self.check_common()
        self.template = new_template(self.settings, self.runtime_dir, self.limits, self.seccomp)

    @property
    def formatted_disk(self) -> Path:
        return self.settings.data_dir.resolve() / f"workspace-{self.limits.disk_bytes}.img"

    async def prepare(self) -> None:
        await super().prepare()
        assert self.template is not None, "check() first"
        await asyncio.to_thread(disk.format_image, self.formatted_disk, self.limits.disk_bytes)
        await self.template.start()

    def new(self, preimport: bool) -> ForkedSandbox:
        assert self.uids is not None and self.template is not None, "check() first"
        sandbox = ForkedSandbox(
            new_sandbox_id(), instance=self.instance, base_dir=self.base_dir,
            runtime_dir=self.runtime_dir, uids=self.uids, limits=self.limits,
            preimport=preimport, template=self.template, formatted_disk=self.formatted_disk,
            egress_proxy=self.egress_proxy, trust_store=self.trust_store,
        )  # fmt: skip
        self._open.add(sandbox.id)
        sandbox.on_released = self._open.discard
        return sandbox

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
