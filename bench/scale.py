"""Per-request costs as idle sessions pile up, for any Sandbank server; prints figures and a plot.

    .venv/bin/python bench/scale.py --url URL [--steps 0,100,300,1000] [--ceiling] [--token T]
        [--admin-token A] [--png bench-scale.png]

Idle pandas sessions (each holding a 200x50 DataFrame) are leased until each step's count is
reached; at each step one more client measures, against the same server: a warm `print(1)`
(p50, p99), CreateSession + a first numpy call (p50; the session is then ended), `GET /metrics`
(p50) and `GET /health` (p99, max), and reads the server's longest event-loop stall of the last
10 s (`sandbank_event_loop_lag_seconds`) twice: after 10 s idle, and after the measuring; and
its heap's full collections and frozen objects (heap.py). Each figure is printed with its ratio
to the empty server's. `--ceiling` adds a last step at the server's own ceiling
(`sandbank_sessions_max`, less its warm pool). Every session it leased is ended at the end.

The plot is drawn by the runtime image's Python (it has matplotlib; the server's has not).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import http_protocol  # bench/, beside this script

HOLD = "import pandas as pd, numpy as np\nframe = pd.DataFrame(np.random.rand(200, 50))"
NUMPY = "import numpy as np; np.arange(10).sum()"
WARM, CREATES, SCRAPES, HEALTH = 200, 30, 20, 300
COUNTS = ("full collections", "frozen objects (k)")  # the server's heap (heap.py), not times
IDLE = 10.5  # seconds idle before measuring: the server's loop-lag window, and a little
RUNTIME_PYTHON = Path(__file__).resolve().parents[1] / ".runtime" / "bin" / "python3"


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def timed(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def metric(text: str, name: str) -> float | None:
    for row in text.splitlines():
        if row.startswith(name + " ") or row.startswith(name + "{"):
            return float(row.rsplit(" ", 1)[1])
    return None


class Scale:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.c = http_protocol.Client(args.url, args.token)
        self.held: list[str] = []

    def raw(self, path: str) -> str:
        self.c.conn.request("GET", path, headers=self.c.headers)
        response = self.c.conn.getresponse()
        return response.read().decode()

    def fill_to(self, n: int) -> None:
        while len(self.held) < n:
            sid = self.c.create()
            out = self.c.execute(sid, HOLD)
            if out.get("return_code") != 0:
                raise RuntimeError(f"holding a frame failed: {out.get('stderr', '')[-200:]}")
            self.held.append(sid)
            if len(self.held) % 100 == 0:
                print(f"... {len(self.held)} idle sessions", flush=True)

    def measure(self) -> dict[str, float]:
        time.sleep(self.args.settle)  # the pool refills and the loop quiets
        time.sleep(IDLE)  # idle: nothing asked of the server for its whole lag window
        self.c.conn.close()  # the server may have closed it while idle: start afresh
        idle = self.raw("/metrics")  # its loop lag: the longest stall of the idle 10 s
        sid = self.c.create()
        self.c.execute(sid, "print(1)")
        warm = timed(lambda: self.c.execute(sid, "print(1)"), WARM)
        self.c.destroy(sid)

        def first_call() -> None:
            new = self.c.create()
            self.c.execute(new, NUMPY)
            self.c.destroy(new)

        creates = []
        for _ in range(CREATES):
            creates += timed(first_call, 1)
            time.sleep(0.2)  # a lease at a time, as clients come: the pool keeps up
        scrapes = timed(lambda: self.raw("/metrics"), SCRAPES)
        health = timed(lambda: self.raw("/health"), HEALTH)
        text = self.raw("/metrics")
        lag = metric(text, "sandbank_event_loop_lag_seconds")
        return {
            "warm p50": statistics.median(warm),
            "warm p99": pct(warm, 0.99),
            "create+first p50": statistics.median(creates),
            "metrics p50": statistics.median(scrapes),
            "health p99": pct(health, 0.99),
            "health max": max(health),
            "loop lag max (10 s)": (lag or 0.0) * 1000,
            "loop lag idle (10 s)": (metric(idle, "sandbank_event_loop_lag_seconds") or 0) * 1000,
            "full collections": metric(text, "sandbank_heap_full_collections") or 0,
            "frozen objects (k)": (metric(text, "sandbank_heap_frozen_objects") or 0) / 1000,
        }

    def ceiling(self) -> int:
        text = self.raw("/metrics")
        most = metric(text, "sandbank_sessions_max") or 0
        pool = metric(text, "sandbank_pool_ready") or 0
        return int(most - pool - 2)

    def end(self) -> None:
        c = http_protocol.Client(self.args.url, self.args.token)
        for sid in self.held:
            c.destroy(sid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--token", default=None)
    parser.add_argument("--steps", default="0,100,300,1000")
    parser.add_argument("--ceiling", action="store_true")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--png", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    bench = Scale(args)
    steps = [int(s) for s in args.steps.split(",") if s]
    if args.ceiling:
        steps.append(bench.ceiling())
    curve: dict[int, dict[str, float]] = {}
    try:
        for n in steps:
            bench.fill_to(n)
            curve[n] = bench.measure()
            base = curve[steps[0]]
            print(f"--- {n} idle sessions", flush=True)
            for name, value in curve[n].items():
                ratio = value / base[name] if base[name] else float("nan")
                unit = "  " if name in COUNTS else "ms"
                print(
                    f"{name:<22} {value:9.2f} {unit}   x{ratio:5.2f} of the empty server",
                    flush=True,
                )
    finally:
        bench.end()
    if args.json:
        Path(args.json).write_text(json.dumps(curve, indent=1))
    if args.png:
        plot(curve, args.png)


PLOT = """
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
curve = {int(k): v for k, v in json.load(sys.stdin).items()}
names = ["warm p50", "warm p99", "create+first p50", "metrics p50", "health p99"]
fig, ax = plt.subplots(figsize=(7, 4))
xs = sorted(curve)
for name in names:
    ax.plot(xs, [curve[x][name] for x in xs], marker="o", label=name)
ax.set_xlabel("idle pandas sessions on the server")
ax.set_ylabel("ms")
ax.set_yscale("log")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
ax.set_title("Per-request cost as sessions pile up (bench/scale.py)")
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=110)
"""


def plot(curve: dict[int, dict[str, float]], png: str) -> None:
    subprocess.run(
        [str(RUNTIME_PYTHON), "-c", PLOT, png],
        input=json.dumps(curve).encode(),
        check=True,
    )
    print(f"plot: {png}", flush=True)


if __name__ == "__main__":
    main()
