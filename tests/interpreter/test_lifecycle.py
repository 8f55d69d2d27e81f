"""Sessions and runs across time: expiry, no model, restart recovery, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from sandbank.config import Settings
from sandbank.store import ChatSession, open_store
from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Server, data_dir, openai_env, running
from tests.interpreter.test_life import assert_error
from tests.tiers import needs


@pytest.fixture(scope="module")
@needs("root")
def short_lived() -> Iterator[Server]:
    """Sessions live 3 s; no model is configured."""
    env = {
        "SANDBANK_SESSION_TTL_SECONDS": "3",
        "SANDBANK_SESSION_EXPIRY_INTERVAL_SECONDS": "0.5",
    }
    with running(env) as server:
        yield server


def test_without_a_model_a_question_is_refused_before_anything_is_stored(
    short_lived: Server,
) -> None:
    with short_lived.new_user() as client:
        sid = client.new_session()
        response = client.http.post(f"/api/sessions/{sid}/messages", json={"content": "hi"})
        message = assert_error(response, 503, 1101)
        # The operator's details (variables, providers) stay in the log.
        assert message == "the assistant is not available; ask the administrator"
        assert "SANDBANK_LLM_MODEL" in (short_lived.data / "server.log").read_text()
        assert client.ok("GET", f"/api/sessions/{sid}/messages") == []
        assert client.ok("GET", f"/api/sessions/{sid}")["status"] == "DONE"


def test_expired_sessions_are_deleted_with_their_files(short_lived: Server) -> None:
    with short_lived.new_user() as client:
        sid = client.new_session()
        assert client.upload(sid, "old.csv", b"1\n").status_code == 204
        objects = list((short_lived.data / "objects").rglob("old.csv"))
        assert objects
        deadline = time.monotonic() + 15
        while client.http.get(f"/api/sessions/{sid}").status_code == 200:
            assert time.monotonic() < deadline, "the session did not expire"
            time.sleep(0.25)
        assert_error(client.http.get(f"/api/sessions/{sid}"), 404)
        assert not any(p.exists() for p in objects)


def stored_session(server: Server, sid: str) -> ChatSession:
    """Read the session from the database directly (the server is down)."""

    async def read() -> ChatSession:
        store = open_store(Settings(data_dir=server.data))
        try:
            session = await store.chats.get(sid)
        finally:
            await store.close()
        assert session is not None
        return session

    return asyncio.run(read())


def test_runs_are_continued_after_a_kill_and_after_a_sigterm(llm: FakeLLM, machine: None) -> None:
    """One process on SQLite: a run it held is continued by the next start, not lost."""
    env = {**openai_env(llm.url), "SANDBANK_SHUTDOWN_GRACE_SECONDS": "0.5"}
    with running(env, data_dir()) as server, server.new_user() as client:
        sid = client.new_session()
        client.ask(sid, "sleep")
        client.wait_for_status(sid, "running code")
        server.stop(signal.SIGKILL)
        server.start()  # the same data directory: alone on it, it takes the run over at once
        session = client.wait(sid, timeout=30)
        assert session["status"] == "DONE", session
        history = client.ok("GET", f"/api/sessions/{sid}/messages")
        assert [m["content"] for m in history if m["role"] == "user"] == ["sleep"]
        assert history[-1]["role"] == "assistant"

        client.ask(sid, "sleep")
        client.wait_for_status(sid, "running code")
        started = time.monotonic()
        # uvicorn re-raises the signal once it has shut down cleanly.
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        assert time.monotonic() - started < 30
        session_row = stored_session(server, sid)
        assert session_row.status == "PENDING"  # handed back, not failed
        assert session_row.status_message == "waiting for another server to continue"
        with pytest.raises(httpx.TransportError):
            httpx.get(server.url + "/api/sessions", timeout=2)
        server.start()
        session = client.wait(sid, timeout=30)
        assert session["status"] == "DONE", session
