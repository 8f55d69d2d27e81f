"""Capacity over HTTP, for any server speaking the code-execution protocol; prints figures.

    .venv/bin/python bench/capacity.py --url URL [--burst 40] [--idle 50] [--fill] [--token T]

Run it against each server on its own (Sandbank with each backend, the reference backend), on
an otherwise quiet machine: memory is read from the machine's MemAvailable, which any other
work moves too. Each phase leaves nothing leased behind.

- `--burst N`: N clients at once, each on a connection of its own, each a CreateSession then a
  first small numpy call; p50 and p99 of the pair, and of the CreateSession alone; and the
  machine's CPU the burst took (all processes), which bounds the p50 from below.
- `--idle N`: N sessions leased one after another, each importing pandas, then held idle; the
  drop of MemAvailable per session (the server's warm pool, already full, refills meanwhile:
  holding N sessions costs what the drop says).
- `--fill`: idle pandas sessions leased until a lease is refused (any non-2xx, 503 at capacity
  included), MemAvailable falls below `--floor-mib`, or `--limit` or `--max-seconds` is reached;
  prints how many were held and what stopped it.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import http_protocol  # bench/, beside this script

PANDAS = 'import pandas as pd; pd.DataFrame({"a": [1]}).sum()'
NUMPY = "import numpy as np; np.arange(10).sum()"
SETTLE = 2.0  # seconds for frees and the pool's refill to show in MemAvailable


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for row in f:
            if row.startswith("MemAvailable:"):
                return int(row.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def machine_busy() -> float:
    """Seconds of CPU this machine's cores have spent busy since boot (every process, the
    kernel's work for them included): across a burst, what the burst cost."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]  # idle, iowait
    return (sum(cpu[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def line(name: str, samples: list[float]) -> None:
    print(
        f"{name:<40} p50 {pct(samples, 0.5):9.1f} ms  p99 {pct(samples, 0.99):9.1f} ms  "
        f"n={len(samples)}",
        flush=True,
    )


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def client(self) -> http_protocol.Client:
        return http_protocol.Client(self.args.url, self.args.token)

    def lease_pandas(self, c: http_protocol.Client) -> str:
        sid = c.create()
        out = c.execute(sid, PANDAS)
        if out.get("return_code") != 0:
            raise RuntimeError(f"the pandas call failed: {out.get('stderr', '')[-200:]}")
        return sid

    def release(self, c: http_protocol.Client, sids: list[str]) -> None:
        for sid in sids:
            c.destroy(sid)

    def bursts(self, n: int) -> None:
        p50s, p99s = [], []
        for i in range(self.args.repeat):
            if i:
                time.sleep(self.args.pause)  # the server's warm pool refills
            p50, p99 = self.burst(n)
            p50s.append(p50)
            p99s.append(p99)
        if self.args.repeat > 1:
            print(
                f"burst of {n}, {self.args.repeat} bursts: median of their p50 "
                f"{statistics.median(p50s):.1f} ms, of their p99 {statistics.median(p99s):.1f} ms",
                flush=True,
            )

    def burst(self, n: int) -> tuple[float, float]:
        """One burst; (p50, p99) of CreateSession + numpy call.

        One thread drives every connection (non-blocking sockets, one selector), so the
        bench costs a few ms of CPU, not the tens that 40 threads contending for the GIL would
        take from the server on a 2-core machine.
        """
        parts = urlsplit(self.args.url)
        addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        auth = f"authorization: Bearer {self.args.token}\r\n" if self.args.token else ""
        conns = [Conn(socket.create_connection(addr, timeout=10), addr[0], auth) for _ in range(n)]
        sel = selectors.DefaultSelector()
        cpu = time.process_time()
        busy = machine_busy()
        t0 = time.perf_counter()
        for c in conns:  # every connection made beforehand, as a gateway's pool has them
            c.sock.setblocking(False)
            c.send("POST", "/sessions", {})
            sel.register(c.sock, selectors.EVENT_READ, c)
        pairs: list[float] = []
        creates: list[float] = []
        failures: list[str] = []
        deadline = time.monotonic() + 600
        while len(pairs) + len(failures) < n and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                c = key.data
                reply = c.receive()
                if reply is None:
                    continue
                status, body = reply
                if status >= 300 or (c.sid and body.get("result_block", {}).get("content", {})
                                     .get("return_code") != 0):  # fmt: skip
                    failures.append(f"{status} {str(body)[:160]}")
                    sel.unregister(c.sock)
                elif not c.sid:
                    creates.append((time.perf_counter() - t0) * 1000)
                    c.sid = body["session_id"]
                    body = {"tool": "code_execution", "input": {"code": NUMPY}}
                    c.send("POST", f"/sessions/{c.sid}/exec", body)
                else:
                    pairs.append((time.perf_counter() - t0) * 1000)
                    sel.unregister(c.sock)
        cpu = (time.process_time() - cpu) * 1000
        busy = (machine_busy() - busy) * 1000
        wall = (time.perf_counter() - t0) * 1000
        sel.close()
        for c in conns:
            c.sock.close()
        line(f"burst of {n}: CreateSession + numpy call", pairs)
        line(f"burst of {n}: CreateSession alone", creates)
        print(f"burst of {n}: the bench's own CPU {cpu:.0f} ms", flush=True)
        # On a machine of `cores`, no order of the work finishes half the clients before half of
        # it is done: busy / 2 / cores bounds the p50 from below (a local server, quiet machine).
        cores = os.cpu_count() or 1
        print(
            f"burst of {n}: machine CPU {busy:.0f} ms over {wall:.0f} ms "
            f"({busy / n:.1f} ms a client; the p50 cannot be below ~{busy / 2 / cores:.0f} ms "
            f"on {cores} cores)",
            flush=True,
        )
        if failures:
            print(f"burst of {n}: {len(failures)} failed, first: {failures[0]}", flush=True)
        self.release(self.client(), [c.sid for c in conns if c.sid])
        return pct(pairs, 0.5), pct(pairs, 0.99)

    def idle(self, n: int) -> None:
        c = self.client()
        time.sleep(SETTLE)
        before = mem_available()
        sids = [self.lease_pandas(c) for _ in range(n)]
        time.sleep(SETTLE)
        drop = (before - mem_available()) / n / 2**20
        print(
            f"idle pandas sessions: MemAvailable drop {drop:.1f} MiB each over {n}",
            flush=True,
        )
        self.release(c, sids)

    def fill(self) -> None:
        args = self.args
        c = self.client()
        time.sleep(SETTLE)
        before = mem_available()
        t0 = time.monotonic()
        sids: list[str] = []
        why = f"the bench's limit of {args.limit}"
        try:
            while len(sids) < args.limit:
                if mem_available() < args.floor_mib * 2**20:
                    why = f"MemAvailable below {args.floor_mib} MiB"
                    break
                if time.monotonic() - t0 > args.max_seconds:
                    why = f"the bench's {args.max_seconds} s"
                    break
                try:
                    sids.append(self.lease_pandas(c))
                except Exception as e:  # noqa: BLE001 - what stopped the fill is the result
                    why = f"a lease was refused: {e!r}"[:240]
                    break
                if len(sids) % 100 == 0:
                    print(f"... {len(sids)} sessions", flush=True)
            drop = (before - mem_available()) / max(1, len(sids)) / 2**20
            print(
                f"fill: {len(sids)} idle pandas sessions held ({drop:.1f} MiB of MemAvailable "
                f"each) in {time.monotonic() - t0:.0f} s; stopped by {why}",
                flush=True,
            )
        finally:
            c = self.client()  # a refusal may have left the old connection unusable
            self.release(c, sids)


class Conn:
    """One keep-alive HTTP/1.1 connection of the burst: a request out, its reply read back."""

    def __init__(self, sock: socket.socket, host: str, auth: str) -> None:
        self.sock = sock
        self.host = host
        self.auth = auth
        self.sid = ""
        self.buf = b""

    def send(self, method: str, path: str, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n{self.auth}"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        )
        self.sock.setblocking(True)  # a small request: sent whole
        self.sock.sendall(head.encode() + data)
        self.sock.setblocking(False)

    def receive(self) -> tuple[int, Any] | None:
        """(status, JSON body) once a whole reply is in, else None."""
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return None
        lines = head.decode("latin-1").split("\r\n")
        length = 0
        for row in lines[1:]:
            name, _, value = row.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(rest) < length:
            return None
        self.buf = rest[length:]
        return int(lines[0].split()[1]), json.loads(rest[:length] or b"null")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--token")
    ap.add_argument("--burst", type=int, default=0, help="concurrent clients (0: no burst)")
    ap.add_argument("--repeat", type=int, default=5, help="bursts, the pool refilled between")
    ap.add_argument("--pause", type=float, default=15.0, help="seconds between bursts")
    ap.add_argument("--idle", type=int, default=0, help="idle sessions held (0: not measured)")
    ap.add_argument("--fill", action="store_true", help="count the sessions held until refusal")
    ap.add_argument("--floor-mib", type=int, default=2048)
    ap.add_argument("--limit", type=int, default=4000, help="most sessions --fill leases")
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    args = ap.parse_args()
    bench = Bench(args)
    print(f"{args.url}: load average before {os.getloadavg()}", flush=True)
    if args.burst:
        bench.bursts(args.burst)
    if args.idle:
        bench.idle(args.idle)
    if args.fill:
        bench.fill()
    print(f"load average after {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
