"""The isolated backend: bwrap namespaces, seccomp, cgroups, a uid and a disk per sandbox.

The sandbox's process tree is started as its own unprivileged uid (never bwrap as root with
`--uid`, which would map host root in), from a fresh exec with an environment built here:
nothing of the server's environment, descriptors or memory reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from ..egress import sandboxing as egress
from ..egress.proxy import SOCKET_NAME, EgressProxy
from ..errors import IsolationUnavailable
from . import cgroups, disk
from .channel import WorkerProcess
from .managed import Limits, ManagedSandbox
from .seccomp import build_filter, filter_fd
from .uids import UidAllocator

INSIDE_DIR = Path(__file__).parent / "inside"
RUNTIME_MOUNT = "/opt/sandbank/runtime"
INSIDE_MOUNT = "/opt/sandbank/inside"
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Read-only pieces of the host's /etc a data stack needs; nothing with secrets.
ETC_BINDS = (
    "alternatives", "fonts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
    "mime.types", "nsswitch.conf", "ssl/openssl.cnf",
)  # fmt: skip
MAX_FRAME = 16 * 1024 * 1024

# Runs as root for a moment: joins the cgroups and sets rlimits while the process is tiny,
# then execs setpriv, which drops to the sandbox uid before bwrap starts.
LAUNCHER = """
n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n-1)); done
ulimit -n "$1"; shift
ulimit -c 0
exec "$@"
"""


def check_available() -> None:
    for tool, package in (("bwrap", "bubblewrap"), ("setpriv", "util-linux")):
        if shutil.which(tool, path=HOST_PATH) is None:
            raise IsolationUnavailable(
                f"{tool} is not installed: `apt-get install {package}` (or run with "
                "SANDBANK_ISOLATION=none, unisolated, for development only)"
            )
    cgroups.check_available()
    if os.geteuid() != 0:
        raise IsolationUnavailable(
            "the isolated runtime must start as root (it creates cgroups, loop mounts and "
            "drops each sandbox to its own uid)"
        )


class BwrapSandbox(ManagedSandbox):
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
    ) -> None:
        super().__init__(sandbox_id, limits, preimport)
        self.egress_proxy = egress_proxy
        self.dir = base_dir / sandbox_id
        self.runtime_dir = runtime_dir
        self.uids = uids
        self.cgroup = cgroups.Cgroup(instance, sandbox_id)
        self.seccomp_program = seccomp_program
        self._acquired = False

    @property
    def workspace(self) -> Path:
        return self.dir / "ws"

    @property
    def image(self) -> Path:
        return self.dir / "disk.img"

    async def _acquire(self) -> None:
        self._acquired = True
        self.uid = self.uids.claim()
        await asyncio.to_thread(self._acquire_sync)
        if self.egress_proxy is not None:
            await self.egress_proxy.open(self.id, self.dir / "egress", self.uid)

    def _acquire_sync(self) -> None:
        self.dir.mkdir(mode=0o711, parents=True)
        lim = self.limits
        self.cgroup.create(lim.memory_bytes, lim.pids, lim.cpus)
        disk.create(self.image, self.workspace, lim.disk_bytes, self.uid)
        etc = self.dir / "etc"
        etc.mkdir(mode=0o755)
        uid = self.uid
        (etc / "passwd").write_text(
            f"sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (etc / "group").write_text(f"sandbox:x:{uid}:\nnogroup:x:65534:\n")
        (etc / "hostname").write_text("sandbox\n")
        (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")

    def _argv(self, seccomp_fd: int, interrupt_fd: int) -> list[str]:
        uid = str(self.uid)
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
            "PYTHONPATH": f"{INSIDE_MOUNT}/mpl",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": str(max(1, int(lim.cpus))),
            "OMP_NUM_THREADS": str(max(1, int(lim.cpus))),
        }
        self._egress_env(env)
        argv = ["sh", "-c", LAUNCHER, "launcher"]
        procs = self.cgroup.procs_files()
        argv += [str(len(procs)), *procs, str(lim.open_files)]
        argv += [
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
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
        for item in ("passwd", "group", "hostname", "hosts"):
            argv += ["--ro-bind", str(self.dir / "etc" / item), f"/etc/{item}"]
        argv += [
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
            "--bind", str(self.workspace), "/workspace",
            "--ro-bind", str(self.runtime_dir), RUNTIME_MOUNT,
            "--ro-bind", str(INSIDE_DIR), INSIDE_MOUNT,
            *self._egress_binds(),
            "--remount-ro", "/",
            "--chdir", "/workspace",
            "--seccomp", str(seccomp_fd),
            "--", f"{RUNTIME_MOUNT}/bin/python3", "-s", f"{INSIDE_MOUNT}/worker.py",
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
        fd = filter_fd(self.seccomp_program)
        pipe = WorkerProcess.interrupt_pipe()
        try:
            return await WorkerProcess.spawn(
                self._argv(fd, pipe[0]),
                env={"PATH": HOST_PATH},
                pass_fds=[fd],
                max_frame=MAX_FRAME,
                interrupt_pipe=pipe,
            )
        finally:
            os.close(fd)

    async def _kill_everything(self) -> None:
        if self._worker is not None:
            self._worker.kill()
        await asyncio.to_thread(self.cgroup.kill_all)
        if self._worker is not None:
            await self._worker.wait(timeout=2.0)

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

    def _release_sync(self) -> None:
        self.cgroup.kill_all()
        with contextlib.suppress(FileNotFoundError):
            self.cgroup.remove()
        disk.destroy(self.image, self.workspace)
        shutil.rmtree(self.dir, ignore_errors=True)


def default_seccomp() -> bytes:
    return build_filter()
