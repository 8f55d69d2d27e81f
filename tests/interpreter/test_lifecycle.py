"""Runs across a real server's life: restart recovery, SIGTERM. No model and expiry are tested
over fakes in test_time_and_files.py.
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from sandbank.config import Settings
from sandbank.store import ChatSession, open_store
from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Server, data_dir, openai_env, running


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
