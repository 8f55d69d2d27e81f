"""Benchmark any server that speaks the code-execution protocol; prints medians.

    .venv/bin/python bench/http_protocol.py --url http://127.0.0.1:8080 [--rounds 30] [--token T]

Measures CreateSession, the first Execute of a session, a warm Execute (`print(1)`),
DestroySession, the first `import pandas` of a new session, and create+exec+destroy cycles
per second with 2 concurrent clients.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def execute(c: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    r = c.post(f"/sessions/{sid}/exec", json={"tool": "code_execution", "input": {"code": code}})
    r.raise_for_status()
    content: dict[str, Any] = r.json()["result_block"]["content"]
    return content


def create(c: httpx.Client) -> str:
    r = c.post("/sessions", json={})
    r.raise_for_status()
    sid: str = r.json()["session_id"]
    return sid


PANDAS = 'import pandas as pd; pd.DataFrame({"a": [1]}).sum()'


def destroy(c: httpx.Client, sid: str) -> None:
    c.delete(f"/sessions/{sid}").raise_for_status()


def report(name: str, samples: list[float]) -> None:
    samples = sorted(samples)
    p90 = samples[int(len(samples) * 0.9) - 1] if len(samples) >= 10 else samples[-1]
    med = statistics.median(samples)
    print(f"{name:<34} median {med:8.2f} ms   p90 {p90:8.2f} ms   n={len(samples)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--token")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between rounds (pool refill)")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    c = httpx.Client(base_url=args.url, headers=headers, timeout=120)
    creates, firsts, warms, destroys, pandas = [], [], [], [], []
    for _ in range(args.rounds):
        ms, sid = timed(partial(create, c))
        creates.append(ms)
        firsts.append(timed(partial(execute, c, sid, "print(1)"))[0])
        for _ in range(20):
            warms.append(timed(partial(execute, c, sid, "print(1)"))[0])
        destroys.append(timed(partial(destroy, c, sid))[0])
        time.sleep(args.pause)
    for _ in range(max(5, args.rounds // 3)):
        sid = create(c)
        ms, out = timed(partial(execute, c, sid, PANDAS))
        assert "a    1" in out["stdout"], out
        pandas.append(ms)
        c.delete(f"/sessions/{sid}")
        time.sleep(args.pause * 3)
    report("CreateSession", creates)
    report("first Execute (print(1))", firsts)
    report("warm Execute (print(1))", warms)
    report("DestroySession", destroys)
    report("first pandas call of a new session", pandas)

    done = 0
    stop = time.monotonic() + 10

    def cycle() -> None:
        nonlocal done
        with httpx.Client(base_url=args.url, headers=headers, timeout=120) as cc:
            while time.monotonic() < stop:
                sid = create(cc)
                execute(cc, sid, "print(1)")
                cc.delete(f"/sessions/{sid}").raise_for_status()
                done += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=cycle) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{'create+exec+destroy, 2 clients':<34} {done / (time.monotonic() - t0):8.2f} cycles/s")


if __name__ == "__main__":
    main()
