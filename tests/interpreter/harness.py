"""A real `sandbank serve` in a subprocess, the `sandbank` admin commands, and an API client."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import support

# Small sandboxes on a shared 2-core machine; the model endpoint may only be on loopback.
DEFAULTS: dict[str, Any] = {
    "memory_limit_mb": 256,
    "pool_size": 1,
    "log_level": "warning",
}


def data_dir() -> Path:
    """A fresh data directory under /tmp (sandbox users must traverse its parents)."""
    path = Path(tempfile.mkdtemp(prefix="sandbank-api-test-"))
    path.chmod(0o711)
    return path


def openai_env(llm_url: str) -> dict[str, str]:
    return {
        "SANDBANK_LLM_MODEL": "openai:gpt-fake",
        "SANDBANK_LLM_BASE_URL": llm_url + "/v1",
        "SANDBANK_LLM_API_KEY": "fake-key",
    }


class Server(support.Server):
    """A server for the interpreter API: ready once /api is, with users made by its CLI."""

    def __init__(self, data: Path, env: dict[str, str], ready: str = "/api/openapi.json") -> None:
        super().__init__(data, env, ready, **DEFAULTS)

    def start(self, timeout: float = 60.0) -> Server:
        try:
            super().start(timeout)
        except RuntimeError as e:
            pytest.fail(str(e))
        return self

    def new_user(self) -> Client:
        name = f"u{uuid.uuid4().hex[:8]}"
        key = self.cli("users", "create", name).strip().splitlines()[-1]
        return Client(self.url, key, name)


@contextmanager
def running(
    env: dict[str, str], data: Path | None = None, ready: str = "/api/openapi.json"
) -> Iterator[Server]:
    server = Server(data or data_dir(), env, ready)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
        log = server.log.read_text()
        shutil.rmtree(server.data, ignore_errors=True)
    assert "Traceback" not in log, log[-5000:]  # every failure was a handled one


class Client:
    """The interpreter API as one user sees it."""

    def __init__(self, url: str, key: str, name: str) -> None:
        self.url = url
        self.key = key
        self.name = name
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        assert response.status_code == 200, response.text
        return response.json()

    def new_session(self) -> str:
        return str(self.ok("POST", "/api/sessions")["session_id"])

    def upload(self, sid: str, filename: str, content: bytes) -> httpx.Response:
        form = self.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": filename})
        return httpx.post(form["url"], data=form["fields"], files={"file": (filename, content)})

    def ask(self, sid: str, question: str) -> dict[str, Any]:
        message: dict[str, Any] = self.ok(
            "POST", f"/api/sessions/{sid}/messages", json={"content": question}
        )
        return message

    def wait(self, sid: str, timeout: float = 90) -> dict[str, Any]:
        """Poll the session (as the web client does) until its run has ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            session: dict[str, Any] = self.ok("GET", f"/api/sessions/{sid}")
            if session["status"] != "PENDING":
                return session
            time.sleep(0.25)
        raise AssertionError(f"session {sid} still PENDING after {timeout} s")

    def wait_for_status(self, sid: str, status_message: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            session = self.ok("GET", f"/api/sessions/{sid}")
            if session.get("status_message") == status_message:
                return
            time.sleep(0.1)
        raise AssertionError(f"session {sid} never showed {status_message!r}")

    def wait_for_message(self, sid: str, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in m["content"] for m in self.ok("GET", f"/api/sessions/{sid}/messages")):
                return
            time.sleep(0.25)
        raise AssertionError(f"no message with {text!r} in {timeout} s")


def assert_error(response: httpx.Response, status: int, code: int | None = None) -> str:
    """The spec's error shape: `{message, error_code, error_id}`; returns the message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"message", "error_code", "error_id"}, body
    assert isinstance(body["error_code"], int)
    assert str(uuid.UUID(body["error_id"])) == body["error_id"]
    assert body["message"]
    if code is not None:
        assert body["error_code"] == code, body
    return str(body["message"])


@dataclass
class Received:
    at: float  # seconds since the request was sent
    kind: str  # "" for a comment line
    data: Any
    id: str | None


def follow(client: Client, sid: str, **options: Any) -> list[Received]:
    """Read the whole stream (it must end by itself: the client's timeout is a backstop)."""
    started = time.monotonic()
    received: list[Received] = []
    with client.http.stream("GET", f"/api/sessions/{sid}/events", timeout=30, **options) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in r.iter_lines():
            if line.startswith(":"):
                received.append(Received(time.monotonic() - started, "", None, None))
            elif line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif fields:
                data = json.loads(fields["data"])
                received.append(
                    Received(time.monotonic() - started, fields["event"], data, fields.get("id"))
                )
                fields = {}
    return received


def kinds(received: list[Received]) -> list[str]:
    return [r.kind for r in received]
