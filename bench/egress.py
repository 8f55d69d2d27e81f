"""Benchmark controlled egress: a download through the relay and proxy vs. directly from the host.

    .venv/bin/python bench/egress.py [--rounds 20] [--mib 32]

A loopback HTTP server stands in for the world. The same `curl` downloads from it, once from
the host directly and once from inside a real sandbox (relay on 127.0.0.1:3128, the unix socket,
the proxy in this process); curl's own timings exclude its start. Prints medians of the time to
the first byte of a small answer (the added latency) and of the throughput of a large one.
Run as root; the proxy's rate limit is off here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sandbank.config import Settings
from sandbank.sandbox.base import BashCall
from sandbank.sandbox.sessions import Runtime

TENANT = "bench"
CURL = "curl -sS -o /dev/null -w '%{time_starttransfer} %{time_total} %{size_download}\\n'"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    blob = b""

    def do_GET(self) -> None:
        body = self.blob if self.path.startswith("/big") else b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def parse(lines: str) -> list[tuple[float, float, int]]:
    out = []
    for line in lines.split("\n"):
        if line.strip():
            first, total, size = line.split()
            out.append((float(first), float(total), int(size)))
    return out


def report(name: str, samples: list[float], unit: str) -> float:
    med = statistics.median(samples)
    print(f"{name:<44} median {med:10.3f} {unit}   n={len(samples)}")
    return med


async def main(rounds: int, mib: int) -> None:
    Handler.blob = b"x" * (mib * 1024 * 1024)
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    upstream.daemon_threads = True
    port = upstream.server_address[1]
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
    os.chmod(data, 0o711)  # noqa: S103 - sandbox uids traverse it to their workspace
    settings = Settings(
        data_dir=data,
        pool_size=0,
        pool_preimport=False,
        egress_allow=f"world.bench:{port},127.0.0.1:{port}",
        egress_test_hosts="world.bench=127.0.0.1",
        egress_rate_bytes=0,
        egress_bytes_per_session=1 << 50,
        uid_lock_dir=Path(tempfile.gettempdir()) / "sandbank-bench-uids",
    )
    rt = Runtime(settings)
    await rt.start()
    small = f"http://world.bench:{port}/small"
    big = f"http://world.bench:{port}/big"
    try:
        session = await rt.create(TENANT)

        async def inside(url: str, n: int) -> list[tuple[float, float, int]]:
            cmd = f"for i in $(seq {n}); do {CURL} {url}; done"
            r = await rt.execute(session.id, TENANT, BashCall(cmd), 600)
            assert r.return_code == 0, r.stderr
            return parse(r.stdout)

        def host(url: str, n: int) -> list[tuple[float, float, int]]:
            direct = url.replace("world.bench", "127.0.0.1")
            cmd = f"for i in $(seq {n}); do {CURL} {direct}; done"
            return parse(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout)

        await inside(small, 3)  # warm both paths
        host(small, 3)
        print(f"small answer (3 bytes), {rounds} rounds; large answer {mib} MiB")
        h = report(
            "host direct: time to first byte", [x[0] * 1e3 for x in host(small, rounds)], "ms"
        )
        p = report(
            "sandbox via proxy: time to first byte",
            [x[0] * 1e3 for x in await inside(small, rounds)],
            "ms",
        )
        print(f"{'added latency':<44} median {p - h:10.3f} ms")
        n = max(3, rounds // 4)
        mib_s = [size / t / 2**20 for _, t, size in host(big, n)]
        hd = report("host direct: throughput", mib_s, "MiB/s")
        mib_s = [size / t / 2**20 for _, t, size in await inside(big, n)]
        pd = report("sandbox via proxy: throughput", mib_s, "MiB/s")
        print(f"{'proxy / direct':<44} {pd / hd:10.2f}x")
    finally:
        await rt.shutdown()
        upstream.shutdown()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--mib", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.mib))
