"""What replacing the fork template costs (the str-hash secret and address layout it gives its
forks are renewed each time); prints medians.

    .venv/bin/python bench/template_rotation.py [--boots 5] [--leases 40]

Boots the template `--boots` times and reports each boot's wall time, the template's own CPU
time and its PSS; then the lease latency (create + first `print(1)`) with no boot under way and
while a replacement boots, and what rotating every N forks or T seconds costs on average.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import settings  # noqa: E402

from sandbank.protocol.calls import PythonCall  # noqa: E402
from sandbank.sandbox.backends.fork import ForkBackend  # noqa: E402
from sandbank.sandbox.backends.fork_template import process_memory  # noqa: E402
from sandbank.sandbox.local import LocalSandboxes  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / ticks


async def lease_ms(rt: LocalSandboxes) -> float:
    t0 = time.perf_counter()
    info = await rt.create("bench")
    await rt.execute(info.id, "bench", PythonCall("print(1)"), 30)
    ms = (time.perf_counter() - t0) * 1000
    await rt.destroy(info.id, "bench")
    return ms


async def main(boots: int, leases: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-template-"))
    os.chmod(data, 0o711)  # noqa: S103 - sandbox uids traverse it, no listing
    config = settings(data, isolation="fork", fork_template_max_forks=0)
    backend = ForkBackend(config)
    rt = LocalSandboxes(config, backend)
    await rt.start()
    try:
        template = backend.template
        assert template is not None
        walls, cpus, psss = [], [], []
        for _ in range(boots):
            t0 = time.perf_counter()
            proc = await template._boot()
            walls.append(time.perf_counter() - t0)
            cpus.append(cpu_seconds(proc.proc.pid))  # the template and its boot script
            psss.append(process_memory(proc.proc.pid).get("pss", 0) / 2**20)
            template._retire(proc)
            await proc.proc.wait()
        print(
            f"template boot: {statistics.median(walls):.2f} s wall, "
            f"{statistics.median(cpus):.2f} s CPU, PSS {statistics.median(psss):.0f} MiB"
        )
        for _ in range(3):
            await lease_ms(rt)
        quiet = statistics.median([await lease_ms(rt) for _ in range(leases)])
        booting = []
        for _ in range(max(1, leases // 10)):
            boot = asyncio.ensure_future(template._boot())
            await asyncio.sleep(0.1)
            while not boot.done():
                booting.append(await lease_ms(rt))
            proc = boot.result()
            template._retire(proc)
            await proc.proc.wait()
        print(
            f"lease (create + print(1)): {quiet:.1f} ms quiet, "
            f"{statistics.median(booting):.1f} ms while a template boots ({len(booting)} leases)"
        )
        cpu = statistics.median(cpus)
        for forks in (50, 100, 200):
            print(f"  every {forks} forks: {cpu / forks * 1000:.0f} ms of CPU per session")
        for seconds in (300, 600, 1800):
            print(f"  every {seconds} s: {cpu / seconds * 100:.2f}% of a core while forking")
    finally:
        await rt.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boots", type=int, default=5)
    parser.add_argument("--leases", type=int, default=40)
    args = parser.parse_args()
    asyncio.run(main(args.boots, args.leases))
