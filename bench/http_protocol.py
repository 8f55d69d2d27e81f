"""Benchmark any server that speaks the code-execution protocol; prints medians.

    .venv/bin/python bench/http_protocol.py --url http://127.0.0.1:8080 [--rounds 30] [--token T]

Measures CreateSession, the first Execute of a session, a warm Execute (`print(1)`),
DestroySession, the first `import pandas` of a new session, and create+exec+destroy cycles
per second with 2 concurrent clients. The client is the standard library's keep-alive
`http.client`, so the figures are the server's, not a heavy client's (httpx adds ~0.7 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlsplit

PANDAS = 'import pandas as pd; pd.DataFrame({"a": [1]}).sum()'


class Client:
    def __init__(self, url: str, token: str | None) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)
        self.headers = {"content-type": "application/json"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body) if body is not None else None
        self.conn.request(method, path, body=data, headers=self.headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {raw[:200]!r}")
        return json.loads(raw) if raw else None

    def create(self, body: dict[str, Any] | None = None) -> str:
        sid: str = self.call("POST", "/sessions", body or {})["session_id"]
        return sid

    def execute(self, sid: str, code: str) -> dict[str, Any]:
        body = {"tool": "code_execution", "input": {"code": code}}
        content: dict[str, Any] = self.call("POST", f"/sessions/{sid}/exec", body)["result_block"][
            "content"
        ]
        return content

    def destroy(self, sid: str) -> None:
        self.call("DELETE", f"/sessions/{sid}")


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def report(name: str, samples: list[float]) -> None:
    samples = sorted(samples)
    p90 = samples[max(0, int(len(samples) * 0.9) - 1)]
    med = statistics.median(samples)
    print(f"{name:<34} median {med:8.2f} ms   p90 {p90:8.2f} ms   n={len(samples)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--token")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between rounds (pool refill)")
    args = ap.parse_args()
    c = Client(args.url, args.token)
    creates, firsts, warms, destroys, pandas = [], [], [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        sid = c.create()
        creates.append(ms_since(t0))
        t0 = time.perf_counter()
        c.execute(sid, "print(1)")
        firsts.append(ms_since(t0))
        for _ in range(20):
            t0 = time.perf_counter()
            c.execute(sid, "print(1)")
            warms.append(ms_since(t0))
        t0 = time.perf_counter()
        c.destroy(sid)
        destroys.append(ms_since(t0))
        time.sleep(args.pause)
    for _ in range(max(5, args.rounds // 3)):
        sid = c.create()
        t0 = time.perf_counter()
        out = c.execute(sid, PANDAS)
        pandas.append(ms_since(t0))
        assert "a    1" in out["stdout"], out
        c.destroy(sid)
        time.sleep(args.pause)
    report("CreateSession", creates)
    report("first Execute (print(1))", firsts)
    report("warm Execute (print(1))", warms)
    report("DestroySession", destroys)
    report("first pandas call of a new session", pandas)

    done = 0
    stop = time.monotonic() + 10

    def cycle() -> None:
        nonlocal done
        cc = Client(args.url, args.token)
        while time.monotonic() < stop:
            sid = cc.create()
            cc.execute(sid, "print(1)")
            cc.destroy(sid)
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
