"""The isolated backend: bwrap namespaces, seccomp, cgroups, a uid and a disk per sandbox.

The sandbox's process tree is started as its own unprivileged uid (never bwrap as root with
`--uid`, which would map host root in), from a fresh exec with an environment built here:
nothing of the server's environment, descriptors or memory reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .. import capacity
from ..config import Settings
from ..egress import sandboxing as egress
from ..egress.config import EgressConfig, build_proxy
from ..egress.proxy import SOCKET_NAME, EgressProxy
from ..errors import IsolationUnavailable
from . import cgroups, disk, image, trust
from .backend import (
    HOST_RESOURCES,
    INTERPRETERS,
    ISOLATION,
    LIMITS,
    RUNTIME,
    Backend,
    new_sandbox_id,
)
from .channel import WorkerProcess
from .image import mounted_runtime
from .managed import Limits, ManagedSandbox
from .seccomp import build_filter
from .uids import UidAllocator

log = logging.getLogger(__name__)
PR_SET_CHILD_SUBREAPER = 36

INSIDE_DIR = Path(__file__).parent / "inside"
RUNTIME_MOUNT = "/opt/sandbank/runtime"
LIB_MOUNT = "/opt/sandbank/lib"  # on the worker's path: the package below and the mpl backend
INSIDE_MOUNT = f"{LIB_MOUNT}/sandbank_inside"
WORKER = (f"{RUNTIME_MOUNT}/bin/python3", "-s", "-m", "sandbank_inside.worker")
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Read-only pieces of the host's /etc a data stack needs; nothing with secrets.
ETC_BINDS = (
    "alternatives", "fonts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
    "mime.types", "nsswitch.conf", "ssl/openssl.cnf",
)  # fmt: skip

# Runs as root for a moment: joins the cgroups and sets rlimits while the process is tiny,
# then execs setpriv, which drops to the sandbox uid before bwrap starts.
LAUNCHER = """
n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n-1)); done
ulimit -n "$1"; shift
ulimit -c 0
exec env -i "$@"
"""


@functools.cache
def inside_code() -> dict[str, bytes]:
    """The in-sandbox package's files (sources, the pip wrapper), by path relative to it."""
    return image.tree_files(INSIDE_DIR)


def data_fd(data: bytes) -> int:
    """A fresh descriptor reading `data` from its start (a memfd)."""
    fd = os.memfd_create("sandbank", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def favor_dynamic_moves() -> None:
    """Ask for cheap cgroup moves (cgroups.favor_dynamic_moves); a refusal only costs speed."""
    try:
        state = cgroups.favor_dynamic_moves()
    except OSError as e:
        log.warning(
            "cgroup2 favordynmods could not be enabled (%s): each sandbox start waits ~10 ms "
            "more to join its cgroup",
            e,
        )
        return
    if state == "enabled":
        log.info("remounted cgroup2 with favordynmods: sandboxes join their cgroups faster")


def check_available(
    tools: tuple[tuple[str, str], ...] = (("bwrap", "bubblewrap"), ("setpriv", "util-linux")),
    otherwise: str = "SANDBANK_ISOLATION=none, unisolated, for development only",
) -> None:
    """The host tools (and their Debian packages), cgroups and root an isolated backend needs."""
    for tool, package in tools:
        if shutil.which(tool, path=HOST_PATH) is None:
            raise IsolationUnavailable(
                f"{tool} is not installed: `apt-get install {package}` (or run with {otherwise})"
            )
    cgroups.check_available()
    if os.geteuid() != 0:
        raise IsolationUnavailable(
            "the isolated runtime must start as root (it creates cgroups, loop mounts and "
            "drops each sandbox to its own uid)"
        )


class BwrapSandbox(ManagedSandbox):
    """A sandbox in bubblewrap namespaces, with its cgroups, uid and disk."""

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
        seccomp_program: bytes,
        egress_proxy: EgressProxy | None = None,
        trust_store: Path | None = None,
    ) -> None:
        super().__init__(sandbox_id, limits, preimport)
        self.egress_proxy = egress_proxy
        self.trust_store = trust_store  # bound at /etc/ssl/certs (trust.py)
        self.dir = base_dir / sandbox_id
        self.runtime_dir = runtime_dir
        self.uids = uids
        self.cgroup = cgroups.Cgroup(instance, sandbox_id)
        self.seccomp_program = seccomp_program
        self._acquired = False
        self.on_released: Callable[[str], None] = lambda _id: None

    @property
    def workspace(self) -> Path:
        return self.dir / "ws"

    @property
    def image(self) -> Path:
        return self.dir / "disk.img"

    async def _acquire(self) -> None:
        # A lease cancelled here (its client left) must not leave a half-made sandbox: the
        # thread making the disk and cgroups runs on regardless, so wait for it, then undo it.
        task = asyncio.ensure_future(self._acquire_all())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await task
            await self.close()
            raise

    async def _acquire_all(self) -> None:
        self._acquired = True
        self.uid = self.uids.claim()
        self.root_policy = (self.uid, self.uid, 0o700)
        await asyncio.to_thread(self._acquire_sync)
        if self.egress_proxy is not None:
            # Its own tmpfs: the bind then names no host path in the sandbox's mountinfo.
            sockets = self.dir / "egress"
            sockets.mkdir(mode=0o755)
            disk.mount_tmpfs(sockets, 64 << 10, noexec=True)
            await self.egress_proxy.open(self.id, sockets, self.uid)

    def _acquire_sync(self) -> None:
        self.dir.mkdir(mode=0o711, parents=True)
        lim = self.limits
        self.cgroup.create(lim.memory_bytes, lim.pids, lim.cpus)
        disk.create(self.image, self.workspace, lim.disk_bytes, self.uid)

    def _files(self) -> dict[str, bytes]:
        """Files written into the sandbox's own root from data: no host path is mounted."""
        uid = self.uid
        files = {
            "/etc/passwd": f"sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n".encode(),
            "/etc/group": f"sandbox:x:{uid}:\nnogroup:x:65534:\n".encode(),
            "/etc/hostname": b"sandbox\n",
            "/etc/hosts": b"127.0.0.1 localhost sandbox\n::1 localhost\n",
        }
        files.update({f"{INSIDE_MOUNT}/{rel}": data for rel, data in inside_code().items()})
        return files

    def _launcher(self, args_fd: int) -> list[str]:
        """Joins the cgroups and sets rlimits as root, then drops to the uid and starts bwrap."""
        uid = str(self.uid)
        argv = ["sh", "-c", LAUNCHER, "launcher"]
        procs = self.cgroup.procs_files()
        argv += [str(len(procs)), *procs, str(self.limits.open_files)]
        argv += [
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            "bwrap", "--args", str(args_fd), "--", *WORKER,
        ]  # fmt: skip
        return argv

    def _argv(self, seccomp_fd: int, interrupt_fd: int, files: dict[str, int]) -> list[str]:
        """bwrap's arguments, passed through a descriptor: /proc/1/cmdline inside shows none."""
        lim = self.limits
        env = {
            "PATH": f"{RUNTIME_MOUNT}/bin:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/workspace",
            "USER": "sandbox",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "SANDBANK_WORKSPACE": "/workspace",
            "SANDBANK_PREIMPORT": "1" if self.preimport else "0",
            "SANDBANK_INTERRUPT_FD": str(interrupt_fd),
            "MPLBACKEND": "module://sandbank_mplbackend",
            "MPLCONFIGDIR": "/tmp/.matplotlib",
            "XDG_CACHE_HOME": "/tmp/.cache",
            "PYTHONPATH": f"{LIB_MOUNT}:{INSIDE_MOUNT}/mpl",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": str(max(1, int(lim.cpus))),
            "OMP_NUM_THREADS": str(max(1, int(lim.cpus))),
        }
        self._egress_env(env)
        env.update(trust.sandbox_env(self.trust_store))
        argv = [
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--clearenv",
        ]  # fmt: skip
        for key, value in env.items():
            argv += ["--setenv", key, value]
        argv += ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "sbin", "lib", "lib64"):
            if Path(f"/{link}").is_symlink():
                argv += ["--symlink", f"usr/{link}", f"/{link}"]
        for item in ETC_BINDS:
            if Path("/etc", item).exists():
                argv += ["--ro-bind", f"/etc/{item}", f"/etc/{item}"]
        for dest in sorted({str(Path(d).parent) for d in files}):
            argv += ["--dir", dest]
        for dest, fd in files.items():
            perms = "0555" if "/bin/" in dest else "0444"  # the pip wrapper runs
            argv += ["--perms", perms, "--file", str(fd), dest]
        argv += [
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
            "--bind", str(self.workspace), "/workspace",
            "--ro-bind", str(self.runtime_dir), RUNTIME_MOUNT,
            *self._egress_binds(),
            *(a for src, dst in trust.binds(self.trust_store) for a in ("--ro-bind", src, dst)),
            "--remount-ro", "/",
            "--chdir", "/workspace",
            "--seccomp", str(seccomp_fd),
        ]  # fmt: skip
        return argv

    def _egress_env(self, env: dict[str, str]) -> None:
        """pip's settings always; the proxy's variables when this server has egress at all."""
        on = self.egress_proxy is not None
        env["PATH"] = f"{egress.INSIDE_BIN}:{env['PATH']}"
        env.update(egress.pip_env(network=on))
        if on:
            env.update(egress.proxy_env(SOCKET_NAME))

    def _egress_binds(self) -> list[str]:
        if self.egress_proxy is None:
            return []
        return egress.bwrap_binds(self.dir / "egress")

    async def _launch(self) -> WorkerProcess:
        fds: list[int] = []
        try:
            seccomp = data_fd(self.seccomp_program)
            fds.append(seccomp)
            files = {}
            for dest, data in self._files().items():
                files[dest] = data_fd(data)
                fds.append(files[dest])
            pipe = WorkerProcess.interrupt_pipe()
            args = data_fd(
                b"".join(a.encode() + b"\0" for a in self._argv(seccomp, pipe[0], files))
            )
            fds.append(args)
            return await WorkerProcess.spawn(
                self._launcher(args),
                env={"PATH": HOST_PATH},
                pass_fds=fds,
                interrupt_pipe=pipe,
            )
        finally:
            for fd in fds:
                os.close(fd)

    async def _kill_everything(self, worker: WorkerProcess | None) -> None:
        if worker is not None:
            worker.kill()
        await asyncio.to_thread(self.cgroup.kill_all)
        if worker is not None:
            await worker.wait(timeout=2.0)

    def _oom_count(self) -> int:
        return self.cgroup.oom_kills()

    async def _release(self) -> None:
        if not self._acquired:
            return
        self._acquired = False
        try:
            if self.egress_proxy is not None:
                await self.egress_proxy.close_sandbox(self.id)
            await asyncio.to_thread(self._release_sync)
        finally:
            if self.uid:
                self.uids.release(self.uid)
            self.on_released(self.id)

    def _release_sync(self) -> None:
        """Give everything back; a step that fails is logged and the next ones still run."""
        try:
            self.cgroup.kill_all()
            self.cgroup.remove()
        except OSError as e:
            log.warning("sandbox %s: its cgroup is not removed yet: %s", self.id, e)
        remove_sandbox_dir(self.dir)


def remove_sandbox_dir(path: Path) -> None:
    """Unmount a sandbox's disk (lazily, if a file on it is still open) and remove its files."""
    try:
        if disk.is_mounted(path / "egress"):
            disk.unmount(str(path / "egress"), lazy=True)
        disk.destroy(path / "disk.img", path / "ws")
    except Exception as e:
        log.warning("sandbox %s: its disk is not removed yet: %s", path.name, e)
    if not disk.is_mounted(path / "ws"):
        shutil.rmtree(path, ignore_errors=True)


class BwrapBackend(Backend):
    """Sandboxes in bubblewrap namespaces, with cgroups, a uid and a loop disk each."""

    name = "bwrap"
    claims = frozenset({RUNTIME, INTERPRETERS, ISOLATION, LIMITS, HOST_RESOURCES})

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.uids: UidAllocator | None = None
        self.seccomp = b""
        self.runtime_source = self.runtime_dir
        # Sandboxes get a way out only when the operator allows some network (README).
        self.egress_proxy = build_proxy(settings, EgressConfig.from_settings(settings))
        self.trust_store: Path | None = None  # the sandboxes' CA bundle (trust.prepare)
        self._open: set[str] = set()  # sandboxes made and not yet given back

    def check(self) -> None:
        check_available()
        self.check_common()
        self.runtime_source = mounted_runtime(self.runtime_dir)

    def check_common(self) -> None:
        """What bwrap and fork both need: the runtime, traversable paths, seccomp, uids."""
        python = self.runtime_dir / "bin" / "python3"
        if not python.exists():
            raise IsolationUnavailable(
                f"the sandbox runtime is missing at {self.runtime_dir}: run `make install` "
                "or set SANDBANK_RUNTIME_DIR"
            )
        # Sandbox uids must reach the runtime and their workspaces under the data directory.
        data = self.settings.data_dir.resolve()
        for target in (self.runtime_dir, data):
            for parent in (p for p in [target, *target.parents] if p.exists()):
                if parent.stat().st_mode & 0o001 == 0 and parent != data:
                    raise IsolationUnavailable(
                        f"{parent} is not traversable by other users, so sandbox users cannot "
                        f"reach {target}: move it or `chmod o+x {parent}`"
                    )
        self.seccomp = build_filter()
        self.trust_store = trust.prepare(self.settings)
        s = self.settings
        self.uids = UidAllocator(s.uid_lock_dir, s.uid_base, s.uid_count)

    async def prepare(self) -> None:
        data = self.settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # Sandbox uids must traverse these to reach their own workspace (mode 0700 inside).
        os.chmod(data, os.stat(data).st_mode | 0o111)  # noqa: S103 - traverse only, no listing
        os.chmod(self.base_dir, 0o711)  # noqa: S103 - traverse only, no listing
        # Orphans of sandboxes (bwrap's inner init) are reparented to us instead of PID 1.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if self.settings.cgroup_favor_dynmods:
            await asyncio.to_thread(favor_dynamic_moves)
        await asyncio.to_thread(self._cleanup_stale)
        sandboxes = self.settings.max_sessions + self.settings.pool_size
        soft, want = capacity.raise_open_files(sandboxes)
        if soft < want:
            log.warning(
                "open files are limited to %d; %d sandboxes want %d (raise the hard limit, "
                "`ulimit -Hn`, or lower SANDBANK_MAX_SESSIONS)",
                soft, sandboxes, want,
            )  # fmt: skip
        # Sessions are counted by their idle cost (capacity.py); together they stay below this.
        cgroups.limit_instance(self.instance, capacity.sessions_memory())

    def _cleanup_stale(self) -> None:
        """Remove what a previous run of this data directory left; touch nothing else."""
        for name in cgroups.instance_groups(self.instance):
            group = cgroups.Cgroup(self.instance, name)
            group.kill_all()
            with contextlib.suppress(OSError):
                group.remove()
            log.info("removed stale cgroup %s", name)
        self._remove_unowned()

    def _remove_unowned(self) -> None:
        for point in sorted(disk.mounts_under(self.base_dir), reverse=True):
            if Path(point).parent.name not in self._open:
                disk.unmount(point, lazy=True)
                log.info("unmounted a leftover workspace %s", point)
        if self.base_dir.exists():
            for child in self.base_dir.iterdir():
                if child.name not in self._open:
                    remove_sandbox_dir(child)

    def new(self, preimport: bool) -> BwrapSandbox:
        assert self.uids is not None, "check() first"
        sandbox = BwrapSandbox(
            new_sandbox_id(),
            instance=self.instance,
            base_dir=self.base_dir,
            runtime_dir=self.runtime_source,
            uids=self.uids,
            limits=self.limits,
            preimport=preimport,
            seccomp_program=self.seccomp,
            egress_proxy=self.egress_proxy,
            trust_store=self.trust_store,
        )
        self._open.add(sandbox.id)
        sandbox.on_released = self._open.discard
        return sandbox

    def sweep(self) -> None:
        reap_orphans(WorkerProcess.spawned)
        self._remove_unowned()

    async def close(self) -> None:
        if self.egress_proxy is not None:
            await self.egress_proxy.close()
        reap_orphans(WorkerProcess.spawned)
        await asyncio.to_thread(self._remove_unowned)  # nothing outlives the server's shutdown
        cgroups.remove_instance_dirs(self.instance)

    def memory(self) -> dict[str, int]:
        return {"sandboxes": cgroups.instance_memory(self.instance)}

    def leftovers(self) -> dict[str, list[str]]:
        return {
            **super().leftovers(),
            "cgroups": cgroups.instance_groups(self.instance),
            "mounts": disk.mounts_under(self.base_dir),
            "uids": sorted(str(u) for u in self.uids.held()) if self.uids else [],
        }


def reap_orphans(known: set[int]) -> None:
    """Reap bwrap's inner inits orphaned to us; asyncio reaps the processes it spawned itself."""
    me = os.getpid()
    for pid in _children(me):
        if pid in known:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                head, _, rest = f.read().rpartition(b")")
        except OSError:
            continue
        fields = rest.split()
        if head.endswith((b"(bwrap", b"(sb-init")) and fields[0] == b"Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _children(me: int) -> list[int]:
    """Our child processes: from each thread's `children` list where the kernel has them.

    Reading only our own children keeps a sweep cheap however many processes the machine runs
    (a full walk of /proc reads every process's stat: ~40 ms with a thousand sandboxes).
    Without those lists (CONFIG_PROC_CHILDREN), every process is looked at.
    """
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    found: list[int] = []
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{task}/children") as f:
                found += (int(pid) for pid in f.read().split())
        except OSError:
            continue  # a thread that has just ended: its children went to another
    return found
