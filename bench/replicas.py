"""Benchmark the interpreter API on 1, 2 and 3 replicas sharing one PostgreSQL; prints medians.

    .venv/bin/python bench/replicas.py [--runs 60] [--rounds 3] [--latency 0.3]

Runs per second: clients post questions (one session each, kept on one replica as a sticky
load balancer would) and poll until each answer is DONE. The scripted model answers after
`--latency` seconds (as a hosted model would), so a replica's capacity
(`SANDBANK_RUNS_PER_REPLICA`) bounds its throughput and adding replicas adds capacity.
Takeover: a replica running a run is killed (-9); the time until another replica has claimed
the run (its `attempts` in the database becomes 2).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psycopg
from tests.agent.fake_llm_servers import (
    FakeLLMServer,
    openai_answer,
    openai_tool_call,
    serve_replies,
)
from tests.interpreter.harness import Server, data_dir, openai_env
from tests.postgres import running_postgres

LEASE_S = 3.0
POLL_S = 0.25
PER_REPLICA = 2


def scripted(latency: float) -> Any:
    """A model that takes `latency` per call: a direct answer, or a long sleep for "sleep"."""

    def reply(fake: FakeLLMServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(latency)
        last = body["messages"][-1]
        if last["role"] == "user" and "sleep" in str(last["content"]):
            return openai_tool_call("import time\ntime.sleep(300)")
        return openai_answer("Done.")

    return reply


@contextmanager
def fleet(count: int, database_url: str, llm: FakeLLMServer) -> Iterator[list[Server]]:
    env = {
        **openai_env(llm.url),
        "SANDBANK_DATABASE_URL": database_url,
        "SANDBANK_EXEC_API": "off",
        "SANDBANK_POOL_SIZE": "0",
        "SANDBANK_MAX_RUNS": "1000",
        "SANDBANK_MAX_RUNS_PER_USER": "1000",
        "SANDBANK_RUNS_PER_REPLICA": str(PER_REPLICA),
        "SANDBANK_RUN_LEASE_SECONDS": str(LEASE_S),
        "SANDBANK_RUN_POLL_SECONDS": str(POLL_S),
        "SANDBANK_SHUTDOWN_GRACE_SECONDS": "1",
    }
    servers = [Server(data_dir(), env) for _ in range(count)]
    try:
        with ThreadPoolExecutor(count) as pool:
            for started in [pool.submit(s.start) for s in servers]:
                started.result()
        yield servers
    finally:
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
            shutil.rmtree(server.data, ignore_errors=True)


def new_key(server: Server) -> str:
    name = f"bench{time.monotonic_ns()}"
    return server.cli("users", "create", name).strip().splitlines()[-1]


def throughput(servers: list[Server], runs: int) -> float:
    """Runs per second, (runs per replica + 1) clients per replica, each with one session on
    one replica (a sticky load balancer: a session's sandbox lives on one replica)."""
    key = new_key(servers[0])
    headers = {"Authorization": f"Bearer {key}"}
    clients = PER_REPLICA * len(servers) + len(servers)
    left = [runs]
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(headers=headers, timeout=30) as http:
            url = servers[index % len(servers)].url
            sid = http.post(url + "/api/sessions").json()["session_id"]
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                posted = http.post(url + f"/api/sessions/{sid}/messages", json={"content": "q"})
                assert posted.status_code == 200, posted.text
                for _ in range(1200):  # bounded: 60 s
                    status = http.get(url + f"/api/sessions/{sid}").json()["status"]
                    if status != "PENDING":
                        break
                    time.sleep(0.05)
                assert status == "DONE", status

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for done in [pool.submit(client, i) for i in range(clients)]:
            done.result()
    return runs / (time.monotonic() - started)


def takeover(servers: list[Server], database_url: str) -> float:
    """Seconds from killing the replica running a run to another replica claiming it."""
    key = new_key(servers[0])
    victim, survivor = servers[0], servers[1]
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        sid = http.post(victim.url + "/api/sessions").json()["session_id"]
        http.post(victim.url + f"/api/sessions/{sid}/messages", json={"content": "sleep"})
        for _ in range(600):  # bounded: 60 s
            if http.get(survivor.url + f"/api/sessions/{sid}").json().get("status_message") == (
                "running code"
            ):
                break
            time.sleep(0.1)
        conninfo = database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            victim.stop(signal.SIGKILL)
            killed = time.monotonic()
            for _ in range(6000):  # bounded: ~60 s
                row = conn.execute(
                    "SELECT attempts FROM runs WHERE session_id = %s", (sid,)
                ).fetchone()
                if row is not None and row[0] >= 2:
                    taken = time.monotonic() - killed
                    break
                time.sleep(0.01)
            else:
                raise AssertionError("the run was not taken over in 60 s")
        http.post(survivor.url + f"/api/sessions/{sid}/cancel")
    victim.start()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=60, help="runs per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.3, help="model latency (s)")
    args = parser.parse_args()
    with ExitStack() as stack:
        llm = stack.enter_context(serve_replies(scripted(args.latency)))
        database_url = stack.enter_context(running_postgres())
        print(
            f"model latency {args.latency} s per call; {PER_REPLICA} runs per replica; "
            f"lease {LEASE_S} s, poll {POLL_S} s"
        )
        for count in (1, 2, 3):
            with fleet(count, database_url, llm) as servers:
                rates = [throughput(servers, args.runs) for _ in range(args.rounds)]
                print(
                    f"{count} replica(s): {statistics.median(rates):.2f} runs/s "
                    f"(median of {args.rounds} x {args.runs} runs; min {min(rates):.2f}, "
                    f"max {max(rates):.2f})"
                )
                if count == 2:
                    times = [takeover(servers, database_url) for _ in range(args.rounds)]
                    print(
                        f"death to takeover: median {statistics.median(times):.2f} s "
                        f"(min {min(times):.2f}, max {max(times):.2f}; lease {LEASE_S} s)"
                    )


if __name__ == "__main__":
    main()
