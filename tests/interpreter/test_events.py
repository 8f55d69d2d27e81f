"""`GET /api/sessions/{id}/events`: the model's text before its answer is stored, then the
messages, the status and the end; bounded; resumable.

The app is served by uvicorn on loopback (so the stream is read as it is written) over fakes:
the fake backend and a scripted model that writes its answer word by word (tests/fakeapp.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sandbank.agent.scripted import ScriptedModel
from tests.fakeapp import SLOW_ANSWER, FakeApp, chat
from tests.interpreter.fake_llm import SLOW_CHUNK_S, FakeLLM
from tests.interpreter.harness import Client, Received, follow, kinds, openai_env, running

MAX_S = 2.0  # SANDBANK_EVENT_STREAM_MAX_SECONDS: short, so a stream on a long run times out


@dataclass
class Server:
    url: str


@pytest.fixture(scope="module")
def fake() -> FakeApp:
    model = ScriptedModel(chat, chunk_delay=SLOW_CHUNK_S)
    return FakeApp(model=model, event_stream_max_seconds=MAX_S)


@pytest.fixture(scope="module")
def server(fake: FakeApp) -> Iterator[Server]:
    with fake.serving() as url:
        yield Server(url)


@pytest.fixture(scope="module")
def alice(fake: FakeApp, server: Server) -> Iterator[Client]:
    name, key = fake.new_user()
    with Client(server.url, key, name) as client:
        yield client


def test_text_arrives_before_the_answer_is_stored_then_messages_status_and_end(
    alice: Client,
) -> None:
    sid = alice.new_session()
    question = alice.ask(sid, "Answer slowly, please")
    received = follow(alice, sid, params={"from": question["timestamp"]})

    texts = [r for r in received if r.kind == "text"]
    assert "".join(t.data["text"] for t in texts) == SLOW_ANSWER
    assert {t.data["step"] for t in texts} == {1}
    assert len(texts) > 3  # pieces, not the whole answer at once
    answer = next(r for r in received if r.kind == "message" and r.data["role"] == "assistant")
    assert answer.data["content"] == SLOW_ANSWER
    assert texts[0].at < answer.at - 1.0  # the first words came well before the stored answer
    assert max(t.at for t in texts) <= answer.at
    # The stream's messages are the polled ones, each with its timestamp as the event id.
    stored = alice.ok(
        "GET", f"/api/sessions/{sid}/messages", params={"from": question["timestamp"]}
    )
    messages = [r for r in received if r.kind == "message"]
    assert [m.data for m in messages] == stored
    assert [m.id for m in messages] == [json.dumps(m["timestamp"]) for m in stored]
    statuses = [r.data for r in received if r.kind == "status"]
    assert statuses[0]["status"] == "PENDING" and statuses[-1]["status"] == "DONE"
    assert kinds(received)[-2:] == ["status", "end"] and received[-1].data == {"reason": "ended"}


def test_a_finished_session_sends_its_messages_and_ends_and_last_event_id_resumes(
    alice: Client,
) -> None:
    sid = alice.new_session()
    alice.ask(sid, "Hello there")
    assert alice.wait(sid)["status"] == "DONE"
    everything = follow(alice, sid)
    assert kinds(everything)[-2:] == ["status", "end"] and "text" not in kinds(everything)
    messages = [r for r in everything if r.kind == "message"]
    assert messages[0].data["role"] == "user"
    assert len(messages) == len(alice.ok("GET", f"/api/sessions/{sid}/messages"))
    resumed = follow(alice, sid, headers={"Last-Event-ID": messages[0].id or ""})
    assert [r.data for r in resumed if r.kind == "message"] == [m.data for m in messages[1:]]


def test_a_stream_on_a_long_run_ends_after_the_maximum_without_touching_the_run(
    alice: Client,
) -> None:
    sid = alice.new_session()
    alice.ask(sid, "Please sleep")
    received = follow(alice, sid)
    assert received[-1].kind == "end" and received[-1].data == {"reason": "timeout"}
    assert MAX_S - 0.5 < received[-1].at < MAX_S + 3
    progress = [r.data["status_message"] for r in received if r.kind == "status"]
    assert "running code" in progress  # status changes were followed while it ran
    assert alice.ok("GET", f"/api/sessions/{sid}")["status"] == "PENDING"
    alice.ok("POST", f"/api/sessions/{sid}/cancel")


def test_deleting_the_session_ends_its_stream(alice: Client, server: Server) -> None:
    sid = alice.new_session()
    alice.ask(sid, "Please sleep")
    alice.wait_for_status(sid, "running code")
    with Client(server.url, alice.key, alice.name) as other:
        started = time.monotonic()
        lines: list[str] = []
        with other.http.stream("GET", f"/api/sessions/{sid}/events", timeout=30) as response:
            for line in response.iter_lines():
                lines.append(line)
                if line.startswith("event: status"):
                    alice.ok("DELETE", f"/api/sessions/{sid}")
        assert lines[-3:-1] == ["event: end", 'data: {"reason": "deleted"}']
        assert time.monotonic() - started < MAX_S - 0.5


def test_a_stopping_server_ends_its_streams_saying_it_restarts(llm: FakeLLM, machine: None) -> None:
    env = {**openai_env(llm.url), "SANDBANK_SHUTDOWN_GRACE_SECONDS": "1"}
    with running(env) as server, server.new_user() as bob:
        sid = bob.new_session()
        question = bob.ask(sid, "sleep for a while")
        bob.wait_for_status(sid, "running code")
        received: list[Received] = []
        reader = threading.Thread(
            target=lambda: received.extend(follow(bob, sid, params={"from": question["timestamp"]}))
        )
        reader.start()
        time.sleep(1)
        server.stop()
        reader.join(30)
    assert received[-1].kind == "end"
    assert received[-1].data == {
        "reason": "shutdown",
        "message": "the server is restarting, retry: the answer goes on (on another replica, "
        "or once the server is back); reconnect with `from` set to the last message's timestamp",
    }
