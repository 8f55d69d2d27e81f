"""Answers naming files in the interpreter spec client's tags, as the web page shows them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from playwright.sync_api import expect

from tests.interpreter.harness import Client
from tests.web.conftest import PROBE, Tab
from tests.web.test_ui import CSV, RUN_TIMEOUT, ask, open_new_session, sign_in, upload, wait_done


def test_png_tags_show_the_image_and_other_tags_download_the_file(tab: Tab, user: Client) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    sign_in(page, user.key)
    open_new_session(page)
    upload(page, "data.csv", CSV)
    expect(page.locator("button.download[data-name='data.csv']")).to_be_visible()
    ask(page, "Plot data.csv with plotly")
    # A new session is DONE already: wait for the answer, then for the page to settle.
    answer = page.locator("li.msg.assistant:not(.internal) .markdown").last
    expect(answer).to_contain_text("The values by name", timeout=RUN_TIMEOUT)
    wait_done(page)

    chart = answer.get_by_role("img", name="figure_1.png")
    expect(chart).to_have_attribute("src", re.compile(r"^blob:"))
    page.wait_for_function(
        "img => img.complete && img.naturalWidth > 100", arg=chart.element_handle()
    )
    expect(answer.locator("code")).to_have_text("<png>figure_1.png</png>")  # code stays text
    expect(answer.get_by_role("link", name="summary.md (Markdown file)")).to_be_visible()
    with page.expect_download() as download:
        answer.get_by_role("link", name="plotly_1.json (Plotly figure, JSON)").click()
    assert download.value.suggested_filename == "plotly_1.json"
    figure = json.loads(Path(download.value.path()).read_text())
    assert figure["data"][0]["type"] == "bar"
    tab.shot("session-tags")
    assert tab.console.unexpected(PROBE) == []
