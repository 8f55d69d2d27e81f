"""Benchmark the fork backend side by side with bwrap, in-process (no HTTP). Run as root.

    .venv/bin/python bench/fork.py [--backends bwrap,fork] [--sessions 50] [--burst 40]

Per backend, with the server's default settings (pool size and session count derived from this
machine): idle memory of a session that has imported pandas (the drop of MemAvailable per
session over N idle sessions, and the PSS of each session's cgroup; PSS and charge again for
sessions leased from the warm pool, which pre-walked pandas); a burst of concurrent
creates each followed by a first numpy call (p50, p99), with the default pool and with a pool of
2; a lease from an empty pool and from a warm one; a warm `print(1)`; the first pandas call of
a fresh lease, from either. With fork, the template's own memory is printed apart.
MemAvailable is machine-wide: on a shared machine other work moves it too.

How many sessions a machine holds: `bench/capacity.py --fill` against a server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from capacity import mem_available, pct  # bench/, beside this script
from sandbank.config import Settings
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.host.cgroups import Cgroup
from sandbank.sandbox.host.slot import IsolatedBox
from sandbank.sandbox.local import LocalSandboxes
from sandbank.sandbox.sessions import ExecSession

TENANT = "bench"
PANDAS = 'import pandas as pd; pd.DataFrame({"a": [1]}).sum()'
NUMPY = "import numpy as np; np.arange(10).sum()"


def line(backend: str, name: str, samples: list[float], unit: str = "ms") -> None:
    print(
        f"{backend:<6} {name:<34} p50 {pct(samples, 0.5):9.1f} {unit}  "
        f"p99 {pct(samples, 0.99):9.1f} {unit}  n={len(samples)}",
        flush=True,
    )


def cgroup_of(sandbox: object) -> Cgroup | None:
    """The cgroup of an isolated sandbox (None for a backend without one)."""
    box = getattr(sandbox, "box", None)
    return box.slot.cgroup if isinstance(box, IsolatedBox) else None


def cgroup_charge(session: ExecSession) -> int:
    """What the session's memory cgroup is charged: its own pages (not the template's)."""
    cgroup = cgroup_of(session.sandbox)
    assert cgroup is not None
    return int((cgroup.memory / "memory.usage_in_bytes").read_text())


def cgroup_pss(session: ExecSession) -> int:
    cgroup = cgroup_of(session.sandbox)
    assert cgroup is not None
    total = 0
    for pid in cgroup.pids():
        try:
            for row in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if row.startswith("Pss:"):
                    total += int(row.split()[1]) * 1024
        except OSError:
            continue
    return total


async def call(rt: LocalSandboxes, sid: str, code: str) -> float:
    t0 = time.perf_counter()
    r = await rt.execute(sid, TENANT, PythonCall(code), 120)
    assert r.return_code == 0, r.stderr
    return (time.perf_counter() - t0) * 1000


class Bench:
    def __init__(self, backend: str, args: argparse.Namespace) -> None:
        self.backend = backend
        self.args = args
        self.data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
        self.data.chmod(0o711)
        self.runs = 0

    def runtime(self, pool: int = -1, max_sessions: int = 0) -> LocalSandboxes:
        """A runtime with the server's defaults (-1 and 0 derive pool and session count)."""
        self.runs += 1
        return LocalSandboxes(
            Settings(
                data_dir=self.data / f"r{self.runs}",
                isolation=self.backend,  # type: ignore[arg-type]
                pool_size=pool,
                max_sessions=max_sessions,
                fork_template_max_forks=0,
            )
        )

    async def run(self) -> None:
        try:
            await self.idle_memory()
            await self.pooled_memory()
            await self.burst()  # the default pool
            await self.burst(pool=2)
            await self.singles()
        finally:
            shutil.rmtree(self.data, ignore_errors=True)

    async def idle_memory(self) -> None:
        rt = self.runtime(pool=0, max_sessions=self.args.sessions + 8)
        await rt.start()
        try:
            await asyncio.sleep(1.0)
            before = mem_available()
            sessions = []
            for _ in range(self.args.sessions):
                s = await rt.create(TENANT)
                await call(rt, s.id, PANDAS)
                sessions.append(rt.session(s.id, TENANT))
            await asyncio.sleep(2.0)  # let page cache and frees settle
            drop = (before - mem_available()) / len(sessions) / 2**20
            pss = [cgroup_pss(s) / 2**20 for s in sessions]
            charged = [cgroup_charge(s) / 2**20 for s in sessions]
            print(
                f"{self.backend:<6} idle pandas session: MemAvailable drop {drop:.1f} MiB each "
                f"over {len(sessions)}; PSS p50 {pct(pss, 0.5):.1f} MiB; charged to its "
                f"cgroup p50 {pct(charged, 0.5):.1f} MiB",
                flush=True,
            )
            template = getattr(rt.backend, "template", None)
            if template is not None:
                mem = template.memory()
                print(
                    f"{self.backend:<6} template (apart from sessions): PSS "
                    f"{mem['pss'] / 2**20:.1f} MiB, RSS {mem['rss'] / 2**20:.1f} MiB",
                    flush=True,
                )
        finally:
            await rt.close()

    async def pooled_memory(self) -> None:
        """The same, for sessions leased from the warm pool (which walked pandas' first uses)."""
        n = self.args.sessions
        rt = self.runtime(pool=n, max_sessions=2 * n + 8)
        await rt.start()
        try:
            await rt.pool.wait_full(timeout=600)
            sessions = [rt.session((await rt.create(TENANT)).id, TENANT) for _ in range(n)]
            for s in sessions:
                await call(rt, s.id, PANDAS)
            await asyncio.sleep(2.0)
            pss = [cgroup_pss(s) / 2**20 for s in sessions]
            charged = [cgroup_charge(s) / 2**20 for s in sessions]
            print(
                f"{self.backend:<6} idle pandas session leased from the pool: PSS p50 "
                f"{pct(pss, 0.5):.1f} MiB; charged to its cgroup p50 {pct(charged, 0.5):.1f} MiB",
                flush=True,
            )
        finally:
            await rt.close()

    async def burst(self, pool: int = -1) -> None:
        before = mem_available()
        rt = self.runtime(pool=pool)
        pool = rt.settings.pool_size
        await rt.start()
        try:
            await rt.pool.wait_full(timeout=600)
            await asyncio.sleep(1.0)  # the pool's last start settles
            drop = (before - mem_available()) / 2**20
            template = getattr(rt.backend, "template", None)
            apart = template.memory()["pss"] / 2**20 if template is not None else 0.0
            print(
                f"{self.backend:<6} pool of {pool} (max_sessions {rt.settings.max_sessions}): "
                f"MemAvailable drop {drop:.0f} MiB with the server"
                + (f", of which the template's PSS {apart:.0f} MiB" if template else ""),
                flush=True,
            )

            async def client() -> tuple[float, str]:
                t0 = time.perf_counter()
                s = await rt.create(TENANT)
                await call(rt, s.id, NUMPY)
                return (time.perf_counter() - t0) * 1000, s.id

            results = await asyncio.gather(*(client() for _ in range(self.args.burst)))
            name = f"burst of {self.args.burst}, pool {pool}: create+numpy"
            line(self.backend, name, [r[0] for r in results])
            for _, sid in results:
                await rt.destroy(sid, TENANT)
            await rt.drain()
        finally:
            await rt.close()

    async def singles(self) -> None:
        rt = self.runtime(pool=0)
        await rt.start()
        try:
            leases, warms, pandas = [], [], []
            for _ in range(self.args.rounds):
                t0 = time.perf_counter()
                s = await rt.create(TENANT)
                leases.append((time.perf_counter() - t0) * 1000)
                pandas.append(await call(rt, s.id, PANDAS))
                for _ in range(20):
                    warms.append(await call(rt, s.id, "print(1)"))
                await rt.destroy(s.id, TENANT)
                await rt.drain()
            line(self.backend, "lease, empty pool", leases)
            line(self.backend, "first pandas call after lease", pandas)
            line(self.backend, "warm call print(1)", warms)
        finally:
            await rt.close()
        rt = self.runtime(pool=2)  # leases from a warm pool, which pre-imports pandas
        await rt.start()
        try:
            leases, pandas = [], []
            for _ in range(self.args.rounds):
                await rt.pool.wait_full(timeout=600)
                await asyncio.sleep(0.5)
                t0 = time.perf_counter()
                s = await rt.create(TENANT)
                leases.append((time.perf_counter() - t0) * 1000)
                pandas.append(await call(rt, s.id, PANDAS))
                await rt.destroy(s.id, TENANT)
            line(self.backend, "lease, warm pool", leases)
            line(self.backend, "first pandas call, pooled lease", pandas)
        finally:
            await rt.close()


async def main(args: argparse.Namespace) -> None:
    print(f"load average before: {os.getloadavg()}", flush=True)
    for backend in args.backends.split(","):
        await Bench(backend, args).run()
    print(f"load average after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="bwrap,fork")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
