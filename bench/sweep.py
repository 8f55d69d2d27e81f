"""Benchmark what giving a sandbox back costs as sandboxes pile up, in-process (fork). As root.

    .venv/bin/python bench/sweep.py [--steps 0,100,300,1000] [--rounds 20]

At each step the server holds that many idle sessions (each with its workspace disk mounted,
so the mount table grows with them), and the script times, medians of `--rounds`:
- the periodic sweep for leftovers (every reaper period, in a thread, holding the GIL in slices
  while it parses: a stall of the event loop's other work);
- destroy of a session, which gives its sandbox back and sweeps;
- the event loop's longest stall while a destroy runs beside a ticker (1 ms ticks).
Each figure is printed with its ratio to the empty server (issue 37: per-request cost that does
not grow with the sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandbank.config import Settings
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"


async def longest_stall(work: asyncio.Future[None]) -> float:
    """The longest gap between 1 ms ticks while `work` runs (ms)."""
    worst, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last - 0.001), now
    await work
    return worst * 1000


async def measure(rt: LocalSandboxes, rounds: int) -> tuple[float, float, float]:
    sweeps, destroys, stalls = [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        await rt.sweep()
        sweeps.append((time.perf_counter() - t) * 1000)
        sid = (await rt.create(TENANT)).id
        await rt.execute(sid, TENANT, PythonCall("1"), 10)
        t = time.perf_counter()
        stalls.append(await longest_stall(asyncio.ensure_future(rt.destroy(sid, TENANT))))
        destroys.append((time.perf_counter() - t) * 1000)
        await rt.drain()
    return statistics.median(sweeps), statistics.median(destroys), statistics.median(stalls)


async def main(steps: list[int], rounds: int, d: Path) -> None:
    settings = Settings(
        data_dir=d, isolation="fork", pool_size=2, max_sessions=max(steps) + 10,
        reaper_interval_seconds=3600, pause_on_shutdown=False, disk_limit_mb=16,
    )  # fmt: skip
    rt = LocalSandboxes(settings)
    await rt.start()
    held: list[str] = []
    base: tuple[float, float, float] | None = None
    print(f"{'sessions':>8} {'sweep ms':>10} {'destroy ms':>11} {'loop stall ms':>14}")
    try:
        for n in steps:
            while len(held) < n:
                held.append((await rt.create(TENANT)).id)
            figures = await measure(rt, rounds)
            base = base or figures
            cells = [
                f"{f:.2f} ({f / b:.1f}x)" if b else f"{f:.2f}"
                for f, b in zip(figures, base, strict=True)
            ]
            print(f"{n:>8} {cells[0]:>10} {cells[1]:>11} {cells[2]:>14}", flush=True)
    finally:
        await rt.close()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="0,100,300,1000")
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-sweep-"))
    data.chmod(0o711)
    asyncio.run(main([int(x) for x in a.steps.split(",")], a.rounds, data))
