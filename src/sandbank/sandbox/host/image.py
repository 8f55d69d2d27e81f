"""What sandboxes bind from the host, mounted so no host path shows: runtime and inside/ code.

The runtime image: its ext4 image, loop-mounted read-only, machine-wide.

`make install` packs the runtime into RUNTIME.img (scripts/seal-runtime). Bound from that
mount, the sandbox's /proc/self/mountinfo names no host path (a bind of a directory would
show its path on the host's file system). The mount is shared by every server of the machine
and kept (it is read-only); a new image gets a mount of its own. Without an up-to-date image
(a development checkout) the runtime directory itself is bound, and a warning says so.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from pathlib import Path

from . import disk

log = logging.getLogger(__name__)
MOUNTS = Path("/run/sandbank/runtime")
INSIDE_MOUNTS = Path("/run/sandbank/inside")
INSIDE_BYTES = 16 << 20


def image_of(runtime_dir: Path) -> Path:
    return runtime_dir.with_name(runtime_dir.name + ".img")


def mounted_runtime(runtime_dir: Path) -> Path:
    """Where sandboxes bind the runtime from: the image's mount, or the directory itself."""
    image = image_of(runtime_dir)
    cfg = runtime_dir / "pyvenv.cfg"
    if not image.exists() or (cfg.exists() and image.stat().st_mtime < cfg.stat().st_mtime):
        log.warning(
            "no up-to-date runtime image at %s (`make install` builds it): sandboxes bind %s "
            "itself, whose host path they can read in /proc/self/mountinfo",
            image,
            runtime_dir,
        )
        return runtime_dir
    st = image.stat()
    key = hashlib.sha256(f"{image}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    point = MOUNTS / key
    MOUNTS.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(MOUNTS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # servers starting together mount it once
        if str(point) not in disk.mounts_under(MOUNTS):
            point.mkdir(exist_ok=True, mode=0o755)
            disk.mount_image(image, point)
            log.info("mounted the runtime image %s at %s", image, point)
    os.chmod(MOUNTS, 0o755)  # noqa: S103 - sandbox users traverse it to reach the runtime
    return point


def tree_files(root: Path) -> dict[str, bytes]:
    """The files below `root` (no bytecode caches), by path relative to it."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if "__pycache__" not in path.parts and path.is_file()
    }


def mounted_inside(files: dict[str, bytes]) -> Path:
    """The in-sandbox code on a read-only tmpfs of its own, one per content, machine-wide.

    The fork backend binds it (bwrap writes the files into each sandbox's root instead): a
    bind of the source directory would show its host path in /proc/self/mountinfo.
    """
    digest = hashlib.sha256()
    for rel, data in sorted(files.items()):
        digest.update(f"{rel}\0{len(data)}\0".encode() + data)
    point = INSIDE_MOUNTS / digest.hexdigest()[:16]
    INSIDE_MOUNTS.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(INSIDE_MOUNTS, 0o755)  # noqa: S103 - sandbox users never see it; the binds do
    with open(INSIDE_MOUNTS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if str(point) in disk.mounts_under(INSIDE_MOUNTS):
            return point
        point.mkdir(exist_ok=True, mode=0o755)
        disk.mount_tmpfs(point, INSIDE_BYTES)
        try:
            for rel, data in files.items():
                path = point / rel
                for parent in reversed(path.relative_to(point).parents[:-1]):
                    (point / parent).mkdir(mode=0o755, exist_ok=True)
                path.write_bytes(data)
                path.chmod(0o555 if rel.startswith("bin/") else 0o444)
            disk.remount_readonly(point)
        except BaseException:
            disk.unmount(str(point), lazy=True)
            raise
        log.info("mounted the in-sandbox code at %s", point)
    return point
