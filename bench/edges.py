"""The server's edges under abuse: what slow clients, huge heads and body floods cost it.

    .venv/bin/python bench/edges.py [--slow 20000] [--rounds 200]

Starts a real `sandbank serve` (the default isolation, a data directory under /tmp), then
prints for each attack the server's resident memory above idle (peak, sampled every 20 ms),
its open descriptors, the CPU it spent, what the attacker was answered, and the median
latency of a well-behaved client's warm Execute (`print(1)`, keep-alive, from another
loopback address) during the attack, beside the same figure at idle:

- slow: `--slow` connections from one address, each sending a partial request head and a
  byte every 2 s (the head timeout ends them);
- slow-spread: as many, spread over 16 addresses (past the server's overall cap);
- header: one request whose header is 48 MiB;
- fields: an unauthenticated upload of 16,000 multipart fields (`POST /api/uploads`).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SANDBANK = str(REPO / ".venv" / "bin" / "sandbank")
MiB = 1 << 20


# --- the server -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server() -> Iterator[tuple[int, int]]:
    data = Path(tempfile.mkdtemp(prefix="sandbank-bench-edges-"))
    data.chmod(0o711)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    env.update(SANDBANK_LLM_OFFLINE="1", SANDBANK_LOG_LEVEL="warning", SANDBANK_POOL_SIZE="2")
    log = open(data / "server.log", "wb")  # noqa: SIM115 - closed below
    argv = [SANDBANK, "serve", "--port", str(port), "--data-dir", str(data)]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), 1) as c,
            ):
                c.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                if c.recv(100).startswith(b"HTTP/1.1 200"):
                    break
            time.sleep(0.2)
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss(pid: int) -> int:
    """VmHWM: the most resident memory since `reset_peak` (or the process's start)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # the high-water mark becomes the current RSS


class Sampler:
    """The server's peak RSS (the kernel's high-water mark) and descriptors while an attack
    runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = self.peak_fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, StopIteration):
                self.peak_rss = max(self.peak_rss, rss(self.pid))
                self.peak_fds = max(self.peak_fds, fds(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        reset_peak(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_rss = max(self.peak_rss, peak_rss(self.pid))


# --- the well-behaved client ------------------------------------------------------------------
class Client:
    """Keep-alive Executes from its own loopback address."""

    def __init__(self, port: int, source: str = "127.0.0.2") -> None:
        self.conn = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=60, source_address=(source, 0)
        )
        self.headers = {"content-type": "application/json"}

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body) if body is not None else None
        try:
            self.conn.request(method, path, body=data, headers=self.headers)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            self.conn.close()  # closed by the keep-alive timeout while we were away
            self.conn.request(method, path, body=data, headers=self.headers)
            response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {raw[:200]!r}")
        return json.loads(raw) if raw else None

    def warm_ms(self, sid: str, rounds: int) -> float:
        body = {"tool": "code_execution", "input": {"code": "print(1)"}}
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            self.call("POST", f"/sessions/{sid}/exec", body)
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)


# --- the attacks ------------------------------------------------------------------------------
ATTACKER_SHARE = 5000  # connections per attacking process (each has its own descriptors)


def slow_clients(port: int, count: int, sources: int, seconds: float) -> dict[str, int]:
    """`count` connections, from processes of `ATTACKER_SHARE` each, for `seconds`."""
    procs = []
    for first in range(0, count, ATTACKER_SHARE):
        n = min(ATTACKER_SHARE, count - first)
        argv = [sys.executable, __file__, "--attack", f"{port},{n},{sources},{seconds}"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE))
    total: dict[str, int] = {}
    for proc in procs:
        out, _ = proc.communicate(seconds + 120)
        for key, value in json.loads(out).items():
            total[key] = total.get(key, 0) + value
    return total


def attacker(port: int, count: int, sources: int, seconds: float) -> dict[str, int]:
    """`count` connections sending a partial head, then a byte every 2 s until closed."""
    stop = threading.Event()
    conns: list[socket.socket] = []
    answered = {"503": 0, "408": 0, "closed": 0, "refused_connect": 0}
    for i in range(count):
        try:
            c = socket.create_connection(("127.0.0.1", port), 5, (f"127.0.1.{i % sources + 1}", 0))
        except OSError:
            answered["refused_connect"] += 1
            continue
        c.setblocking(False)
        with contextlib.suppress(OSError):
            c.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        conns.append(c)
    threading.Timer(seconds, stop.set).start()  # from the last connection on
    while not stop.is_set() and conns:
        poller = select.poll()
        by_fd = {c.fileno(): c for c in conns}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            c = by_fd[fd]
            with contextlib.suppress(OSError):
                head = c.recv(64)
                key = "503" if b" 503 " in head else "408" if b" 408 " in head else "closed"
                answered[key] += 1
            conns.remove(c)
            c.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.send(b"x")
        stop.wait(2.0)
    for c in conns:
        c.close()
    return answered


def huge_header(port: int, size: int = 48 * MiB) -> dict[str, int]:
    sent = 0
    with socket.create_connection(("127.0.0.1", port), 30) as c:
        c.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
        chunk = b"f" * MiB
        with contextlib.suppress(OSError):
            while sent < size:
                c.sendall(chunk)
                sent += len(chunk)
            c.sendall(b"\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            answer = c.recv(100)
    status = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1") else 0
    return {"status": status, "sent_MiB": sent // MiB}


def field_flood(port: int, fields: int = 16_000) -> dict[str, int]:
    boundary = "floodflood"
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n'
    body = "".join(part % i for i in range(fields)) + f"--{boundary}--\r\n"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(
        "POST",
        "/api/uploads",
        body=body.encode(),
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    response = conn.getresponse()
    response.read()
    conn.close()
    return {"status": response.status, "body_KiB": len(body) // 1024}


def repeated(port: int, kind: str, seconds: float) -> dict[str, Any]:
    """An attack made again and again for `seconds`, from a process of its own (the GIL of
    this one stays the well-behaved client's)."""
    argv = [sys.executable, __file__, "--repeat", f"{kind},{port},{seconds}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def repeat_in_this_process(kind: str, port: int, seconds: float) -> dict[str, Any]:
    attack = {"fields": field_flood, "header": huge_header}[kind]
    end, times, result = time.monotonic() + seconds, 0, {}
    while time.monotonic() < end:
        result = attack(port)
        times += 1
    return {"times": times, **result}


def measure(
    name: str,
    pid: int,
    client: Client,
    sid: str,
    rounds: int,
    attack: Callable[[], Any],
    repeat: bool = False,
) -> None:
    """The attack (again and again with `repeat`, so it lasts the whole measurement) beside
    the well-behaved client's warm calls; the idle figure is taken just before."""
    idle_ms = client.warm_ms(sid, rounds)
    idle_rss = rss(pid)
    cpu0 = cpu_seconds(pid)
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        n = 0
        while True:
            outcome["result"] = attack()
            n += 1
            if not repeat or done.is_set():
                break
        outcome["times"] = n

    worker = threading.Thread(target=run, daemon=True)
    with Sampler(pid) as sampler:
        worker.start()
        time.sleep(0.5 if repeat else 3.0)  # the attack is under way
        latency = client.warm_ms(sid, rounds)
        done.set()
        worker.join(120)
    print(
        f"{name:12s} peak RSS +{(sampler.peak_rss - idle_rss) / MiB:6.1f} MiB  peak fds "
        f"{sampler.peak_fds:6d}  server CPU {cpu_seconds(pid) - cpu0:5.2f} s  warm call "
        f"{latency:5.2f} ms (idle {idle_ms:.2f})  attacks {outcome.get('times')}, the "
        f"attacker got {outcome.get('result')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--attack", help=argparse.SUPPRESS)  # one attacking process
    parser.add_argument("--repeat", help=argparse.SUPPRESS)  # one repeating attacker
    args = parser.parse_args()
    if args.repeat:
        kind, port, seconds = args.repeat.split(",")
        print(json.dumps(repeat_in_this_process(kind, int(port), float(seconds))))
        return
    if args.attack:
        port, count, sources, seconds = args.attack.split(",")
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        print(json.dumps(attacker(int(port), int(count), int(sources), float(seconds))))
        return
    with server() as (port, pid):
        client = Client(port)
        sid = client.call("POST", "/sessions", {})["session_id"]
        client.warm_ms(sid, 20)
        idle = client.warm_ms(sid, args.rounds)
        print(f"idle         RSS {rss(pid) / MiB:.1f} MiB  fds {fds(pid)}  warm call {idle:.2f} ms")

        def slow(sources: int) -> Callable[[], Any]:
            return lambda: slow_clients(port, args.slow, sources, 15.0)

        # The small attacks first: what the large ones leave allocated would hide their cost.
        measure("fields", pid, client, sid, args.rounds, lambda: repeated(port, "fields", 8.0))
        measure("header", pid, client, sid, args.rounds, lambda: repeated(port, "header", 8.0))
        measure("slow", pid, client, sid, args.rounds, slow(1))
        time.sleep(12)  # the head timeout clears what is left
        measure("slow-spread", pid, client, sid, args.rounds, slow(16))
        client.call("DELETE", f"/sessions/{sid}")


if __name__ == "__main__":
    sys.exit(main())
