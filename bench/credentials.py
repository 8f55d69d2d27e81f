"""Benchmark secretless credentials: a first HTTPS request the proxy terminates to add a key,
against the same request tunnelled end to end, from inside a real sandbox.

    .venv/bin/python bench/credentials.py [--rounds 60]

A loopback HTTPS server (a test CA, in a process of its own) answers two names: `api.bench`,
which has a credential in the operator's file, and `open.bench`, which has none. Each `curl`
from the sandbox is a new connection: CONNECT, TLS with the sandbox (for `api.bench`, the
proxy's leaf of the deployment CA, then its own verified TLS upstream), one GET. curl's
`time_starttransfer` (its start excluded) is the time to the first byte of the answer. Prints
medians of both and their difference, the cost of injection; and the tunnel's median beside a
run where no credential exists at all (what a tunnel costs now against before). Run as root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sandbank.config import Settings
from sandbank.protocol.calls import BashCall
from sandbank.sandbox.local import LocalSandboxes

TENANT = "bench"
CURL = "curl -sS --max-time 30 -o /dev/null -w '%{time_starttransfer}\\n'"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b"ok\n" if "authorization" not in self.headers else b"ok, with a key\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class TlsServer(ThreadingHTTPServer):
    daemon_threads = True
    context: ssl.SSLContext

    def get_request(self):  # type: ignore[no-untyped-def]
        sock, addr = super().get_request()
        return self.context.wrap_socket(sock, server_side=True), addr


def serve_upstream(directory: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.egress.upstream import make_ca

    _, context = make_ca(Path(directory), ["api.bench", "open.bench"])
    server = TlsServer(("127.0.0.1", 0), Handler)
    server.context = context
    print(server.server_address[1], flush=True)
    server.serve_forever()


def report(name: str, samples: list[float]) -> float:
    med = statistics.median(samples)
    print(f"{name:<52} median {med:8.2f} ms   n={len(samples)}")
    return med


async def measure(ca: Path, port: int, rounds: int, credentials: bool) -> dict[str, list[float]]:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-"))
    os.chmod(data, 0o711)  # noqa: S103 - sandbox uids traverse it to their workspace
    operator = data / "credentials.toml"
    operator.write_text(
        f'[[credential]]\ndestination = "api.bench:{port}"\n'
        'headers = { Authorization = "Bearer sk-bench-0123456789" }\n'
    )
    settings = Settings(
        data_dir=data,
        pool_size=0,
        pool_preimport=False,
        egress_allow=f"api.bench:{port},open.bench:{port},127.0.0.1:{port}",
        egress_test_hosts="api.bench=127.0.0.1,open.bench=127.0.0.1",
        egress_rate_bytes=0,
        egress_bytes_per_session=1 << 50,
        extra_ca_file=ca,
        egress_credentials_file=operator if credentials else None,
        uid_lock_dir=Path(tempfile.gettempdir()) / "sandbank-bench-uids",
    )
    rt = LocalSandboxes(settings)
    await rt.start()
    try:
        session = await rt.create(TENANT)

        async def inside(name: str, n: int) -> list[float]:
            url = f"https://{name}:{port}/"
            r = await rt.execute(
                session.id, TENANT, BashCall(f"for i in $(seq {n}); do {CURL} {url}; done"), 600
            )
            assert r.return_code == 0, r
            return [float(x) * 1e3 for x in r.stdout.split()]

        await inside("api.bench", 3)  # warm both paths (the leaf is minted once per name)
        await inside("open.bench", 3)
        found: dict[str, list[float]] = {"api.bench": [], "open.bench": []}
        for _ in range(max(1, rounds // 5)):  # batches alternate: noise falls on both
            for name in found:
                found[name] += await inside(name, 5)
        return found
    finally:
        await rt.close()
        shutil.rmtree(data, ignore_errors=True)


async def main(ca: Path, port: int, rounds: int) -> None:
    with_key = await measure(ca, port, rounds, credentials=True)
    without = await measure(ca, port, rounds, credentials=False)
    print("time to the first byte of a first HTTPS request from a sandbox (a new connection)")
    injected = report("api.bench: terminated, the credential added", with_key["api.bench"])
    tunnel = report("open.bench: tunnelled (credentials on elsewhere)", with_key["open.bench"])
    before = report("open.bench: tunnelled (no credential configured)", without["open.bench"])
    report("api.bench: tunnelled (no credential configured)", without["api.bench"])
    print(f"{'added by injection (terminated - tunnelled)':<52} median {injected - tunnel:8.2f} ms")
    print(f"{'tunnel with credentials on - without':<52} median {tunnel - before:8.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)  # the child's role
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
    else:
        directory = tempfile.mkdtemp(prefix="sandbank-bench-ca-")
        # In a process of its own: in this one, its threads would fight the proxy for the GIL.
        upstream = subprocess.Popen(
            [sys.executable, __file__, "--upstream", directory], stdout=subprocess.PIPE, text=True
        )
        try:
            assert upstream.stdout is not None
            port = int(upstream.stdout.readline())
            asyncio.run(main(Path(directory) / "ca.pem", port, args.rounds))
        finally:
            upstream.kill()
            upstream.wait()
            shutil.rmtree(directory, ignore_errors=True)
