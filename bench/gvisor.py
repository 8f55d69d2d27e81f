"""gVisor beside fork, over HTTP, same run: one `sandbank serve` per isolation. Run as root.

    .venv/bin/python bench/gvisor.py [--isolations fork,gvisor] [--warm 200] [--idle 6] [--burst 40]

Per isolation: CreateSession from the warm pool (the pool refilled between leases), the first
exec of a lease, a warm `print(1)` exec, the first pandas call of a lease, the idle memory of a
session that has imported pandas (PSS of every process in its cgroups, gVisor's Sentry and
gofer included; median over `--idle` sessions), and a burst of concurrent CreateSession + first
numpy call. Medians, then the ratio gvisor/fork. Goals (issue 30): create <= 50 ms from the
pool, warm exec <= 2 ms over HTTP, idle pandas session <= 60 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sandbank.sandbox.backends.base import instance_id

REPO = Path(__file__).resolve().parents[1]
PANDAS = 'import pandas as pd; pd.DataFrame({"a": [1]}).sum()'
NUMPY = "import numpy as np; np.arange(10).sum()"
MEMORY = Path("/sys/fs/cgroup/memory/sandbank")


def exec_body(code: str) -> dict[str, object]:
    return {"tool": "code_execution", "input": {"code": code}, "timeout_seconds": 60}


def pss_of(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for row in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if row.startswith("Pss:"):
                    total += int(row.split()[1]) * 1024
        except OSError:
            continue
    return total


def sandbox_pss(instance: str) -> dict[str, int]:
    """Each sandbox cgroup's PSS (its processes' proportional pages), by sandbox id."""
    found = {}
    for group in (MEMORY / instance).glob("s*"):
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        found[group.name] = pss_of(pids)
    return found


async def timed(coro: object) -> float:
    start = time.perf_counter()
    await coro  # type: ignore[misc]
    return (time.perf_counter() - start) * 1000


async def measure(isolation: str, args: argparse.Namespace) -> dict[str, float]:
    port = 18700 + hash(isolation) % 200
    data = Path(tempfile.mkdtemp(prefix=f"sandbank-bench-{isolation}-", dir="/var/tmp"))
    os.chmod(data, 0o755)  # noqa: S103 - sandbox uids traverse to their workspaces
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    env |= {"SANDBANK_ISOLATION": isolation, "SANDBANK_DATA_DIR": str(data),
            "SANDBANK_PORT": str(port), "SANDBANK_POOL_SIZE": "4", "SANDBANK_LLM_OFFLINE": "1",
            "SANDBANK_MAX_SESSIONS": str(args.burst + args.idle + 8)}  # fmt: skip
    server = start_server(env)
    url = f"http://127.0.0.1:{port}"
    out: dict[str, float] = {}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            for _ in range(600):
                try:
                    if (await client.get("/health")).status_code < 500:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            await asyncio.sleep(args.settle)  # the pool fills

            async def create() -> str:
                r = await client.post("/sessions", json={})
                r.raise_for_status()
                return str(r.json()["session_id"])

            async def run(sid: str, code: str) -> None:
                r = await client.post(f"/sessions/{sid}/exec", json=exec_body(code))
                r.raise_for_status()

            creates, firsts, pandas, warm = [], [], [], []
            for _ in range(5):
                start = time.perf_counter()
                sid = await create()
                creates.append((time.perf_counter() - start) * 1000)
                firsts.append(await timed(run(sid, "print(1)")))
                pandas.append(await timed(run(sid, PANDAS)))
                await client.delete(f"/sessions/{sid}")
                await asyncio.sleep(args.settle)  # the pool refills
            sid = await create()
            for _ in range(args.warm):
                warm.append(await timed(run(sid, "print(1)")))
            await client.delete(f"/sessions/{sid}")
            out |= {"create from pool (ms)": statistics.median(creates),
                    "first exec (ms)": statistics.median(firsts),
                    "warm exec over HTTP (ms)": statistics.median(warm),
                    "first pandas call (ms)": statistics.median(pandas)}  # fmt: skip

            idle = [await create() for _ in range(args.idle)]
            for sid in idle:
                await run(sid, PANDAS)
            await asyncio.sleep(args.settle)
            sizes = sorted(sandbox_pss(instance_id(data)).values(), reverse=True)[: args.idle]
            out["idle pandas session PSS (MiB)"] = statistics.median(sizes) / 2**20
            for sid in idle:
                await client.delete(f"/sessions/{sid}")
            await asyncio.sleep(args.settle)

            async def lease() -> float | None:
                start = time.perf_counter()
                try:
                    sid = await create()
                    await run(sid, NUMPY)
                except httpx.HTTPError:
                    return None  # counted as a failure
                took = (time.perf_counter() - start) * 1000
                await client.delete(f"/sessions/{sid}")
                return took

            leases = await asyncio.gather(*(lease() for _ in range(args.burst)))
            burst = [t for t in leases if t is not None]
            out[f"burst of {args.burst}: create + numpy p50 (ms)"] = statistics.median(burst)
            out[f"burst of {args.burst}: slowest (ms)"] = max(burst)
            out[f"burst of {args.burst}: failed"] = float(len(leases) - len(burst))
    finally:
        stop_server(server, data)
    return out


def start_server(env: dict[str, str]) -> subprocess.Popen[bytes]:
    sandbank = str(Path(sys.executable).parent / "sandbank")
    return subprocess.Popen([sandbank, "serve"], env=env, cwd=REPO)


def stop_server(server: subprocess.Popen[bytes], data: Path) -> None:
    server.terminate()
    server.wait(300)
    shutil.rmtree(data, ignore_errors=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--isolations", default="fork,gvisor")
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--idle", type=int, default=6)
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--settle", type=float, default=8.0)
    args = parser.parse_args()
    names = args.isolations.split(",")
    results = {name: await measure(name, args) for name in names}
    keys = list(results[names[0]])
    print(
        f"{'':<40}"
        + "".join(f"{n:>12}" for n in names)
        + ("       ratio" if len(names) == 2 else "")
    )
    for key in keys:
        row = f"{key:<40}" + "".join(f"{results[n][key]:12.1f}" for n in names)
        if len(names) == 2 and results[names[0]][key]:
            row += f"{results[names[1]][key] / results[names[0]][key]:11.1f}x"
        print(row)


if __name__ == "__main__":
    asyncio.run(main())
