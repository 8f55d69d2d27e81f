"""One error shape per door: the interpreter API's `{message, error_code, error_id}` under /api,
`{detail, code}` (the code-execution contract's `detail`, plus a stable code) everywhere else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from sandbank.app import create_app
from sandbank.errors import error_numbers
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.local import LocalSandboxes
from tests.support import data_dir, settings

TOKEN = "exec-token-0123456789"
CODES = set(error_numbers())


@pytest.fixture(scope="module")
def data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


def client(data: Path, **overrides: Any) -> TestClient:
    configured = settings(
        data, database_url="memory://", storage_url="memory://", exec_tokens=TOKEN, **overrides
    )
    sandboxes = None
    if configured.role != "front":
        sandboxes = LocalSandboxes(configured, FakeBackend(configured))
    app = create_app(configured, sandboxes=sandboxes)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def assert_ours(body: dict[str, Any]) -> None:
    assert set(body) == {"detail", "code"}, body
    assert body["code"] in CODES and isinstance(body["detail"], str) and body["detail"]


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "code"),
    [
        ("GET", "/metrics", {}, 401, "unauthorized"),
        ("GET", "/admin/sessions", {}, 404, "not_found"),
        ("GET", "/no/such/route", {}, 404, "not_found"),
        ("DELETE", "/openapi.json", {}, 405, "method_not_allowed"),
        ("GET", "/ui/no-such-file.js", {}, 404, "not_found"),
        ("GET", "/docs", {"host": "evil.example"}, 421, "misdirected"),
        ("POST", "/sessions", {}, 401, "unauthorized"),  # the code-execution contract's door
        ("POST", f"/sessions/{'0' * 30}/exec", {"authorization": f"Bearer {TOKEN}"}, 404,
         "session_not_found"),
    ],
)  # fmt: skip
def test_every_error_outside_the_interpreter_api_is_detail_and_code(
    data: Path, method: str, path: str, headers: dict[str, str], status: int, code: str
) -> None:
    r = client(data).request(method, path, headers=headers, json={} if method == "POST" else None)
    assert r.status_code == status, r.text
    assert_ours(r.json())
    assert r.json()["code"] == code


def test_under_the_interpreter_api_errors_keep_its_contracts_shape(data: Path) -> None:
    r = client(data).get("/api/sessions")
    assert r.status_code == 403
    assert set(r.json()) == {"message", "error_code", "error_id"}
    assert r.json()["error_code"] == error_numbers()["forbidden"]


def test_a_fleet_nodes_refusals_have_the_same_shape(data: Path) -> None:
    node = client(data, role="node", fleet_token="f" * 32)
    r = node.post("/sessions", json={})
    assert r.status_code == 401
    assert r.json() == {
        "detail": "this is a fleet node: only the fleet's fronts may call it",
        "code": "unauthorized",
    }
    assert node.get("/metrics").status_code == 401  # the fleet token guards it too
    scraper = client(data, role="node", fleet_token="f" * 32, metrics_token="m" * 16)
    assert scraper.get("/metrics").json()["code"] == "unauthorized"
    ok = scraper.get("/metrics", headers={"authorization": "Bearer " + "m" * 16})
    assert ok.status_code == 200 and "sandbank_sessions" in ok.text
    refused = scraper.get("/metrics", headers={"authorization": "Bearer " + "f" * 32})
    assert refused.status_code == 401  # the fleet token is not the scraper's


def test_a_metrics_token_lets_a_scraper_in_without_an_exec_token(data: Path) -> None:
    served = client(data, metrics_token="m" * 16)
    assert served.get("/metrics").status_code == 401
    assert (
        served.get("/metrics", headers={"authorization": "Bearer " + "m" * 16}).status_code == 200
    )
    assert served.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert (
        served.post("/sessions", headers={"authorization": "Bearer " + "m" * 16}).status_code == 401
    )
