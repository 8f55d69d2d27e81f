"""Benchmark the fleet's front on loopback; prints medians. Run as root.

    .venv/bin/python bench/fleet.py [--rounds 20] [--seconds 8] [--clients 4]

Starts three `sandbank serve` nodes (SANDBANK_ROLE=node) and fronts over 1, 2 and 3 of them,
each a process of its own on a loopback port, then measures, side by side in one run:
- a warm Execute (`print(1)`) on one session, through the front and straight to its node
  (interleaved, so both see the same machine load);
- CreateSession through the front and straight to a node;
- create+exec+destroy cycles per second through a front over 1, 2 and 3 nodes.
The client is the standard library's keep-alive `http.client` (as bench/http_protocol.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

from http_protocol import Client, ms_since, report

TOKEN = "bench-fleet-token"  # noqa: S105 - a loopback-only bench fleet


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    def __init__(self, root: Path, name: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data = root / name
        data.mkdir(mode=0o711)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
        self.env.update(
            {
                "SANDBANK_DATA_DIR": str(data),
                "SANDBANK_LOG_LEVEL": "warning",
                "SANDBANK_UID_LOCK_DIR": str(Path(tempfile.gettempdir()) / "sandbank-bench-uids"),
                "SANDBANK_LLM_OFFLINE": "1",
                **env,
            }
        )
        argv = [sys.executable, "-m", "sandbank.cli", "serve", "--port", str(self.port)]
        self.log = open(data / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, env=self.env, stdout=self.log, stderr=self.log)

    def wait(self) -> Proc:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.url} exited at start")
            with contextlib.suppress(OSError):
                if urlopen(self.url + "/health", timeout=1).status == 200:
                    return self
            time.sleep(0.2)
        raise SystemExit(f"{self.url} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@contextlib.contextmanager
def fleet(pool: int) -> Iterator[tuple[list[Proc], list[Proc]]]:
    root = Path(tempfile.mkdtemp(prefix="sandbank-bench-fleet-"))
    root.chmod(0o711)
    procs: list[Proc] = []
    try:
        nodes = []
        for i in range(3):
            env = {
                "SANDBANK_ROLE": "node",
                "SANDBANK_FLEET_TOKEN": TOKEN,
                "SANDBANK_FLEET_NODE_NAME": f"node-{i}",
                "SANDBANK_POOL_SIZE": str(pool),
                # The front's cost is measured, not the data stack's imports: lean sandboxes.
                "SANDBANK_POOL_PREIMPORT": "false",
                "SANDBANK_MAX_SESSIONS": "32",
            }
            nodes.append(Proc(root, f"node-{i}", env))
        procs += nodes
        for n in nodes:
            n.wait()
        fronts = []
        for count in (1, 2, 3):
            spec = ",".join(f"node-{i}={n.url}" for i, n in enumerate(nodes[:count]))
            env = {
                "SANDBANK_ROLE": "front",
                "SANDBANK_FLEET_TOKEN": TOKEN,
                "SANDBANK_FLEET_NODES": spec,
                "SANDBANK_INTERPRETER_API": "off",
            }
            fronts.append(Proc(root, f"front-{count}", env))
        procs += fronts
        for f in fronts:
            f.wait()
        yield nodes, fronts
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(root, ignore_errors=True)


def cpu_ms(pid: int) -> float:
    """CPU time a process has run, all threads (schedstat: ns, unlike stat's 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


def node_client(url: str) -> Client:
    return Client(url, TOKEN)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--pool", type=int, default=3)
    args = ap.parse_args()
    with fleet(args.pool) as (nodes, fronts):
        front = Client(fronts[2].url, None)
        # Warm Execute on one session, alternately through the front and straight to its node.
        via_front, direct = [], []
        front_cpu = node_cpu = 0.0
        for _ in range(args.rounds):
            sid = front.create()
            name, tagged, _ = sid.split(".")
            local = tagged[8:]  # after the node instance
            holder = nodes[int(name.rsplit("-", 1)[1])]
            node = node_client(holder.url)
            front.execute(sid, "print(1)")
            for _ in range(25):
                cpu0 = cpu_ms(fronts[2].proc.pid)
                t0 = time.perf_counter()
                front.execute(sid, "print(1)")
                via_front.append(ms_since(t0))
                front_cpu += cpu_ms(fronts[2].proc.pid) - cpu0
                cpu0 = cpu_ms(holder.proc.pid)
                t0 = time.perf_counter()
                node.execute(local, "print(1)")
                direct.append(ms_since(t0))
                node_cpu += cpu_ms(holder.proc.pid) - cpu0
            front.destroy(sid)
        # CreateSession, alternately, with pauses so the warm pools refill.
        create_front, create_direct = [], []
        direct_node = node_client(nodes[0].url)
        one_node_front = Client(fronts[0].url, None)  # over node-0 alone: the same pool
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            sid = one_node_front.create()
            create_front.append(ms_since(t0))
            one_node_front.destroy(sid)
            time.sleep(0.6)
            t0 = time.perf_counter()
            local = direct_node.create()
            create_direct.append(ms_since(t0))
            direct_node.destroy(local)
            time.sleep(0.6)
        report("warm Execute via the front", via_front)
        report("warm Execute straight to the node", direct)
        # Each pair ran back to back on one session: their difference is robust to load swings.
        report(
            "  added by the front (paired)", [f - d for f, d in zip(via_front, direct, strict=True)]
        )
        # CPU the front process spent per proxied call: what it adds on an idle machine, less
        # one more loopback hop; unlike wall time, robust to other work on the machine.
        print(f"{'  front CPU per warm call':<34} {front_cpu / len(via_front):8.3f} ms")
        print(f"{'  node server CPU per warm call':<34} {node_cpu / len(direct):8.3f} ms")
        report("CreateSession via the front", create_front)
        report("CreateSession straight to a node", create_direct)

        for count, f in zip((1, 2, 3), fronts, strict=True):
            rate = cycles(f.url, args.clients, args.seconds)
            label = f"create+exec+destroy, {count} node(s)"
            print(f"{label:<34} {rate:8.2f} cycles/s ({args.clients} clients)")
            time.sleep(2)


def cycles(url: str, clients: int, seconds: float) -> float:
    """create+exec+destroy cycles per second with `clients` concurrent keep-alive clients."""
    done = [0]
    stop = time.monotonic() + seconds

    def cycle() -> None:
        c = Client(url, None)
        while time.monotonic() < stop:
            sid = c.create()
            c.execute(sid, "print(1)")
            c.destroy(sid)
            done[0] += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=cycle) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / (time.monotonic() - t0)


if __name__ == "__main__":
    main()
