"""Benchmark controlled egress: a download through the relay and proxy vs. directly from the host.

    .venv/bin/python bench/egress.py [--rounds 20] [--mib 32] [--rate 0]

A loopback HTTP server stands in for the world. The same `curl` downloads from it, once from
the host directly and once from inside a real sandbox (relay on 127.0.0.1:3128, the unix socket,
the proxy in this process), and from inside straight to the proxy's socket (the relay's
share); curl's own timings exclude its start. Prints medians of the time to
the first byte of a small answer (the added latency) and of the throughput of a large one.
Then another session's warm call is timed, idle and while the first downloads HUGE_MIB at full
speed (`--rate`: the proxy's shared rate, MiB/s; off by default here, 50 by the server's).
Run as root.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sandbank.config import Settings
from sandbank.protocol.calls import BashCall, PythonCall
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"
HUGE_MIB = 1024  # the download another session's calls are timed beside
WARM_CALLS = 300  # at most, while it runs
SOCKET = "/opt/sandbank/egress/egress.sock"
CURL = (
    "curl -sS --max-time 60 -o /dev/null "
    "-w '%{time_starttransfer} %{time_total} %{size_download}\\n'"
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    blob = b""

    def do_GET(self) -> None:
        if self.path.startswith("/huge"):  # HUGE_MIB, a MiB at a time
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE_MIB << 20))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            for _ in range(HUGE_MIB):
                self.wfile.write(chunk)
            return
        body = self.blob if self.path.startswith("/big") else b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_upstream(mib: int) -> None:
    Handler.blob = b"x" * (mib * 1024 * 1024)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


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


async def beside_a_download(rt: LocalSandboxes, downloader: str, url: str) -> None:
    """Another session's warm call, idle and while `downloader` fetches HUGE_MIB through the
    proxy; and the server's own CPU time for that download (its event loop's share)."""
    other = await rt.create(TENANT)
    call = PythonCall("print(1)")

    async def warm(n: int) -> list[float]:
        times = []
        for _ in range(n):  # paced alike, idle and busy (a call after a pause costs more)
            await asyncio.sleep(0.005)
            t = time.perf_counter()
            await rt.execute(other.id, TENANT, call, 30)
            times.append((time.perf_counter() - t) * 1e3)
        return times

    await warm(50)
    idle = await warm(200)
    cpu = time.process_time()
    cmd = f"{CURL} {url}"
    download = asyncio.create_task(rt.execute(downloader, TENANT, BashCall(cmd), 600))
    busy: list[float] = []
    while not download.done() and len(busy) < WARM_CALLS:
        busy += await warm(1)
    result = await download
    cpu = time.process_time() - cpu
    assert result.return_code == 0, result.stderr
    ((_, total, size),) = parse(result.stdout)
    print(f"while another session downloads {HUGE_MIB} MiB through relay + proxy:")
    print(f"{'  its throughput':<44} {size / total / 2**20:10.1f} MiB/s")
    print(f"{'  server CPU (this process) for it':<44} {cpu:10.2f} s")
    i = report("  warm print(1) of another session, idle", idle, "ms")
    b = report("  ... during the download", busy, "ms")
    print(f"{'  during / idle':<44} {b / i:10.2f}x")
    await rt.destroy(other.id, TENANT)


async def main(rounds: int, mib: int, port: int, rate_mib: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
    os.chmod(data, 0o711)  # noqa: S103 - sandbox uids traverse it to their workspace
    settings = Settings(
        data_dir=data,
        pool_size=0,
        pool_preimport=False,
        egress_allow=f"world.bench:{port},127.0.0.1:{port}",
        egress_test_hosts="world.bench=127.0.0.1",
        egress_rate_bytes=rate_mib << 20,
        egress_bytes_per_session=1 << 50,
        uid_lock_dir=Path(tempfile.gettempdir()) / "sandbank-bench-uids",
    )
    rt = LocalSandboxes(settings)
    await rt.start()
    small = f"http://world.bench:{port}/small"
    big = f"http://world.bench:{port}/big"
    try:
        session = await rt.create(TENANT)

        async def inside(url: str, n: int, how: str = "") -> list[tuple[float, float, int]]:
            cmd = f"for i in $(seq {n}); do {CURL} {how} {url}; done"
            r = await rt.execute(session.id, TENANT, BashCall(cmd), 600)
            assert r.return_code == 0, r.stderr
            return parse(r.stdout)

        async def host(url: str, n: int, how: str = "") -> list[tuple[float, float, int]]:
            direct = url if how else url.replace("world.bench", "127.0.0.1")
            cmd = f"for i in $(seq {n}); do {CURL} {how} {direct}; done"
            proc = await asyncio.create_subprocess_exec("sh", "-c", cmd, stdout=subprocess.PIPE)
            out, _ = await proc.communicate()  # the proxy runs on this loop meanwhile
            return parse(out.decode())

        # The proxy alone: curl speaks to the socket, skipping the relay (from the host too,
        # where curl is scheduled like the direct download, outside the sandbox's cgroup).
        def unix(url: str, path: str = SOCKET) -> str:
            return f"--unix-socket {path} --request-target {url}"

        box = getattr(rt.session(session.id, TENANT).sandbox, "box", None)
        slot = getattr(box, "slot", None)
        host_socket = str(getattr(slot, "egress_dir", data) / "egress.sock")

        await inside(small, 3)  # warm every path
        await host(small, 3)
        # Batches alternate between the paths, so the machine's noise falls on all of them.
        first: dict[str, list[float]] = {"host": [], "relay": [], "proxy": [], "hproxy": []}
        rate: dict[str, list[float]] = {"host": [], "relay": [], "proxy": [], "hproxy": []}
        for _ in range(max(1, rounds // 5)):
            first["host"] += [x[0] * 1e3 for x in await host(small, 5)]
            first["hproxy"] += [x[0] * 1e3 for x in await host(small, 5, unix(small, host_socket))]
            first["relay"] += [x[0] * 1e3 for x in await inside(small, 5)]
            first["proxy"] += [x[0] * 1e3 for x in await inside(small, 5, unix(small))]
        for _ in range(max(1, rounds // 10)):
            rate["host"] += [size / t / 2**20 for _, t, size in await host(big, 1)]
            rate["hproxy"] += [
                size / t / 2**20 for _, t, size in await host(big, 1, unix(big, host_socket))
            ]
            rate["relay"] += [size / t / 2**20 for _, t, size in await inside(big, 1)]
            rate["proxy"] += [size / t / 2**20 for _, t, size in await inside(big, 1, unix(big))]
        print(f"time to the first byte of a 3-byte answer; throughput of a {mib} MiB answer")
        h = report("host, directly: first byte", first["host"], "ms")
        report("host, proxy alone: first byte", first["hproxy"], "ms")
        p = report("sandbox, relay + proxy: first byte", first["relay"], "ms")
        report("sandbox, proxy alone: first byte", first["proxy"], "ms")
        print(f"{'added latency (relay + proxy)':<44} median {p - h:10.3f} ms")
        hd = report("host, directly: throughput", rate["host"], "MiB/s")
        report("host, proxy alone: throughput", rate["hproxy"], "MiB/s")
        pd = report("sandbox, relay + proxy: throughput", rate["relay"], "MiB/s")
        report("sandbox, proxy alone: throughput", rate["proxy"], "MiB/s")
        print(f"{'relay + proxy / direct':<44} {pd / hd:10.2f}x")
        await beside_a_download(rt, session.id, f"http://world.bench:{port}/huge")
    finally:
        await rt.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--rate", type=int, default=0, help="the proxy's rate, MiB/s (0: off)")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)  # the child's role
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
    else:
        # In a process of its own: in this one, its threads would fight the proxy for the GIL.
        upstream = subprocess.Popen(
            [sys.executable, __file__, "--upstream", str(args.mib)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert upstream.stdout is not None
            port = int(upstream.stdout.readline())
            asyncio.run(main(args.rounds, args.mib, port, args.rate))
        finally:
            upstream.kill()
            upstream.wait()
