"""The web UI in Chromium against a real server and the scripted model, as a user drives it."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from playwright.sync_api import Browser, FilePayload, Page, expect

from tests.interpreter.harness import Client, Server
from tests.web.conftest import PROBE, TRUSTED_HEADER, UPLOAD_CAP, Console, Tab

CSV = b"name,value\na,1\nb,2\nc,39\n"
RUN_TIMEOUT = 60_000  # ms: a sandbox starts, pandas and matplotlib load


def sign_in(page: Page, key: str, remember: bool = False) -> None:
    page.get_by_label("API key").fill(key)
    if remember:
        page.get_by_label("Remember me on this device").check()
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()


def open_new_session(page: Page) -> str:
    page.get_by_role("button", name="New session").click()
    expect(page.get_by_label("Question")).to_be_visible()
    match = re.search(r"#/sessions/([0-9a-f-]{36})$", page.url)
    assert match, page.url
    return match.group(1)


def upload(page: Page, name: str, data: bytes) -> None:
    payload: FilePayload = {"name": name, "mimeType": "text/csv", "buffer": data}
    page.set_input_files("#file-input", files=[payload])


def ask(page: Page, question: str) -> None:
    page.get_by_label("Question").fill(question)
    page.get_by_label("Question").press("Enter")


def wait_done(page: Page) -> None:
    expect(page.locator(".title-row .badge")).to_have_text("DONE", timeout=RUN_TIMEOUT)
    expect(page.get_by_label("Question")).to_be_enabled()


def test_the_page_is_sent_with_a_strict_policy(server: Server) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    for directive in (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' blob:",
        "connect-src 'self'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ):
        assert directive in policy.split("; "), policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # no inline script
    assert " style=" not in page.text and "<style" not in page.text
    script = httpx.get(server.url + "/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "unsafe" not in script.headers["content-security-policy"]


def test_a_whole_session_in_the_browser(tab: Tab, user: Client) -> None:
    """Sign in, create, upload, ask, watch it run, read the answer and its chart, download, delete."""
    page = tab.page
    page.goto(tab.base_url + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    tab.shot("sign-in")
    page.get_by_label("API key").fill("sb_wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That API key was not accepted.")
    sign_in(page, user.key)
    assert page.evaluate("sessionStorage.length") == 1
    assert page.evaluate("localStorage.length") == 0

    sid = open_new_session(page)
    upload(page, "data.csv", CSV)
    expect(page.locator("button.download[data-name='data.csv']")).to_be_visible()
    ask(page, "Make a report on data.csv")
    expect(page.get_by_label("Question")).to_be_disabled()
    expect(page.locator(".title-row .badge")).to_have_text("PENDING")
    expect(page.get_by_role("status")).to_contain_text("Working:")
    expect(page.get_by_role("button", name="Cancel run")).to_be_visible()
    tab.shot("session-running")
    wait_done(page)

    answer = page.locator("li.msg.assistant:not(.internal) .markdown").last
    expect(answer.locator("table td")).to_have_text(["a", "1", "b", "2", "c", "39"])
    chart = answer.get_by_role("img", name="Bar chart of value by name")
    expect(chart).to_have_attribute("src", re.compile(r"^blob:"))
    page.wait_for_function(
        "img => img.complete && img.naturalWidth > 100", arg=chart.element_handle()
    )
    expect(page.locator("li.msg.tool")).to_be_hidden()
    tab.shot("session-answer")

    page.get_by_label(re.compile("Show internal messages")).check()
    tool = page.locator("li.msg.tool details")
    tool.locator("summary").click()
    expect(tool.locator("code.hljs .hljs-keyword").first).to_have_text("import")
    expect(tool.locator("pre.stdout")).to_contain_text("TOTAL 42")
    expect(page.locator("li.msg.trace").first).to_contain_text("Model call 1 (gpt-fake)")
    tab.shot("session-internal")

    with page.expect_download() as download:
        page.locator("button.download[data-name='chart.png']").click()
    path = download.value.path()
    assert download.value.suggested_filename == "chart.png"
    assert Path(path).read_bytes().startswith(b"\x89PNG")

    page.get_by_role("link", name="← All sessions").click()
    row = page.locator(f"li.session-row[data-session='{sid}']")
    expect(row.locator(".badge")).to_have_text("DONE")
    expect(row.locator(".expiry")).to_contain_text("expires in 7 days")
    tab.shot("sessions")
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Confirm delete").click()
    expect(row).to_have_count(0)
    assert user.http.get(f"/api/sessions/{sid}").status_code == 404

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert page.evaluate("sessionStorage.length + localStorage.length") == 0
    assert tab.console.unexpected(PROBE) == []


def test_a_hostile_answer_is_shown_inert(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "Summarize this hostile file")
    wait_done(page)
    answer = page.locator("li.msg.assistant .markdown").last
    expect(answer).to_contain_text("<script>window.__sbPwned = 'script'</script>")
    expect(answer).to_contain_text("an image from outside this session is not shown: tracker")
    expect(answer.locator("img")).to_have_count(0)
    expect(answer.locator("script, [onerror], [onmouseover], a[href^='javascript']")).to_have_count(
        0
    )
    answer.get_by_text("click me").click()
    answer.get_by_text("bold").hover()
    tab.shot("hostile-answer")
    assert page.evaluate("window.__sbPwned") is None
    assert [u for u in tab.console.requests if "outside.invalid" in u] == []
    # A CSP violation would be reported here too: the renderer never even tried.
    assert tab.console.unexpected(PROBE) == []


def test_a_produced_html_file_downloads_instead_of_rendering(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "Write a page")
    wait_done(page)
    here = page.url
    responses: list[dict[str, str]] = []
    page.on(
        "response", lambda r: responses.append(r.headers) if "/api/downloads" in r.url else None
    )
    with page.expect_download() as from_answer:
        page.get_by_role("link", name="the page").click()
    with page.expect_download() as from_list:
        page.locator("button.download[data-name='page.html']").click()
    for download in (from_answer.value, from_list.value):
        assert download.suggested_filename == "page.html"
        assert b"<script>" in Path(download.path()).read_bytes()
    assert page.url == here and len(page.context.pages) == 1
    assert all(h["content-disposition"].startswith("attachment") for h in responses)
    assert page.evaluate("window.__sbPwned") is None
    assert tab.console.unexpected(PROBE) == []


def test_refused_uploads_say_why_and_dropped_files_upload(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    upload(page, "-data.csv", CSV)
    refused = page.locator("li.upload.refused")
    expect(refused).to_contain_text("refused: filename may not start with a dot or a dash")
    upload(page, "big.csv", b"x" * (UPLOAD_CAP + 1))
    expect(refused.nth(1)).to_contain_text("refused: the file is too large")
    tab.shot("uploads-refused")
    refused.first.get_by_role("button", name="Dismiss").click()
    expect(refused).to_have_count(1)
    expect(page.locator(".file-list")).to_have_text("No files yet.")
    dropped = page.evaluate_handle(
        """() => { const d = new DataTransfer();
        d.items.add(new File(["name,value\\na,1\\n"], "dropped.csv", {type: "text/csv"}));
        return d; }"""
    )
    page.locator(".drop").dispatch_event("drop", {"dataTransfer": dropped})
    expect(page.locator("button.download[data-name='dropped.csv']")).to_be_visible()
    assert tab.console.unexpected(PROBE, (400, "/api/sessions/")) == []


def test_a_cancelled_run_keeps_its_call_and_can_be_asked_again(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    ask(page, "sleep for a while")
    page.get_by_label(re.compile("Show internal messages")).check()
    expect(page.locator("li.msg.tool")).to_have_count(0)
    expect(page.get_by_role("status")).to_contain_text("Working: running code")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".title-row .badge")).to_have_text("CANCELLED", timeout=RUN_TIMEOUT)
    status = page.get_by_role("status")
    expect(status).to_have_text("Cancelled.")
    expect(status).not_to_have_class(re.compile(r"\berror\b"))
    # The interrupted call is kept, with its code, and is not shown as a failure.
    tool = page.locator("li.msg.tool details")
    expect(tool.locator("summary")).to_contain_text("interrupted")
    tool.locator("summary").click()
    expect(tool.locator("code")).to_contain_text("time.sleep(300)")
    expect(tool.locator(".stderr")).to_have_count(0)
    tab.shot("session-cancelled")
    expect(page.get_by_label("Question")).to_be_enabled()
    expect(page.get_by_label("Question")).to_have_value("")
    page.get_by_role("button", name="Ask again").click()  # no retyping
    expect(page.locator(".title-row .badge")).to_have_text("PENDING")
    expect(page.locator("li.msg.user")).to_have_count(2)
    expect(page.locator("li.msg.user").last).to_have_text("sleep for a while")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".title-row .badge")).to_have_text("CANCELLED", timeout=RUN_TIMEOUT)
    assert tab.console.unexpected() == []


def test_on_a_phone_with_the_keyboard_alone(browser: Browser, server: Server, user: Client) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True)
    page = context.new_page()
    console = Console()
    console.watch(page)
    tab = Tab(page, console, server.url)
    page.goto(server.url + "/")
    page.get_by_label("API key").wait_for()
    page.keyboard.type(user.key)  # the key field has the focus
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="New session")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Question")).to_be_visible()
    page.get_by_label("Question").focus()
    page.keyboard.type("hello")
    page.keyboard.press("Enter")
    expect(page.locator("li.msg.assistant").last).to_have_text("Hello from the fake model.")
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width  # nothing wider than the screen
    tab.shot("phone-session")
    assert console.unexpected(PROBE) == []
    context.close()


def test_remember_me_keeps_the_key_across_tabs_until_sign_out(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key, remember=True)
    other = page.context.new_page()
    other.goto(tab.base_url + "/")
    expect(other.get_by_role("heading", name="Sessions")).to_be_visible()
    other.get_by_role("button", name="Sign out").click()
    page.reload()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    other.close()


def test_without_remember_me_a_new_tab_asks_again(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    other = page.context.new_page()
    other.goto(tab.base_url + "/")
    expect(other.get_by_role("heading", name="Sign in")).to_be_visible()
    other.close()


def test_behind_a_signing_in_proxy_there_is_no_sign_in(
    browser: Browser, server: Server, user: Client
) -> None:
    context = browser.new_context(extra_http_headers={TRUSTED_HEADER: user.name})
    page = context.new_page()
    console = Console()
    console.watch(page)
    page.goto(server.url + "/")
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()
    open_new_session(page)
    assert page.evaluate("sessionStorage.length + localStorage.length") == 0
    assert console.unexpected() == []
    context.close()
