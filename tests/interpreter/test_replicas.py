"""Several `sandbank serve` replicas on one PostgreSQL and one S3: any replica answers anything,
a run survives the death (kill -9) or the stop (SIGTERM) of the replica working on it, and a
rolling restart under a stream of questions loses nothing."""

from __future__ import annotations

import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import httpx
import pytest

from tests.files.conftest import moto_endpoint  # noqa: F401 - a fixture, used by name
from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, data_dir, follow, kinds, openai_env
from tests.interpreter.test_life import CSV
from tests.postgres import running_postgres
from tests.tiers import needs

LEASE_S = 3.0
HANDED_BACK = "waiting for another server to continue"


def fleet_env(database_url: str, moto: str, bucket: str, llm: FakeLLM) -> dict[str, str]:
    return {
        **openai_env(llm.url),
        "SANDBANK_DATABASE_URL": database_url,
        "SANDBANK_STORAGE_URL": f"s3://{bucket}/objects",
        "SANDBANK_S3_ENDPOINT_URL": moto,
        "SANDBANK_S3_REGION": "us-east-1",
        "SANDBANK_S3_ACCESS_KEY_ID": "testing",
        "SANDBANK_S3_SECRET_ACCESS_KEY": "testing",
        "SANDBANK_EXEC_API": "off",
        "SANDBANK_POOL_SIZE": "0",  # nothing to start at boot: replicas restart faster
        "SANDBANK_MAX_RUNS_PER_USER": "8",
        "SANDBANK_MAX_RUNS": "16",
        "SANDBANK_RUN_LEASE_SECONDS": str(LEASE_S),
        "SANDBANK_RUN_POLL_SECONDS": "0.25",
        "SANDBANK_SHUTDOWN_GRACE_SECONDS": "0.5",
    }


@pytest.fixture(scope="module")
@needs("root", "postgres", "s3")
def fleet(moto_endpoint: str, llm: FakeLLM) -> Iterator[list[Server]]:  # noqa: F811
    """Two replicas started together (so their migrations race) on one fresh database."""
    bucket = f"sandbank-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    with running_postgres() as database_url:
        env = fleet_env(database_url, moto_endpoint, bucket, llm)
        servers = [Server(data_dir(), env) for _ in range(2)]
        try:
            with ThreadPoolExecutor(len(servers)) as pool:
                for started in [pool.submit(s.start) for s in servers]:
                    started.result()
            yield servers
        finally:
            logs = []
            for server in servers:
                if server.proc is not None and server.proc.poll() is None:
                    server.stop()
                logs.append(server.log.read_text())
                shutil.rmtree(server.data, ignore_errors=True)
    for log in logs:
        assert "Traceback" not in log, log[-5000:]


@pytest.fixture
def user(fleet: list[Server]) -> Iterator[list[Client]]:
    """One user, as a client of each replica."""
    name = f"u{uuid.uuid4().hex[:8]}"
    key = fleet[0].cli("users", "create", name).strip().splitlines()[-1]
    clients = [Client(s.url, key, name) for s in fleet]
    yield clients
    for client in clients:
        client.http.close()


def restarted(server: Server) -> None:
    """Start a replica again on its data directory if a test stopped it."""
    if server.proc is None or server.proc.poll() is not None:
        server.start()


def test_a_question_posted_to_one_replica_is_read_from_another(user: list[Client]) -> None:
    one, two = user
    sid = one.new_session()
    assert two.upload(sid, "data.csv", CSV).status_code == 204
    one.ask(sid, "Draw a chart of data.csv")
    assert two.wait(sid)["status"] == "DONE"
    history = two.ok("GET", f"/api/sessions/{sid}/messages")
    assert history == one.ok("GET", f"/api/sessions/{sid}/messages")
    assert "TOTAL 42" in history[-1]["content"]
    files = {f["filename"] for f in one.ok("GET", f"/api/sessions/{sid}/files")}
    assert files == {"data.csv", "chart.png"}
    link = two.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "chart.png"})
    assert httpx.get(link["url"]).content.startswith(b"\x89PNG")
    one.ok("DELETE", f"/api/sessions/{sid}")
    assert two.http.get(f"/api/sessions/{sid}").status_code == 404


def test_a_stream_on_another_replica_follows_the_run_through_the_store(
    user: list[Client],
) -> None:
    one, two = user
    sid = one.new_session()
    question = one.ask(sid, "Take a nap")  # the replica it is posted to runs it (it has room)
    received = follow(two, sid, params={"from": question["timestamp"]})
    assert received[-1].data == {"reason": "ended"}
    stored = two.ok("GET", f"/api/sessions/{sid}/messages", params={"from": question["timestamp"]})
    assert [r.data for r in received if r.kind == "message"] == stored
    assert "rested" in stored[-1]["content"]
    progress = [r.data.get("status_message") for r in received if r.kind == "status"]
    assert "running code" in progress and received[-2].data["status"] == "DONE"
    assert "text" not in kinds(received)  # the model's text is told only where it runs


def test_a_cancel_sent_to_another_replica_stops_the_run(user: list[Client]) -> None:
    one, two = user
    sid = one.new_session()
    one.ask(sid, "Please sleep")  # the replica it is posted to runs it (it has room)
    two.wait_for_status(sid, "running code")
    started = time.monotonic()
    cancelled = two.ok("POST", f"/api/sessions/{sid}/cancel")
    assert time.monotonic() - started < 5
    assert (cancelled["status"], cancelled["status_message"]) == ("ERROR", "cancelled")
    assert two.http.post(f"/api/sessions/{sid}/cancel").status_code == 409
    two.ask(sid, "Hello again")
    assert one.wait(sid)["status"] == "DONE"


def test_a_run_whose_replica_is_killed_is_continued_by_another(
    fleet: list[Server], user: list[Client]
) -> None:
    one, two = user
    sid = one.new_session()
    one.ask(sid, "sleep")
    two.wait_for_status(sid, "running code")
    before = two.ok("GET", f"/api/sessions/{sid}/messages")
    try:
        fleet[0].stop(signal.SIGKILL)
        killed = time.monotonic()
        session = two.wait(sid, timeout=LEASE_S + 20)
        assert session["status"] == "DONE", session
        assert time.monotonic() - killed < LEASE_S + 10
        after = two.ok("GET", f"/api/sessions/{sid}/messages")
        assert after[: len(before)] == before  # what the dead replica stored is intact
        assert after[-1]["role"] == "assistant" and not after[-1]["internal"]
        two.ask(sid, "Hello")
        assert two.wait(sid)["status"] == "DONE"
    finally:
        restarted(fleet[0])


def test_a_sigterm_mid_run_hands_the_run_over_without_an_error(
    fleet: list[Server], user: list[Client]
) -> None:
    one, two = user
    sid = one.new_session()
    one.ask(sid, "sleep")
    two.wait_for_status(sid, "running code")
    seen: list[tuple[str, str | None]] = []
    try:
        fleet[0].stop(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            session = two.ok("GET", f"/api/sessions/{sid}")
            seen.append((session["status"], session.get("status_message")))
            if session["status"] != "PENDING":
                break
            time.sleep(0.05)
        assert seen[-1] == ("DONE", None), seen
        assert not any(status == "ERROR" for status, _ in seen)
        history = two.ok("GET", f"/api/sessions/{sid}/messages")
        assert [m["content"] for m in history if m["role"] == "user"] == ["sleep"]
    finally:
        restarted(fleet[0])


class FleetClient:
    """One user, each request to the next replica that answers (as a load balancer would)."""

    def __init__(self, servers: list[Server], key: str) -> None:
        self.servers = servers
        self.headers = {"Authorization": f"Bearer {key}"}
        self.turn = 0

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for _ in range(200):  # bounded: ~20 s of every replica refusing connections
            self.turn += 1
            server = self.servers[self.turn % len(self.servers)]
            try:
                return httpx.request(
                    method, server.url + path, headers=self.headers, timeout=30, **kwargs
                )
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("no replica answered for 20 s")


def test_a_rolling_restart_under_a_stream_of_questions_loses_nothing(
    fleet: list[Server], user: list[Client]
) -> None:
    client = FleetClient(fleet, user[0].key)
    sessions = [user[0].new_session() for _ in range(3)]
    posted = dict.fromkeys(sessions, 0)
    failures: list[str] = []
    done = threading.Event()

    def stream(sid: str) -> None:
        while not done.is_set() and not failures:
            response = client.request(
                "POST", f"/api/sessions/{sid}/messages", json={"content": "nap"}
            )
            if response.status_code == 503:  # a replica between SIGTERM and exit
                time.sleep(0.2)
                continue
            if response.status_code != 200:
                failures.append(f"post: {response.status_code} {response.text}")
                return
            posted[sid] += 1
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                session = client.request("GET", f"/api/sessions/{sid}").json()
                if session["status"] != "PENDING":
                    break
                time.sleep(0.2)
            if session["status"] != "DONE":
                failures.append(f"{sid}: {session}")
                return

    threads = [threading.Thread(target=stream, args=(sid,)) for sid in sessions]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1)  # the stream is flowing
        for server in fleet:
            server.stop(signal.SIGTERM)
            server.start()
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=90)
    assert not failures, failures
    assert all(not t.is_alive() for t in threads)
    for sid in sessions:
        session = client.request("GET", f"/api/sessions/{sid}").json()
        assert session["status"] == "DONE", session
        history = client.request("GET", f"/api/sessions/{sid}/messages").json()
        questions = [m for m in history if m["role"] == "user"]
        answers = [m for m in history if m["role"] == "assistant" and not m["internal"]]
        assert len(questions) == posted[sid] == len(answers) > 0
