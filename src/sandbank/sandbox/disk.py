"""Workspace disks: a loop-mounted ext4 image per sandbox, so a full disk is ENOSPC, not OOM."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from ..errors import IsolationUnavailable, SandboxError

_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def _run(argv: list[str]) -> None:
    try:
        proc = subprocess.run(argv, env=_ENV, capture_output=True, timeout=60, check=False)
    except FileNotFoundError as e:
        raise IsolationUnavailable(
            f"{argv[0]} is missing: install Debian's e2fsprogs and mount packages"
        ) from e
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise SandboxError(f"{argv[0]} failed: {err}")


def create(image: Path, mountpoint: Path, size_bytes: int, uid: int) -> None:
    """Make a sparse ext4 image owned by `uid` and mount it (nosuid, nodev) at `mountpoint`."""
    with open(image, "wb") as f:
        f.truncate(size_bytes)
    _run(
        [
            "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
            "-E", f"root_owner={uid}:{uid},nodiscard", str(image),
        ]
    )  # fmt: skip
    mountpoint.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)])
    with contextlib.suppress(OSError):
        (mountpoint / "lost+found").rmdir()
    os.chmod(mountpoint, 0o700)


def destroy(image: Path, mountpoint: Path) -> None:
    """Unmount and delete; a busy mount (a file still open on it) is detached lazily."""
    if is_mounted(mountpoint):
        unmount(str(mountpoint), lazy=True)
    with contextlib.suppress(FileNotFoundError):
        image.unlink()


def is_mounted(path: Path) -> bool:
    return str(path) in mounts_under(path.parent)


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below `prefix`, from /proc/self/mountinfo."""
    base = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == base or point.startswith(base + "/"):
                found.append(point)
    return found


def unmount(point: str, lazy: bool = False) -> None:
    """Unmount `point`; with `lazy`, detach it even while busy (freed when the last file closes)."""
    try:
        _run(["umount", point])
    except SandboxError:
        if not lazy:
            raise
        _run(["umount", "--lazy", point])


def mount_image(image: Path, point: Path) -> None:
    """Loop-mount an ext4 image read-only (nosuid, nodev) at `point`."""
    _run(["mount", "-o", "loop,ro,nosuid,nodev", str(image), str(point)])
