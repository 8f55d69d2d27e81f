"""Benchmark a warm call in a session whose workspace holds many files, in-process. As root.

    .venv/bin/python bench/full_workspace.py [--isolation fork] [--files 0,1000,10000] [--rounds 30]

A session's workspace fills step by step (small files in one directory, as an unpacked data set
would be); at each step, medians of `--rounds` warm `print(1)` Python calls and `true` bash
calls, each with its ratio to the empty workspace. Every call reports the files it produced,
which once cost a walk of the whole workspace before and after the call.
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
from sandbank.protocol.calls import BashCall, PythonCall, ToolCall
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"
FILL = (
    "import os\nos.makedirs('data', exist_ok=True)\n"
    "for i in range({start}, {end}): open(f'data/part-{{i}}.csv', 'w').write('a,b\\n1,2\\n')"
)


async def median_ms(rt: LocalSandboxes, sid: str, call: ToolCall, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        await rt.execute(sid, TENANT, call, 30)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


async def main(isolation: str, steps: list[int], rounds: int, data: Path) -> None:
    settings = Settings(data_dir=data, isolation=isolation, pool_size=0, pause_on_shutdown=False)
    rt = LocalSandboxes(settings)
    await rt.start()
    try:
        sid = (await rt.create(TENANT)).id
        made, base = 0, None
        print(f"{'files':>7} {'python print(1)':>18} {'bash true':>16}")
        for n in steps:
            if n > made:
                await rt.execute(sid, TENANT, PythonCall(FILL.format(start=made, end=n)), 120)
                made = n
            py = await median_ms(rt, sid, PythonCall("print(1)"), rounds)
            sh = await median_ms(rt, sid, BashCall("true"), rounds)
            base = base or (py, sh)
            print(f"{n:>7} {py:>9.2f} ms {py / base[0]:>4.1f}x {sh:>8.2f} ms {sh / base[1]:>4.1f}x")
        await rt.destroy(sid, TENANT)
    finally:
        await rt.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isolation", default="fork")
    ap.add_argument("--files", default="0,1000,10000")
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sandbank-bench-ws-"))
    scratch.chmod(0o711)
    try:
        steps = [int(x) for x in a.files.split(",")]
        asyncio.run(main(a.isolation, steps, a.rounds, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
