"""gVisor's `runsc` on this host: its state root, the shared root file system, the OCI bundle.

A gVisor sandbox runs the worker on gVisor's own kernel (the Sentry, a user-space process), so
user code's system calls never reach the host's. What the host gives it is the same as bwrap's:
the read-only runtime, the in-sandbox code, a few /etc files, the workspace disk, a private /tmp,
the egress socket when there is egress; nothing else of the host.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ...egress import sandboxing as egress
from ..limits import Limits
from . import layout, trust
from .layout import HOST_PATH

log = logging.getLogger(__name__)

# Tried in this order; runsc 2022-12 (Debian 12) has no systrap and refuses it at once.
PLATFORMS = ("systrap", "kvm", "ptrace")
PROBE_TIMEOUT = 5.0  # a platform that cannot run here hangs (kvm on a nested /dev/kvm)
CTL_INSIDE = "/opt/sandbank/ctl"  # the interrupt socket's directory
INTERRUPT_SOCKET = "interrupt.sock"
STATX_SHIM = "statx_shim.so"

# runsc 2022-12 (Debian 12) rejects statx(AT_NO_AUTOMOUNT) with EINVAL, which coreutils passes
# (`ls -l`, `stat` fail): a preloaded statx drops the flag, which means nothing inside gVisor.
STATX_SHIM_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
"""


class Runsc:
    """runsc's state root and the files every gVisor sandbox of this server shares."""

    def __init__(self, state_dir: Path, platform: str) -> None:
        self.dir = state_dir
        self.root = state_dir / "root"  # runsc's --root: its containers' state
        self.rootfs = state_dir / "rootfs"  # empty mount points and symlinks, read-only
        self.lib = state_dir / "lib"  # the in-sandbox code, bound at layout.LIB_MOUNT
        self.platform = platform
        self.statx_shim = False

    def base_args(self) -> list[str]:
        return [
            "runsc", f"--root={self.root}", f"--platform={self.platform}",
            "--network=none", "--ignore-cgroups", "--fsgofer-host-uds",
        ]  # fmt: skip

    # --- the shared files ------------------------------------------------------------------

    def prepare(self) -> None:
        """Remove what a previous run left (its containers first), then lay the shared files."""
        self.delete_all()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.root.mkdir(parents=True, mode=0o700)
        for path in (self.rootfs, self.lib):
            path.mkdir(parents=True, mode=0o755)
        self._rootfs()
        for rel, data in layout.inside_code().items():
            dest = self.lib / "sandbank_inside" / rel
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            dest.write_bytes(data)
            dest.chmod(0o555 if "/bin/" in f"/{rel}" else 0o444)
        self.statx_shim = _build_shim(self.lib / STATX_SHIM)

    def _rootfs(self) -> None:
        r = self.rootfs
        for d in ("usr", "etc", "tmp", "proc", "dev", "workspace", "home"):
            (r / d).mkdir(mode=0o755)
        for d in (layout.RUNTIME_MOUNT, layout.LIB_MOUNT, CTL_INSIDE, egress.SOCKET_DIR_INSIDE):
            (r / d.lstrip("/")).mkdir(parents=True, mode=0o755)
        (r / "etc/ssl/certs").mkdir(parents=True, mode=0o755)
        for link in ("bin", "sbin", "lib", "lib64"):
            if Path(f"/{link}").is_symlink():
                (r / link).symlink_to(f"usr/{link}")
        for link, target in layout.SYMLINKS.items():
            (r / link.lstrip("/")).symlink_to(target)
        for name in (*layout.ETC_BINDS, *layout.etc_files(0)):
            host = Path("/etc", name)
            dest = r / "etc" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if host.is_dir() and name in layout.ETC_BINDS:
                dest.mkdir(exist_ok=True)
            else:
                dest.touch()

    # --- one sandbox -----------------------------------------------------------------------

    def spec(
        self,
        *,
        uid: int,
        env: dict[str, str],
        limits: Limits,
        sandbox_dir: Path,
        workspace: Path,
        runtime: Path,
        egress_dir: Path | None,
        trust_store: Path | None,
    ) -> dict[str, Any]:
        """The OCI runtime spec of one sandbox (its /etc files written beside it)."""
        etc = sandbox_dir / "etc"
        etc.mkdir(mode=0o755, exist_ok=True)
        for name, text in layout.etc_files(uid).items():
            (etc / name).write_text(text)
            (etc / name).chmod(0o444)

        def bind(source: str | Path, dest: str, ro: bool = True) -> dict[str, Any]:
            options = ["rbind", "ro" if ro else "rw", "nosuid", "nodev"]
            return {"destination": dest, "type": "bind", "source": str(source), "options": options}

        mounts: list[dict[str, Any]] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "noexec", "mode=755"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",  # noqa: S108 - its own
             "options": ["nosuid", "nodev", "mode=1777", f"size={limits.tmp_bytes}"]},
            bind("/usr", "/usr"),
        ]  # fmt: skip
        for name in layout.ETC_BINDS:
            if Path("/etc", name).exists():
                mounts.append(bind(f"/etc/{name}", f"/etc/{name}"))
        for name in layout.etc_files(uid):
            mounts.append(bind(etc / name, f"/etc/{name}"))
        mounts += [
            bind(runtime, layout.RUNTIME_MOUNT),
            bind(self.lib, layout.LIB_MOUNT),
            bind(sandbox_dir / "ctl", CTL_INSIDE),
            bind(workspace, "/workspace", ro=False),
        ]
        if egress_dir is not None:
            mounts.append(bind(egress_dir, egress.SOCKET_DIR_INSIDE))
        for source, dest in trust.binds(trust_store):
            mounts.append(bind(source, dest))
        env = {**env, "SANDBANK_INTERRUPT_SOCKET": f"{CTL_INSIDE}/{INTERRUPT_SOCKET}"}
        if self.statx_shim:
            env["LD_PRELOAD"] = f"{layout.LIB_MOUNT}/{STATX_SHIM}"
        no_caps: list[str] = []
        return {
            "ociVersion": "1.0.0",
            "process": {
                "terminal": False,
                "user": {"uid": uid, "gid": uid, "additionalGids": []},
                "args": list(layout.WORKER),
                "env": [f"{k}={v}" for k, v in env.items()],
                "cwd": "/workspace",
                "capabilities": {
                    k: no_caps for k in ("bounding", "effective", "inheritable", "permitted")
                },
                "rlimits": [
                    {"type": "RLIMIT_NOFILE", "hard": limits.open_files, "soft": limits.open_files},
                    {"type": "RLIMIT_NPROC", "hard": limits.pids, "soft": limits.pids},
                    {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
                ],
                "noNewPrivileges": True,
            },
            "root": {"path": str(self.rootfs), "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            },
        }

    def write_bundle(self, bundle: Path, spec: dict[str, Any]) -> None:
        bundle.mkdir(mode=0o700, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(spec))

    def delete(self, container: str) -> None:
        """Kill a container's processes and forget it (a no-op for one runsc does not know)."""
        subprocess.run(
            [*self.base_args(), "delete", "-force", container],
            env={"PATH": HOST_PATH},
            capture_output=True,
            timeout=30,
            check=False,
        )

    def containers(self) -> list[str]:
        if not self.root.exists():
            return []
        done = subprocess.run(
            [*self.base_args(), "list", "-quiet"],
            env={"PATH": HOST_PATH},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return [line for line in done.stdout.split() if line]

    def delete_all(self) -> None:
        for container in self.containers():
            self.delete(container)


def _build_shim(dest: Path) -> bool:
    """Compile the statx shim with the host's C compiler; without one, `ls -l` fails inside."""
    cc = shutil.which("cc", path=HOST_PATH) or shutil.which("gcc", path=HOST_PATH)
    if cc is None:
        log.warning("no C compiler (`apt-get install gcc`): `ls -l` and `stat` fail under gvisor")
        return False
    source = dest.with_suffix(".c")
    source.write_text(STATX_SHIM_C)
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(dest), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        log.warning("the statx shim did not build: %s", done.stderr.strip()[-400:])
        return False
    dest.chmod(0o444)
    os.unlink(source)
    return True
