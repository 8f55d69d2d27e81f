"""What sandboxes bind from the host, mounted so no host path shows: runtime and inside/ code.

The runtime image: its ext4 image, loop-mounted read-only, machine-wide.

`make install` packs the runtime into RUNTIME.img (scripts/seal-runtime). Bound from that
mount, the sandbox's /proc/self/mountinfo names no host path (a bind of a directory would
show its path on the host's file system). The mount is shared by every server of the machine
and kept (it is read-only); a new image gets a mount of its own. Without an up-to-date image
(a development checkout) the runtime directory itself is bound, and a warning says so.

The in-sandbox code and the trust store (`trust.py`) are files on read-only tmpfs mounts, shared
the same way (`mounted_files`).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from collections.abc import Callable
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
    return shared_mount(
        MOUNTS, key, lambda point: disk.mount_image(image, point), f"the runtime image {image}"
    )


def shared_mount(mounts: Path, key: str, mount: Callable[[Path], None], what: str) -> Path:
    """`mounts/<key>`, mounted by `mount` unless it is already: one mount per content (`key`),
    shared by every server of the machine and kept (it is read-only)."""
    point = mounts / key
    mounts.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(mounts, 0o755)  # noqa: S103 - sandbox users traverse it to reach their binds
    with open(mounts / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # servers starting together mount it once
        if str(point) not in disk.mounts_under(mounts):
            point.mkdir(exist_ok=True, mode=0o755)
            mount(point)
            log.info("mounted %s at %s", what, point)
    return point


def mounted_files(mounts: Path, key: str, files: dict[str, bytes], size: int, what: str) -> Path:
    """`files` (by relative path) on a read-only tmpfs of `size` bytes at `mounts/<key>`, shared
    as `shared_mount`'s: what is under `bin/` may run, the rest is only read."""

    def fill(point: Path) -> None:
        disk.mount_tmpfs(point, size)
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

    return shared_mount(mounts, key, fill, what)


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
    key = digest.hexdigest()[:16]
    return mounted_files(INSIDE_MOUNTS, key, files, INSIDE_BYTES, "the in-sandbox code")
