"""What an isolated sandbox sees, whichever backend builds it: paths, environment, /etc files.

Nothing here names a host path: the runtime and the in-sandbox code are mounted at fixed
places, and the few /etc files a sandbox gets are either harmless host files bound read-only
or written from data.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ...egress import sandboxing as egress
from ...egress.proxy import SOCKET_NAME
from ..limits import Limits
from . import image, trust

INSIDE_DIR = Path(__file__).resolve().parents[1] / "inside"
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


@functools.cache
def inside_code() -> dict[str, bytes]:
    """The in-sandbox package's files (sources, the pip wrapper), by path relative to it."""
    return image.tree_files(INSIDE_DIR)


def sandbox_env(
    limits: Limits, preimport: bool, egress_on: bool, trust_store: Path | None = None
) -> dict[str, str]:
    """The environment every sandboxed worker starts with (the fork template's too)."""
    threads = str(max(1, int(limits.cpus)))
    env = {
        "PATH": f"{egress.INSIDE_BIN}:{RUNTIME_MOUNT}/bin:/usr/local/bin:/usr/bin:/bin",
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
    # pip's settings always; the proxy's variables when this server has egress at all.
    env.update(egress.pip_env(network=egress_on))
    if egress_on:
        env.update(egress.proxy_env(SOCKET_NAME))
    env.update(trust.sandbox_env(trust_store))
    return env


def etc_files(uid: int) -> dict[str, str]:
    """/etc files written into the sandbox's own root from data, by name under /etc."""
    return {
        "passwd": f"sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"sandbox:x:{uid}:\nnogroup:x:65534:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    }


def data_fd(data: bytes) -> int:
    """A fresh descriptor reading `data` from its start (a memfd)."""
    fd = os.memfd_create("sandbank", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
