"""The bwrap backend: each sandbox a fresh exec in bubblewrap namespaces, over a host slot.

The sandbox's process tree is started as its own unprivileged uid (never bwrap as root with
`--uid`, which would map host root in), from a fresh exec with an environment built here:
nothing of the server's environment, descriptors or memory reaches it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...config import Settings
from ...egress import sandboxing as egress
from ..channel import WorkerProcess
from ..host import layout, trust
from ..host.image import mounted_runtime
from ..host.machine import IsolatedHost, check_tools
from ..host.slot import IsolatedBox, Slot
from ..limits import Limits
from ..supervisor import SupervisedSandbox
from .base import new_sandbox_id
from .isolated import IsolatedBackend

# Runs as root for a moment: joins the cgroups and sets rlimits while the process is tiny,
# then execs setpriv, which drops to the sandbox uid before bwrap starts.
LAUNCHER = """
n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n-1)); done
ulimit -n "$1"; shift
ulimit -c 0
exec env -i "$@"
"""


def check_available() -> None:
    check_tools(
        (("bwrap", "bubblewrap"), ("setpriv", "util-linux")),
        "SANDBANK_ISOLATION=none, unisolated, for development only",
    )


class BwrapStarter:
    """Starts a sandbox's worker under bubblewrap, on its slot's uid, cgroups and disk."""

    def __init__(
        self,
        slot: Slot,
        *,
        runtime_dir: Path,
        limits: Limits,
        preimport: bool,
        seccomp: bytes,
        trust_store: Path | None = None,
    ) -> None:
        self.slot = slot
        self.trust_store = trust_store  # bound at /etc/ssl/certs (host/trust.py)
        self.runtime_dir = runtime_dir
        self.limits = limits
        self.preimport = preimport
        self.seccomp = seccomp

    def _files(self) -> dict[str, bytes]:
        """Files written into the sandbox's own root from data: no host path is mounted."""
        files = {
            f"/etc/{name}": text.encode() for name, text in layout.etc_files(self.slot.uid).items()
        }
        code = layout.inside_code()
        files.update({f"{layout.INSIDE_MOUNT}/{rel}": data for rel, data in code.items()})
        return files

    def _launcher(self, args_fd: int) -> list[str]:
        """Joins the cgroups and sets rlimits as root, then drops to the uid and starts bwrap."""
        uid = str(self.slot.uid)
        argv = ["sh", "-c", LAUNCHER, "launcher"]
        procs = self.slot.cgroup.procs_files()
        argv += [str(len(procs)), *procs, str(self.limits.open_files)]
        argv += [
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            "bwrap", "--args", str(args_fd), "--", *layout.WORKER,
        ]  # fmt: skip
        return argv

    def _argv(self, seccomp_fd: int, interrupt_fd: int, files: dict[str, int]) -> list[str]:
        """bwrap's arguments, passed through a descriptor: /proc/1/cmdline inside shows none."""
        lim = self.limits
        egress_on = self.slot.egress_proxy is not None
        env = layout.sandbox_env(lim, self.preimport, egress_on, self.trust_store)
        env["SANDBANK_INTERRUPT_FD"] = str(interrupt_fd)
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
        for item in layout.ETC_BINDS:
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
            "--bind", str(self.slot.workspace), "/workspace",
            "--ro-bind", str(self.runtime_dir), layout.RUNTIME_MOUNT,
        ]  # fmt: skip
        if egress_on:
            argv += ["--ro-bind", str(self.slot.egress_dir), egress.SOCKET_DIR_INSIDE]
        for source, dest in trust.binds(self.trust_store):
            argv += ["--ro-bind", source, dest]
        for link, target in layout.SYMLINKS.items():
            argv += ["--symlink", target, link]
        argv += [
            "--remount-ro", "/",
            "--chdir", "/workspace",
            "--seccomp", str(seccomp_fd),
        ]  # fmt: skip
        return argv

    async def launch(self) -> WorkerProcess:
        fds: list[int] = []
        try:
            seccomp = layout.data_fd(self.seccomp)
            fds.append(seccomp)
            files = {}
            for dest, data in self._files().items():
                files[dest] = layout.data_fd(data)
                fds.append(files[dest])
            pipe = WorkerProcess.interrupt_pipe()
            args = layout.data_fd(
                b"".join(a.encode() + b"\0" for a in self._argv(seccomp, pipe[0], files))
            )
            fds.append(args)
            return await WorkerProcess.spawn(
                self._launcher(args),
                env={"PATH": layout.HOST_PATH},
                pass_fds=fds,
                interrupt_pipe=pipe,
            )
        finally:
            for fd in fds:
                os.close(fd)


class BwrapBackend(IsolatedBackend):
    """Sandboxes in bubblewrap namespaces, with cgroups, a uid and a loop disk each."""

    name = "bwrap"
    durable = True

    def __init__(self, settings: Settings, host: IsolatedHost | None = None) -> None:
        super().__init__(settings, host)
        self.runtime_source = self.runtime_dir  # the image's mount once checked

    def check(self) -> None:
        check_available()
        super().check()
        self.runtime_source = mounted_runtime(self.runtime_dir)

    def new(self, preimport: bool) -> SupervisedSandbox:
        return self._sandbox(preimport, None)

    def resumed(self, image: Path, previous_uid: int) -> SupervisedSandbox:
        return self._sandbox(False, (image, previous_uid))

    def _sandbox(self, preimport: bool, kept: tuple[Path, int] | None) -> SupervisedSandbox:
        sandbox_id = new_sandbox_id()
        slot = self.host.slot(sandbox_id, kept_disk=kept)
        starter = BwrapStarter(
            slot,
            runtime_dir=self.runtime_source,
            limits=self.limits,
            preimport=preimport,
            seccomp=self.host.seccomp,
            trust_store=self.host.trust_store,
        )
        return SupervisedSandbox(sandbox_id, IsolatedBox(slot, starter.launch), self.limits)
