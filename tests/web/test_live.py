"""The page live: the model's answer shown as it is written (the event stream), polling when the
stream is refused, and display bundles of tool calls shown inert."""

from __future__ import annotations

import re

from playwright.sync_api import Route, expect

from tests.interpreter.fake_llm import SLOW_ANSWER
from tests.interpreter.harness import Client
from tests.web.conftest import PROBE, Tab
from tests.web.test_ui import ask, open_new_session, sign_in, wait_done


def test_the_answer_appears_as_it_is_written_before_the_run_ends(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "Answer slowly, please")
    draft = page.locator("li.msg.draft")
    expect(draft).to_contain_text("Counting w1", timeout=30_000)
    # Part of the answer is shown while the run is still going.
    assert page.locator(".title-row .badge").inner_text() == "PENDING"
    assert "done." not in draft.inner_text()
    tab.shot("answer-streaming")
    wait_done(page)
    expect(draft).to_have_count(0)  # the stored answer replaced it
    expect(page.locator("li.msg.assistant:not(.internal) .markdown").last).to_have_text(SLOW_ANSWER)
    assert tab.console.unexpected(PROBE) == []


def test_without_the_event_stream_the_page_polls(tab: Tab, user: Client) -> None:
    page = tab.page
    refused: list[str] = []

    def refuse(route: Route) -> None:
        refused.append(route.request.url)
        route.abort()

    page.route(re.compile(r"/api/sessions/[^/]+/events"), refuse)
    tab.allow(0, "/api/sessions/")  # the stream this test cuts off
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "Answer slowly, please")
    wait_done(page)
    expect(page.locator("li.msg.assistant:not(.internal) .markdown").last).to_have_text(SLOW_ANSWER)
    assert len(refused) == 1  # tried once, then polled to the end
    expect(page.locator("li.msg.draft")).to_have_count(0)


def test_a_displayed_table_is_shown_sanitized(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "Display the table")
    wait_done(page)
    shown = page.locator("li.msg.displays")
    expect(shown).to_be_visible()  # shown, though its tool call is internal and hidden
    table = shown.locator(".display-html table")
    expect(table.locator("th")).to_have_text(["name", "value"])
    expect(table.locator("td")).to_have_text(["a", "42"])
    expect(table.locator("td").last).to_have_attribute("colspan", "1")
    expect(shown).to_contain_text("click me")
    inert = "script, style, iframe, a, [onclick], [onerror], img:not([src^='blob:'])"
    expect(shown.locator(inert)).to_have_count(0)
    # table, thead, tr, th, th, tbody, tr, td, td: nothing else survived
    expect(shown.locator(".display-html *")).to_have_count(9)
    expect(shown.locator(".display-html [class], .display-html [border]")).to_have_count(0)
    svg = shown.locator(".display img")
    expect(svg).to_have_count(1)
    expect(svg).to_have_attribute("src", re.compile(r"^blob:"))
    page.wait_for_function(
        "img => img.complete && img.naturalWidth === 40", arg=svg.element_handle()
    )
    expect(shown.locator("svg")).to_have_count(0)  # never inlined as markup
    expect(page.locator("body")).to_be_visible()  # the display's <style> did not apply
    shown.get_by_text("click me").click()
    tab.shot("display-bundles")
    assert page.evaluate("window.__sbPwned") is None
    assert [u for u in tab.console.requests if "outside.invalid" in u] == []
    assert [u for u in tab.console.requests if u.endswith("missing.png")] == []
    assert tab.console.unexpected(PROBE) == []
