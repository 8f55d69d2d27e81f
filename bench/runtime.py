"""Benchmark the sandbox runtime in-process (no HTTP); prints medians. Run as root.

    .venv/bin/python bench/runtime.py [--rounds 20] [--soak 1000]

Measures a lease from the warm pool, the first call after a lease, a warm `print(1)` round
trip, a warm call of a ~130-line cell, the first pandas call of a fresh lease, idle memory per
session (PSS of every process in its cgroup), create+execute+destroy cycles per second with 2
concurrent clients; with --soak N, runs N create/execute/destroy cycles and counts what is left
behind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandbank.config import Settings
from sandbank.protocol.calls import Output, PythonCall
from sandbank.sandbox.host.cgroups import Cgroup
from sandbank.sandbox.host.slot import IsolatedBox
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"
PANDAS = 'import pandas as pd; pd.DataFrame({"a": [1]}).sum()'
CHART = "import matplotlib.pyplot as plt; plt.plot([1, 2])"
# A cell of the length models write (~130 lines: helpers defined, one line printed).
LONG_CELL = (
    "import numpy as np\n"
    + "".join(
        f'\ndef step{i}(frame):\n    """Step {i}."""\n    total = frame[\'a\'].sum() + {i}\n'
        f"    return frame.assign(c=frame['b'] * total).query('c > 0.5')\n"
        for i in range(25)
    )
    + "print(len(np.arange(3)))\n"
)


def report(name: str, samples: list[float], unit: str = "ms") -> None:
    samples = sorted(samples)
    p90 = samples[max(0, int(len(samples) * 0.9) - 1)]
    med = statistics.median(samples)
    print(f"{name:<40} median {med:9.3f} {unit}   p90 {p90:9.3f} {unit}   n={len(samples)}")


def cgroup_of(sandbox: object) -> Cgroup | None:
    """The cgroup of an isolated sandbox (None for a backend without one)."""
    box = getattr(sandbox, "box", None)
    return box.slot.cgroup if isinstance(box, IsolatedBox) else None


def pss_mib(cgroup: Cgroup) -> float:
    total = 0
    for pid in cgroup.pids():
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


async def call(rt: LocalSandboxes, sid: str, code: str) -> float:
    t0 = time.perf_counter()
    r = await rt.execute(sid, TENANT, PythonCall(code), 60)
    assert r.return_code == 0, r.stderr
    return (time.perf_counter() - t0) * 1000


async def first_event(rt: LocalSandboxes, sid: str) -> float:
    """Time from a streamed call's start to its first output, the call going on after it."""
    t0 = time.perf_counter()
    first: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, Output) and event.stream == "stdout" and not first:
            first.append((time.perf_counter() - t0) * 1000)

    code = "print(1, flush=True)\nimport time; time.sleep(0.05)"
    await rt.execute(sid, TENANT, PythonCall(code), 60, on_event)
    return first[0]


async def main(args: argparse.Namespace) -> None:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
    data.chmod(0o711)  # noqa: ASYNC240 - set-up, before anything is measured
    settings = Settings(data_dir=data, pool_size=args.pool, max_sessions=64)
    rt = LocalSandboxes(settings)
    await rt.start()
    try:
        leases, firsts, warms, longs, pandas, pss, ttfb = [], [], [], [], [], [], []
        for _ in range(args.rounds):
            await rt.pool.wait_full(timeout=300)
            t0 = time.perf_counter()
            s = await rt.create(TENANT)
            leases.append((time.perf_counter() - t0) * 1000)
            firsts.append(await call(rt, s.id, "print(1)"))
            for _ in range(50):
                warms.append(await call(rt, s.id, "print(1)"))
            for _ in range(10):
                longs.append(await call(rt, s.id, LONG_CELL))
            for _ in range(5):
                ttfb.append(await first_event(rt, s.id))
            cgroup = cgroup_of(rt.session(s.id, TENANT).sandbox)
            if cgroup is not None:
                pss.append(pss_mib(cgroup))
            await rt.destroy(s.id, TENANT)
        charts: list[float] = []
        for _ in range(max(5, args.rounds // 2)):
            await rt.pool.wait_full(timeout=300)
            s = await rt.create(TENANT)
            pandas.append(await call(rt, s.id, PANDAS))
            charts.append(await call(rt, s.id, CHART))
            await rt.destroy(s.id, TENANT)
        await rt.drain()
        report("lease from the warm pool", leases)
        report("first call after a lease (print(1))", firsts)
        report("warm print(1) round trip", warms)
        report(f"warm call, a {LONG_CELL.count(chr(10))}-line cell", longs)
        report("streamed call: first stdout event", ttfb)
        report("first pandas call of a fresh lease", pandas)
        report("then a first chart (saved as PNG)", charts)
        if pss:
            report("idle PSS per session (pool, preimported)", pss, "MiB")

        await rt.pool.wait_full(timeout=300)
        done = 0
        stop = time.monotonic() + 10

        async def client() -> None:
            nonlocal done
            while time.monotonic() < stop:
                s = await rt.create(TENANT)
                await call(rt, s.id, "print(1)")
                await rt.destroy(s.id, TENANT)
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(client(), client())
        print(
            f"{'create+exec+destroy, 2 clients':<40} {done / (time.monotonic() - t0):9.2f} cycles/s"
        )
    finally:
        await rt.close()

    if args.soak:
        await soak(args.soak, data)
    shutil.rmtree(data, ignore_errors=True)


async def soak(cycles: int, data: Path) -> None:
    settings = Settings(data_dir=data, pool_size=0, max_sessions=64)
    rt = LocalSandboxes(settings)
    await rt.start()
    uids: set[int] = set()
    t0 = time.monotonic()
    try:
        for _ in range(cycles):
            s = await rt.create(TENANT)
            uids.add(s.sandbox.uid)
            await call(rt, s.id, "print(1)")
            await rt.destroy(s.id, TENANT)
        await rt.drain()
        rt.reap()
        left = {k: v for k, v in rt.backend.leftovers().items() if v}
        procs = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) in uids]
    finally:
        await rt.close()
    elapsed = time.monotonic() - t0
    print(
        f"soak: {cycles} cycles in {elapsed:.1f} s ({cycles / elapsed:.1f}/s), "
        f"{len(uids)} distinct uids; left behind: resources {left or 'none'}, "
        f"processes {len(procs)}"
    )


def _uid_of(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pool", type=int, default=2)
    ap.add_argument("--soak", type=int, default=0)
    asyncio.run(main(ap.parse_args()))
