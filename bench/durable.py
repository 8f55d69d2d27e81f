"""Benchmark paused sessions, in-process over the fork backend (no HTTP). Run as root.

    .venv/bin/python bench/durable.py [--rounds 10] [--shutdown 20]

Per round, a session holding a 1000 x 1000 float DataFrame (pandas imported): the pause of the
idle session; the resume with the first call reading the DataFrame (a call on the paused
session resumes it); the first call's own time; a checkpoint of the running session; the
snapshot's size on disk (its trimmed workspace disk and its state). Then the stop of a server
holding `--shutdown` such sessions (each paused at the stop), and the next start finding them.
Goals (issue 27): pause <= 300 ms, resume + first call <= 300 ms, p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from capacity import pct  # bench/, beside this script
from sandbank.config import Settings
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"
SETUP = "import numpy as np, pandas as pd\ndf = pd.DataFrame(np.random.rand(1000, 1000))"
READ = "print(float(df.values.sum()) > 0)"
MiB = 1 << 20


def line(name: str, samples: list[float], unit: str = "ms") -> None:
    print(
        f"{name:<36} p50 {pct(samples, 0.5):8.1f} {unit}  p99 {pct(samples, 0.99):8.1f} {unit}"
        f"  n={len(samples)}",
        flush=True,
    )


async def holding_a_frame(rt: LocalSandboxes) -> str:
    sid = (await rt.create(TENANT)).id
    result = await rt.execute(sid, TENANT, PythonCall(SETUP), 120)
    assert result.return_code == 0, result.stderr
    return sid


async def rounds(rt: LocalSandboxes, n: int) -> None:
    assert rt.store is not None
    pause, resume, first, checkpoint, sizes = [], [], [], [], []
    for _ in range(n):
        sid = await holding_a_frame(rt)
        session = rt.session(sid, TENANT)
        t0 = time.perf_counter()
        await rt._pause(session, "checkpoint")
        checkpoint.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        await rt.pause(sid, TENANT)
        pause.append((time.perf_counter() - t0) * 1000)
        sizes.append(rt.store.size(sid) / MiB)
        kept = {p.name: p.stat().st_blocks * 512 // MiB for p in rt.store.dir(sid).iterdir()}
        print("   ", kept, flush=True)
        t0 = time.perf_counter()
        result = await rt.execute(sid, TENANT, PythonCall(READ), 60)
        resume.append((time.perf_counter() - t0) * 1000)
        assert result.stdout == "True\n", result
        first.append(float(result.duration_ms))
        await rt.destroy(sid, TENANT)
        await rt.drain()
    line("pause (idle, 1000x1000 DataFrame)", pause)
    line("resume + first call reading it", resume)
    line("  of which the call itself", first)
    line("checkpoint (running, not stopped)", checkpoint)
    line("snapshot on disk", sizes, "MiB")


async def shutdown(settings: Settings, n: int) -> None:
    rt = LocalSandboxes(settings)
    await rt.start()
    sids = [await holding_a_frame(rt) for _ in range(n)]
    t0 = time.perf_counter()
    await rt.close()
    stop = time.perf_counter() - t0
    print(f"stop pausing {n} pandas sessions          {stop:8.2f} s", flush=True)
    again = LocalSandboxes(settings)
    t0 = time.perf_counter()
    await again.start()
    found = sum(1 for s in again.sessions() if s.paused)
    print(f"next start finding them ({found} of {n})      {time.perf_counter() - t0:8.2f} s")
    t0 = time.perf_counter()
    for sid in sids:
        result = await again.execute(sid, TENANT, PythonCall(READ), 60)
        assert result.stdout == "True\n", result
    print(
        f"each resumed and read (mean)             {(time.perf_counter() - t0) / n * 1000:8.1f} ms"
    )
    for sid in sids:
        await again.destroy(sid, TENANT)
    await again.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shutdown", type=int, default=20)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
    os.chmod(data, 0o711)  # noqa: S103 - sandbox users traverse it to their workspaces
    try:
        settings = Settings(data_dir=data, isolation="fork", pool_size=0)
        rt = LocalSandboxes(settings)
        await rt.start()
        try:
            await rounds(rt, args.rounds)
        finally:
            await rt.close()
        shutil.rmtree(data / "paused", ignore_errors=True)
        if args.shutdown:
            await shutdown(settings, args.shutdown)
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
