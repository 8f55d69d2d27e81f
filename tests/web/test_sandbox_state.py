"""The page says when a session's sandbox is paused (its variables kept), and that the next
question resumes it: on a server of its own that pauses sandboxes idle a few seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, openai_env, running
from tests.tiers import needs
from tests.web.conftest import Console, Tab
from tests.web.test_ui import CSV, ask, sign_in, wait_done

IDLE_S = 4  # a sandbox idle this long is paused
PAUSED = "Sandbox paused — your variables are kept; the next question resumes it."


@pytest.fixture(scope="module")
@needs("root")
def pausing(llm: FakeLLM) -> Iterator[Server]:
    env = {
        **openai_env(llm.url),
        "SANDBANK_PAUSE_AFTER_IDLE_SECONDS": str(IDLE_S),
        "SANDBANK_REAPER_INTERVAL_SECONDS": "0.5",
    }
    with running(env) as server:
        yield server


def paused_chat(user: Client) -> str:
    """A chat whose first answer left `df` in its sandbox, which is now paused."""
    chat = user.new_session()
    assert user.upload(chat, "data.csv", CSV).status_code == 204
    user.ask(chat, "Draw a chart of data.csv")
    assert user.wait(chat)["status"] == "DONE"
    deadline = time.monotonic() + IDLE_S + 15
    while user.ok("GET", f"/api/sessions/{chat}")["sandbox"] != "paused":
        assert time.monotonic() < deadline, "the idle sandbox was never paused"
        time.sleep(0.3)
    return chat


def test_a_paused_sandbox_is_shown_and_the_next_question_resumes_it(
    browser: Browser, pausing: Server
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console = Console()
    console.watch(page)
    tab = Tab(page, console, pausing.url)
    try:
        with pausing.new_user() as user:
            chat = paused_chat(user)
            page.goto(tab.base_url + "/")
            sign_in(page, user.key)
            row = page.locator(f'li.session-row[data-session="{chat}"]')
            expect(row.locator(".sandbox-mark")).to_have_text("sandbox paused")
            row.locator("a.open").click()
            state = page.locator(".sandbox-state")
            expect(state).to_have_text(PAUSED)
            expect(state).to_have_attribute("aria-live", "polite")
            tab.shot("sandbox-paused")

            ask(page, "Please recall the table")
            expect(state).to_have_text("Sandbox running.")
            wait_done(page)
            expect(page.locator(".msg.assistant").last).to_contain_text("ROWS 3")
            expect(state).to_have_text("Sandbox running.")
        assert console.unexpected(*tab.allowed) == [], "the page reported errors on its console"
    finally:
        context.close()
