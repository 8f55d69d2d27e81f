"""`GET /api/sessions/{id}/events` on a real server: the model's text before its answer is
stored, then the messages, the status and the end; bounded; resumable."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.interpreter.fake_llm import SLOW_ANSWER, FakeLLM
from tests.interpreter.harness import Client, Server, follow, kinds, openai_env, running
from tests.tiers import needs

MAX_S = 4.0  # SANDBANK_EVENT_STREAM_MAX_SECONDS: short, so a stream on a long run times out


@pytest.fixture(scope="module")
@needs("root")
def server(llm: FakeLLM) -> Iterator[Server]:
    with running({**openai_env(llm.url), "SANDBANK_EVENT_STREAM_MAX_SECONDS": str(MAX_S)}) as s:
        yield s


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
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
