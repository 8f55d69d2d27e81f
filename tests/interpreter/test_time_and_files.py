"""The interpreter API over fakes across time and files: no model, a failing model, expiry,
file metrics, a deleted upload.

The app runs in-process (tests/fakeapp.py); test_lifecycle.py keeps, on real servers, what
needs a process (restart recovery, SIGTERM).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from tests.agent.fake_llm_servers import openai_error, serve
from tests.fakeapp import FakeApp, canned
from tests.interpreter.harness import Client, assert_error


def user(fake: FakeApp) -> Client:
    """A user of the running app, with its own client (harness.Client's API over the app)."""
    name, key = fake.new_user()
    client = Client.__new__(Client)
    client.url, client.key, client.name = "", key, name
    assert fake.http is not None
    client.http = fake.http
    client.http.headers["Authorization"] = f"Bearer {key}"
    return client


def upload(fake: FakeApp, client: Client, sid: str, filename: str, content: bytes) -> int:
    form = client.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": filename})
    with fake.client() as anonymous:
        files = {"file": (filename, content)}
        return anonymous.post(form["url"], data=form["fields"], files=files).status_code


def test_without_a_model_a_question_is_refused_before_anything_is_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeApp(configured_model=True)
    with caplog.at_level(logging.WARNING), fake.running():
        client = user(fake)
        sid = client.new_session()
        response = client.http.post(f"/api/sessions/{sid}/messages", json={"content": "hi"})
        message = assert_error(response, 503, 1101)
        # In words, with what the operator must set (the details are in the log too).
        assert message.startswith("The assistant is off: no model is configured. The operator")
        assert "SANDBANK_LLM_MODEL" in message and "SANDBANK_LLM_MODEL" in caplog.text
        assert client.ok("GET", f"/api/sessions/{sid}/messages") == []
        assert client.ok("GET", f"/api/sessions/{sid}")["status"] == "DONE"


def test_expired_sessions_are_deleted_with_their_files() -> None:
    fake = FakeApp(session_ttl_seconds=1, session_expiry_interval_seconds=0.2)
    with fake.running():
        client = user(fake)
        sid = client.new_session()
        assert upload(fake, client, sid, "old.csv", b"1\n") == 204
        objects = list((fake.dir / "objects").rglob("old.csv"))
        assert objects
        deadline = time.monotonic() + 15
        while client.http.get(f"/api/sessions/{sid}").status_code == 200:
            assert time.monotonic() < deadline, "the session did not expire"
            time.sleep(0.1)
        assert_error(client.http.get(f"/api/sessions/{sid}"), 404)
        assert not any(p.exists() for p in objects)


def test_uploads_produced_files_and_downloads_are_counted() -> None:
    fake = FakeApp()
    with fake.running():
        carol = user(fake)
        sid = carol.new_session()
        assert upload(fake, carol, sid, "notes.txt", b"n" * 1000) == 204
        carol.ask(sid, "Write a page")
        assert carol.wait(sid)["status"] == "DONE"
        files = {f["filename"]: f["size"] for f in carol.ok("GET", f"/api/sessions/{sid}/files")}
        carol.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "page.html"})
        text = carol.http.get("/metrics").text
    got = {
        (s.name, s.labels.get("op", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("sandbank_file")
    }
    assert got[("sandbank_files_total", "upload")] == 1
    assert got[("sandbank_file_bytes_total", "upload")] == 1000
    assert got[("sandbank_files_total", "produced")] == 1
    assert got[("sandbank_file_bytes_total", "produced")] == files["page.html"] > 0
    assert got[("sandbank_files_total", "download")] == 1
    assert got[("sandbank_file_bytes_total", "download")] == files["page.html"]


LLM_KEY = "canary-llm-key-77a0"


def test_a_model_failure_is_logged_for_the_operator_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve([openai_error(500)]) as failing:
        fake = FakeApp(
            configured_model=True,
            llm_model="openai:gpt-fake",
            llm_base_url=failing.url + "/v1",
            llm_api_key=LLM_KEY,
            llm_max_retries=0,
        )
        with caplog.at_level(logging.INFO), fake.running():
            client = user(fake)
            sid = client.new_session()
            client.ask(sid, "hello")
            session = client.wait(sid)
            metrics = client.http.get("/metrics").text
    log = caplog.text
    assert session["status"] == "ERROR"
    assert f"model request failed (openai:gpt-fake at {failing.url}/v1)" in log
    assert "HTTP 500" in log
    assert 'sandbank_model_calls_total{outcome="error"} 1.0' in metrics
    assert LLM_KEY not in log and LLM_KEY not in metrics


async def reading_data(call: ToolCall, workspace: Path) -> ExecResult:
    """`chart` reads data.csv, failing as pandas does where the sandbox has none; the rest is
    canned."""
    missing = not (workspace / "data.csv").is_file()
    if isinstance(call, PythonCall) and call.code == "chart" and missing:
        trace = "Traceback (most recent call last):\nFileNotFoundError: data.csv\n"
        return ExecResult(stderr=trace, return_code=1)
    return await canned(call, workspace)


def test_a_deleted_upload_is_gone_for_the_code_too() -> None:
    fake = FakeApp(reading_data)
    with fake.running():
        client = user(fake)
        sid = client.new_session()
        assert upload(fake, client, sid, "data.csv", b"name,value\na,1\n") == 204
        client.ask(sid, "chart please")  # reads data.csv, which its sandbox now holds
        assert client.wait(sid)["status"] == "DONE"
        first = client.ok("GET", f"/api/sessions/{sid}/messages")
        assert "FileNotFoundError" not in first[-1]["content"]
        assert (
            client.ok("DELETE", f"/api/sessions/{sid}/files", params={"filename": "data.csv"}) == {}
        )
        again = client.ask(sid, "chart please")
        client.wait(sid)
        after = client.ok(
            "GET", f"/api/sessions/{sid}/messages", params={"from": again["timestamp"]}
        )
    answer = [m["content"] for m in after if m["role"] == "assistant" and not m["internal"]]
    assert "FileNotFoundError" in answer[-1]  # the sandbox no longer holds the deleted file
