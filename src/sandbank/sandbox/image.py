"""The runtime image as sandboxes see it: its ext4 image, loop-mounted read-only, machine-wide.

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
