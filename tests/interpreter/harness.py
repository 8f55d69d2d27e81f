"""A real `sandbank serve` in a subprocess, the `sandbank` admin commands, and an API client."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.postgres import free_port

SANDBANK = str(Path(sys.executable).with_name("sandbank"))
RUNTIME_DIR = os.environ.get("SANDBANK_TEST_RUNTIME_DIR", "/work/main/.runtime")
# Small sandboxes on a shared 2-core machine; the model endpoint may only be on loopback.
BASE_ENV = {
    "SANDBANK_RUNTIME_DIR": RUNTIME_DIR,
    "SANDBANK_UID_LOCK_DIR": "/tmp/sandbank-uids-api",
    "SANDBANK_MEMORY_LIMIT_MB": "256",
    "SANDBANK_DISK_LIMIT_MB": "16",
    "SANDBANK_POOL_SIZE": "1",
    "SANDBANK_POOL_PREIMPORT": "false",
    "SANDBANK_LLM_OFFLINE": "1",
    "SANDBANK_LOG_LEVEL": "warning",
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


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    return {**env, **BASE_ENV, **extra}


class Server:
    """One `sandbank serve` process; `restart` starts a new one on the same data directory."""

    def __init__(self, data: Path, env: dict[str, str], ready: str = "/api/openapi.json") -> None:
        self.data = data
        self.ready = ready
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = _env(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data / "server.log"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [SANDBANK, "serve", "--port", str(self.port), "--data-dir", str(self.data)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"sandbank serve exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + self.ready, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail(f"sandbank serve did not start: {self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def cli(self, *args: str) -> str:
        """Run `sandbank ARGS --data-dir DATA` with the server's settings; its output."""
        done = subprocess.run(
            [SANDBANK, *args, "--data-dir", str(self.data)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

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
