"""What the page says about sessions: no DONE before a question, titles, order, a quiet load."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.interpreter.harness import Client
from tests.web.conftest import Tab
from tests.web.test_ui import RUN_TIMEOUT, ask, open_new_session, sign_in


def test_loading_the_page_provokes_no_refusal(tab: Tab) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert not [u for u in tab.console.requests if "/api/" in u]  # no probe of the API
    assert tab.console.unexpected() == []


def test_a_new_session_is_new_until_asked_and_the_badge_follows_the_run(
    tab: Tab, user: Client
) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    badge = page.locator(".title-row .badge")
    expect(badge).to_have_text("NEW")
    ask(page, "sleep for a while")
    # While the status line says it works, the badge says so too.
    expect(page.get_by_role("status")).to_contain_text("Working:")
    expect(badge).to_have_text("PENDING")
    page.get_by_role("button", name="Cancel run").click()
    expect(badge).to_have_text("CANCELLED", timeout=RUN_TIMEOUT)
    assert tab.console.unexpected() == []


def test_sessions_are_listed_newest_first_with_title_time_and_status(
    tab: Tab, user: Client
) -> None:
    older = user.new_session()
    user.ask(older, "hello there, what can you do with a very long question like this one here?")
    user.wait(older)
    newer = user.new_session()
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    rows = page.locator("li.session-row")
    expect(rows).to_have_count(2)
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.session)") == [newer, older]
    expect(rows.nth(0).locator(".title")).to_have_text("New session")
    expect(rows.nth(0).locator(".badge")).to_have_text("NEW")
    expect(rows.nth(1).locator(".title")).to_have_text(
        "hello there, what can you do with a very long question like…"
    )
    expect(rows.nth(1).locator(".badge")).to_have_text("DONE")
    for row in (rows.nth(0), rows.nth(1)):
        expect(row.locator("time.created")).to_have_text(re.compile(r"^created "))
        assert row.locator("time.created").get_attribute("datetime")
    tab.shot("sessions-titled")
    assert tab.console.unexpected() == []
