"""A chat's sandbox outlives a restart of the server: paused at SIGTERM, found again at the next
start, resumed by the next question with its variables; the agent is not told they are lost.
The session says so (`sandbox`): paused, then running once the next question resumed it."""

from __future__ import annotations

import time

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, openai_env, running
from tests.interpreter.test_life import CSV
from tests.support import data_dir


def test_a_question_after_a_restart_finds_the_variables_of_the_one_before(
    machine: None, llm: FakeLLM
) -> None:
    env = {**openai_env(llm.url), "SANDBANK_PAUSE_ON_SHUTDOWN": "true"}
    with data_dir() as d, running(env, data=d) as server:
        with server.new_user() as alice:
            chat = alice.new_session()
            assert alice.upload(chat, "data.csv", CSV).status_code == 204
            alice.ask(chat, "Draw a chart of data.csv")
            assert alice.wait(chat)["status"] == "DONE"
            assert server.stop() in (0, -15)
            assert len(list((d / "paused").iterdir())) == 1  # the chat's sandbox, paused

            server.start()
            assert alice.ok("GET", f"/api/sessions/{chat}")["sandbox"] == "paused"
            asked = len(llm.requests)
            alice.ask(chat, "Please recall the table")
            assert alice.wait(chat)["status"] == "DONE"
            messages = alice.ok("GET", f"/api/sessions/{chat}/messages")
        assert "ROWS 3" in messages[-1]["content"]  # `df` of the question before the restart
        prompts = [str(r["messages"][0]["content"]) for r in llm.requests[asked:]]
        assert prompts and not any("the sandbox was restarted" in p for p in prompts)


def sandbox_of(client: Client, chat: str) -> str:
    return str(client.ok("GET", f"/api/sessions/{chat}")["sandbox"])


def test_a_session_reads_paused_while_its_idle_sandbox_is_and_reading_does_not_resume_it(
    machine: None, llm: FakeLLM
) -> None:
    idle_s = 4
    env = {
        **openai_env(llm.url),
        "SANDBANK_PAUSE_AFTER_IDLE_SECONDS": str(idle_s),
        "SANDBANK_REAPER_INTERVAL_SECONDS": "0.5",
    }
    with data_dir() as d, running(env, data=d) as server, server.new_user() as alice:
        chat = alice.new_session()
        assert sandbox_of(alice, chat) == "none"
        assert alice.upload(chat, "data.csv", CSV).status_code == 204
        alice.ask(chat, "Draw a chart of data.csv")
        assert alice.wait(chat)["sandbox"] == "running"  # read as the answer ended: not idle yet

        deadline = time.monotonic() + idle_s + 15
        while sandbox_of(alice, chat) != "paused":
            assert time.monotonic() < deadline, "the idle sandbox was never shown paused"
            time.sleep(0.3)
        snapshot = list((d / "paused").iterdir())
        assert len(snapshot) == 1
        # Reads (the session, with its messages, the list) leave it paused on disk.
        for _ in range(3):
            assert sandbox_of(alice, chat) == "paused"
            listed = {s["session_id"]: s for s in alice.ok("GET", "/api/sessions")}
            assert listed[chat]["sandbox"] == "paused"
            params = {"include_messages_from": 0}
            assert alice.ok("GET", f"/api/sessions/{chat}", params=params)["sandbox"] == "paused"
            time.sleep(0.3)
        assert list((d / "paused").iterdir()) == snapshot

        alice.ask(chat, "Please recall the table")
        assert alice.wait(chat)["sandbox"] == "running"
        messages = alice.ok("GET", f"/api/sessions/{chat}/messages")
        assert "ROWS 3" in messages[-1]["content"]  # the variables the pause kept
