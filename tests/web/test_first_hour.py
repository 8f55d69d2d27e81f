"""The page as a new user first meets it: titles and a list of chats, files with the same name,
deleting files, one file per chart, pandas tables without a console error, and an assistant that
cannot be reached said at once. What the API alone answers (refused renames, the unreachable
model's 503, a deleted upload gone for the code) is tested over fakes in tests/interpreter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.interpreter.harness import Client, Server, running
from tests.support import free_port
from tests.tiers import needs
from tests.web.conftest import Console, Tab
from tests.web.test_ui import CSV, ask, open_new_session, sign_in, upload, wait_done


def test_a_session_is_titled_by_its_first_question_or_its_name_and_chats_are_listed(
    tab: Tab, user: Client
) -> None:
    older = user.new_session()
    user.ask(older, "hello, what can you do?")
    user.wait(older)
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    sid = open_new_session(page)
    heading = page.locator(".title-row h1")
    expect(heading).to_have_text("New session")
    chats = page.get_by_role("navigation", name="Your sessions")
    expect(chats.get_by_role("link")).to_have_text(["New session", "hello, what can you do?"])
    expect(chats.locator("a[aria-current=page]")).to_have_text("New session")
    ask(page, "Say hello to the team")
    expect(heading).to_have_text("Say hello to the team")
    expect(page).to_have_title("Say hello to the team · Sandbank")
    expect(chats.locator("a[aria-current=page]")).to_have_text("Say hello to the team")
    wait_done(page)

    page.get_by_role("button", name="Rename").click()
    page.get_by_label("Session name").fill("Team greeting")
    page.get_by_role("button", name="Save").click()
    expect(heading).to_have_text("Team greeting")
    expect(page).to_have_title("Team greeting · Sandbank")
    assert user.ok("GET", f"/api/sessions/{sid}")["title"] == "Team greeting"
    tab.shot("session-titled")

    chats.get_by_role("link", name="hello, what can you do?").click()  # back to an earlier one
    expect(heading).to_have_text("hello, what can you do?")
    expect(page.locator("li.msg.user")).to_have_text(["hello, what can you do?"])
    page.get_by_role("link", name="← All sessions").click()
    expect(page).to_have_title("Sandbank")
    rows = page.locator("li.session-row .title")
    expect(rows).to_have_text(["Team greeting", "hello, what can you do?"])


def test_an_existing_name_is_asked_about_and_files_can_be_deleted(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    sid = open_new_session(page)
    upload(page, "data.csv", CSV)
    expect(page.locator("button.download[data-name='data.csv']")).to_be_visible()

    upload(page, "data.csv", b"name,value\nz,9\n")
    conflict = page.locator("li.upload.conflict")
    expect(conflict).to_contain_text("data.csv is already in this session.")
    tab.shot("upload-conflict")
    conflict.get_by_role("button", name="Keep both (as data-2.csv)").click()
    expect(page.locator("button.download[data-name='data-2.csv']")).to_be_visible()
    assert [f["filename"] for f in user.ok("GET", f"/api/sessions/{sid}/files")] == [
        "data-2.csv",
        "data.csv",
    ]

    upload(page, "data.csv", b"name,value\nq,1\n")
    conflict.get_by_role("button", name="Don't upload").click()
    expect(conflict).to_have_count(0)
    upload(page, "data.csv", b"name,value\nq,1\n")
    conflict.get_by_role("button", name="Replace").click()
    expect(page.locator("li.file[data-file='data.csv']")).to_contain_text("15 B")
    expect(page.locator("li.file")).to_have_count(2)

    row = page.locator("li.file[data-file='data-2.csv']")
    row.get_by_role("button", name="Delete data-2.csv").click()
    row.get_by_role("button", name="Delete data-2.csv").click()  # the second click confirms
    expect(page.locator("li.file")).to_have_count(1)
    assert [f["filename"] for f in user.ok("GET", f"/api/sessions/{sid}/files")] == ["data.csv"]
    missing = user.http.get(
        f"/api/sessions/{sid}/files/download", params={"filename": "data-2.csv"}
    )
    assert missing.status_code == 404


def test_a_chart_the_code_saved_is_listed_once(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "savefig a chart")
    wait_done(page)
    expect(page.locator("li.file")).to_have_count(1)
    expect(page.locator("button.download[data-name='chart.png']")).to_be_visible()


def test_a_pandas_table_is_shown_without_a_policy_error(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "Show me the pandas table")
    wait_done(page)
    table = page.locator("li.msg.displays .display-html table").first
    expect(table.locator("td")).to_have_text(["north", "10", "south", "32"])
    tab.shot("pandas-table")
    # The tab fixture fails the test on any console error: pandas' style="" attributes and its
    # <style> must not reach the parser under the page's policy.


@pytest.fixture(scope="module")
@needs("root")
def modelless() -> Iterator[Server]:
    """A server whose model endpoint does not answer (a closed loopback port)."""
    env = {
        "SANDBANK_LLM_MODEL": "openai:gpt-fake",
        "SANDBANK_LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "SANDBANK_LLM_API_KEY": "fake-key",
    }
    with running(env) as server:
        yield server


def test_an_unreachable_model_is_said_at_once_with_what_to_set(
    browser: Browser, modelless: Server
) -> None:
    context = browser.new_context()
    page = context.new_page()
    console = Console()
    console.watch(page)
    with modelless.new_user() as user:
        started = time.monotonic()
        page.goto(modelless.url + "/")
        notice = page.get_by_role("alert").filter(has_text="model cannot be reached")
        expect(notice).to_be_visible(timeout=2000)
        assert time.monotonic() - started < 2.5
        expect(notice).to_contain_text("SANDBANK_LLM_BASE_URL")
        sign_in(page, user.key)
        expect(notice).to_be_visible()
        open_new_session(page)
        asked = time.monotonic()
        ask(page, "hello")
        refusal = page.locator("p.alert")
        expect(refusal).to_have_text(
            "Not sent: the assistant cannot answer now (see above). Your question is kept here.",
            timeout=2000,
        )
        assert time.monotonic() - asked < 2.5
        expect(page.get_by_label("Question")).to_be_enabled()
        expect(page.get_by_label("Question")).to_have_value("hello")
        Tab(page, console, modelless.url).shot("model-unreachable")
        sid = page.url.rsplit("/", 1)[-1]
        assert user.ok("GET", f"/api/sessions/{sid}/messages") == []  # nothing stored
    context.close()
    assert console.unexpected((403, "/api/sessions"), (503, "/api/sessions/")) == []
