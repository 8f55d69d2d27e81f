"""Logs and metrics: a real server's at debug level, JSON lines with request ids and no secret;
control characters in a client's path never forging a line (over fakes, with this process's log
set up as the server's). A failing model's log line and count are tested over fakes in
test_time_and_files.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from collections.abc import Iterator
from unittest import mock

import httpx
import pytest

from sandbank import logs
from sandbank.config import Settings
from tests.fakeapp import FakeApp
from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import openai_env, running

EXEC_TOKEN = "canary-exec-token-5f1e"
LLM_KEY = "canary-llm-key-77a0"
SIGNING_KEY = "canary-signing-key-0c3b"
ADMIN_TOKEN = "canary-admin-token-9d2e"


def test_json_logs_carry_request_ids_and_no_secret(llm: FakeLLM, machine: None) -> None:
    env = {
        **openai_env(llm.url),
        "SANDBANK_LLM_API_KEY": LLM_KEY,
        "SANDBANK_EXEC_TOKENS": EXEC_TOKEN,
        "SANDBANK_SIGNING_KEY": SIGNING_KEY,
        "SANDBANK_ADMIN_TOKEN": ADMIN_TOKEN,
        "SANDBANK_LOG_LEVEL": "debug",
        "SANDBANK_LOG_FORMAT": "json",
    }
    with running(env) as server:
        with server.new_user() as user:
            sid = user.new_session()
            assert user.upload(sid, "data.csv", b"name,value\na,1\n").status_code == 204
            user.ask(sid, "Make a report on data.csv")
            assert user.wait(sid)["status"] == "DONE"
            link = user.ok("GET", f"/api/sessions/{sid}/files/download?filename=data.csv")
            assert httpx.get(link["url"]).status_code == 200
            secrets_used = [
                *(user.key, EXEC_TOKEN, LLM_KEY, SIGNING_KEY, ADMIN_TOKEN),
                link["url"].split("=")[-1],  # the download URL's signature
            ]
        auth = {"Authorization": f"Bearer {EXEC_TOKEN}"}
        with httpx.Client(base_url=server.url, headers=auth) as client:
            created = client.post("/sessions", json={}, headers={"X-Request-ID": "trace-me-1"})
            assert created.headers["x-request-id"] == "trace-me-1"
            assert httpx.get(server.url + "/sessions", headers={"Authorization": "Bearer no"})
            metrics = client.get("/metrics").text
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            assert client.get("/admin/sessions", headers=admin).status_code == 200
        assert 'sandbank_model_calls_total{outcome="ok"}' in metrics
        assert 'sandbank_agent_runs_total{outcome="done"}' in metrics
        assert "sandbank_agent_steps_count" in metrics
        assert 'sandbank_model_tokens_total{direction="in"}' in metrics
        log = server.log.read_text()

    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert lines and len(lines) == len([x for x in log.splitlines() if x.strip()])
    access = [x for x in lines if x["logger"] == "sandbank.access"]
    assert any(
        x["request_id"] == "trace-me-1" and "POST /sessions 201" in x["message"] for x in access
    )
    assert all(x["request_id"] != "-" for x in access)
    mine = [x for x in access if f"/api/sessions/{sid}" in x["message"]]
    assert mine and all(x.get("session_id") == sid for x in mine)
    assert len({x["request_id"] for x in access}) == len(access)  # one line per request
    assert any(x["message"].startswith("sandbank 0.1.0: single server on http://") for x in lines)
    for secret in secrets_used:
        assert secret not in log, "a secret reached the log"
        assert secret not in metrics, "a secret reached the metrics"


# A client's path that, written raw, would end the access line and forge another one (and
# clear an operator's terminal).
FORGED = "2024-01-01 00:00:00,000 INFO sandbank.access [0]: GET /admin/sessions 200 1.0 ms"
HOSTILE_PATHS = [
    "/api/nothing%0a" + FORGED.replace(" ", "%20"),
    "/api/nothing%0d%0a" + FORGED.replace(" ", "%20"),
    "/nothing%1b%5b2J%e2%80%a8" + FORGED.replace(" ", "%20") + "%c2%85x",
]


def _send_raw(port: int, path: str) -> bytes:
    """The request as a hostile client writes it (httpx would normalise the path)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        return conn.recv(65536)


def _after_access_lines(log: io.StringIO, count: int) -> str:
    """The log once it has `count` access lines of 404s (each is written after its answer)."""
    deadline = time.monotonic() + 10
    while True:
        text = log.getvalue()
        if text.count(" 404 ") >= count or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


@contextlib.contextmanager
def process_log(log_format: str) -> Iterator[io.StringIO]:
    """This process's log set up as `sandbank serve` sets it up (logs.setup), written into a
    buffer; the test run's own logging given back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in logs.QUIET}
    out = io.StringIO()
    with mock.patch("sys.stderr", out):
        logs.setup(Settings(log_level="info", log_format=log_format))
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, was in quiet.items():
            logging.getLogger(name).setLevel(was)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_control_characters_a_client_puts_in_a_path_never_forge_a_log_line(
    log_format: str,
) -> None:
    """Over the app on fakes, served on loopback in this process (tests/fakeapp.py)."""
    with process_log(log_format) as out, FakeApp(log_level="info").serving() as url:
        port = int(url.rsplit(":", 1)[1])
        for path in HOSTILE_PATHS:
            assert _send_raw(port, path).startswith(b"HTTP/1.1 404")
        log = _after_access_lines(out, len(HOSTILE_PATHS))
    lines = log.splitlines()
    assert not any(line.startswith(FORGED) for line in lines), log
    assert "\x1b" not in log and "\u2028" not in log and "\x85" not in log
    if log_format == "text":
        # Every line is a record of its own (a timestamp first), the escapes on its line.
        assert all(line[:4].isdigit() for line in lines if line.strip()), log
        assert f"GET /api/nothing\\x0a{FORGED} 404" in log
        assert f"GET /api/nothing\\x0d\\x0a{FORGED} 404" in log
        assert f"GET /nothing\\x1b[2J\\u2028{FORGED}\\x85x 404" in log
    else:
        records = [json.loads(line) for line in lines if line.strip()]
        access = [r for r in records if r["logger"] == "sandbank.access"]
        paths = {r["path"] for r in access if r["status"] == 404 and r["method"] == "GET"}
        assert paths == {
            f"/api/nothing\n{FORGED}",
            f"/api/nothing\r\n{FORGED}",
            f"/nothing\x1b[2J\u2028{FORGED}\x85x",
        }
