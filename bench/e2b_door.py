"""The E2B door's cost: the real E2B Python SDK against the same server's Otari protocol.

    .venv/bin/python bench/e2b_door.py [--rounds 200]

Starts a `sandbank serve` of its own (fork isolation, a warm pool of 4) and prints medians:
- a warm `run_code("1+1")` through the SDK, beside the same call on the Otari protocol (one
  interleaved loop, so both see the same machine), with the standard library's keep-alive
  client and with httpx (the SDK's own client library); and the door's `/execute` alone, with
  the standard library's client;
- `Sandbox.create()` through the SDK and `POST /v2/sandboxes` alone, from the warm pool (the
  pool refills between rounds), beside the Otari CreateSession.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.request import urlopen

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-e2b-key-0123456789"


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(data: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    env.update(
        SANDBANK_EXEC_TOKENS=KEY, SANDBANK_POOL_SIZE="4", SANDBANK_INTERPRETER_API="off",
        SANDBANK_LLM_OFFLINE="1", SANDBANK_LOG_LEVEL="warning",
    )  # fmt: skip
    argv = [str(REPO / ".venv/bin/sandbank"), "serve", "--port", str(port), "--data-dir", str(data)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if json.load(r).get("pool_ready", 0) >= 4:
                    return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


class Raw:
    """The standard library's keep-alive client: the server's cost, not a heavy client's."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port)
        self.headers = {"content-type": "application/json", **headers}

    def call(self, method: str, path: str, body: object = None) -> bytes:
        data = json.dumps(body) if body is not None else None
        self.conn.request(method, path, body=data, headers=self.headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {raw[:200]!r}")
        return raw


def report(name: str, samples: list[float]) -> None:
    q = statistics.quantiles(samples, n=10)
    print(f"{name:58s} median {statistics.median(samples):7.2f} ms  p90 {q[-1]:7.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--creates", type=int, default=30)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-e2b-"))
    data.chmod(0o711)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=KEY)
    import httpx
    from e2b_code_interpreter import Sandbox

    server = start_server(data, port)
    try:
        otari = Raw(port, {"authorization": f"Bearer {KEY}"})
        sid = json.loads(otari.call("POST", "/sessions", {}))["session_id"]
        exec_body = {"tool": "code_execution", "input": {"code": "1+1"}}
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {KEY}"}) as hx:
            sbx = Sandbox.create()
            door = Raw(port, {
                "e2b-sandbox-id": sbx.sandbox_id, "e2b-sandbox-port": "49999",
                "x-access-token": sbx._envd_access_token or "",
            })  # fmt: skip
            times: dict[str, list[float]] = {k: [] for k in ("sdk", "otari", "otari_httpx", "door")}
            for i in range(args.rounds + 10):
                t0 = time.perf_counter()
                assert sbx.run_code("1+1").text == "2"
                sdk = ms(t0)
                t0 = time.perf_counter()
                otari.call("POST", f"/sessions/{sid}/exec", exec_body)
                raw_otari = ms(t0)
                t0 = time.perf_counter()
                hx.post(f"/sessions/{sid}/exec", json=exec_body).raise_for_status()
                otari_httpx = ms(t0)
                t0 = time.perf_counter()
                door.call("POST", "/execute", {"code": "1+1", "context_id": None})
                raw_door = ms(t0)
                if i >= 10:  # the first calls warm both paths up
                    for key, value in zip(
                        times, (sdk, raw_otari, otari_httpx, raw_door), strict=True
                    ):
                        times[key].append(value)
            print(f"warm 1+1, {args.rounds} rounds interleaved:")
            report("  E2B SDK run_code('1+1')", times["sdk"])
            report("  Otari Execute (http.client)", times["otari"])
            report("  Otari Execute (httpx)", times["otari_httpx"])
            report("  E2B /execute alone (http.client)", times["door"])
            for a, b, what in (
                ("sdk", "otari_httpx", "SDK minus Otari with httpx"),
                ("sdk", "otari", "SDK minus Otari with http.client"),
                ("door", "otari", "/execute minus Otari, both with http.client"),
            ):
                paired = [x - y for x, y in zip(times[a], times[b], strict=True)]
                print(f"  {what}, paired median: {statistics.median(paired):.2f} ms")
            sbx.kill()
        creates: dict[str, list[float]] = {"sdk": [], "raw": [], "otari": []}
        control = Raw(port, {"x-api-key": KEY})
        for _ in range(args.creates):
            time.sleep(0.3)  # the pool refills
            t0 = time.perf_counter()
            made = Sandbox.create()
            creates["sdk"].append(ms(t0))
            made.kill()
            time.sleep(0.3)
            t0 = time.perf_counter()
            body = json.loads(control.call("POST", "/v2/sandboxes", {"templateID": "base"}))
            creates["raw"].append(ms(t0))
            control.call("DELETE", f"/sandboxes/{body['sandboxID']}")
            time.sleep(0.3)
            t0 = time.perf_counter()
            other = json.loads(otari.call("POST", "/sessions", {}))["session_id"]
            creates["otari"].append(ms(t0))
            otari.call("DELETE", f"/sessions/{other}")
        print(f"create from the warm pool, {args.creates} rounds:")
        report("  E2B SDK Sandbox.create()", creates["sdk"])
        report("  POST /v2/sandboxes alone (http.client)", creates["raw"])
        report("  Otari CreateSession (http.client)", creates["otari"])
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
