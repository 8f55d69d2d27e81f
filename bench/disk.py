"""What allocating workspaces whole costs a lease; prints medians.

    .venv/bin/python bench/disk.py [--leases 30] [--disk-mb 1024]

Leases (CreateSession, then a first `print(1)`) on the fork backend with the workspace image
allocated whole (`fallocate`, as served) and, for comparison, left sparse as it was before, the
two interleaved so the machine's noise falls on both alike; and `fallocate` alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import settings  # noqa: E402

from sandbank.protocol.calls import PythonCall  # noqa: E402
from sandbank.sandbox.host import disk  # noqa: E402
from sandbank.sandbox.local import LocalSandboxes  # noqa: E402


def sparse(image: Path, size: int, keep_free: int) -> None:
    """The old way: a sparse file, allocated as the session writes."""
    with open(image, "wb") as f:
        f.truncate(size)


async def lease_ms(rt: LocalSandboxes) -> tuple[float, float]:
    t0 = time.perf_counter()
    info = await rt.create("bench")
    created = (time.perf_counter() - t0) * 1000
    await rt.execute(info.id, "bench", PythonCall("print(1)"), 30)
    first = (time.perf_counter() - t0) * 1000
    await rt.destroy(info.id, "bench")
    await rt.drain()
    return created, first


async def main(leases: int, disk_mb: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-disk-"))
    os.chmod(data, 0o711)  # noqa: S103 - sandbox uids traverse it, no listing
    config = settings(data, isolation="fork", disk_limit_mb=disk_mb, pool_size=0)
    rt = LocalSandboxes(config)
    await rt.start()
    try:
        for _ in range(3):
            await lease_ms(rt)
        whole: list[tuple[float, float]] = []
        thin: list[tuple[float, float]] = []
        for _ in range(leases):
            whole.append(await lease_ms(rt))
            with mock.patch.object(disk, "allocate", sparse):
                thin.append(await lease_ms(rt))
        for name, got in (("allocated whole", whole), ("sparse (before)", thin)):
            print(
                f"{name:16s} create {statistics.median(c for c, _ in got):6.1f} ms, "
                f"create + first call {statistics.median(f for _, f in got):6.1f} ms"
            )
        times = []
        for i in range(leases):
            image = data / f"alone-{i}.img"
            t0 = time.perf_counter()
            disk.allocate(image, disk_mb << 20, 0)
            times.append((time.perf_counter() - t0) * 1000)
            image.unlink()
        print(f"fallocate of {disk_mb} MiB alone: {statistics.median(times):.2f} ms")
    finally:
        await rt.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leases", type=int, default=30)
    parser.add_argument("--disk-mb", type=int, default=1024)
    args = parser.parse_args()
    asyncio.run(main(args.leases, args.disk_mb))
