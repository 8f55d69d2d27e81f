"""The error bodies both APIs promise, including for failures nobody planned."""

from __future__ import annotations

import logging

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from sandbank.errors import AtCapacity
from sandbank.http.errors import EXCEPTION_HANDLERS
from sandbank.sandbox.backends.fork_template import TemplateGone


async def boom(request: Request) -> Response:
    raise RuntimeError("secret internal detail /etc/sandbank/key")


async def full(request: Request) -> Response:
    raise AtCapacity("all busy", retry_after=7)


async def no_template(request: Request) -> Response:
    raise TemplateGone("the fork template is gone")


def app() -> Starlette:
    routes = [Route("/boom", boom), Route("/api/boom", boom), Route("/full", full)]
    routes.append(Route("/no-template", no_template))
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)


def test_an_unexpected_error_is_a_500_with_a_logged_request_id_and_no_exception_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = TestClient(app(), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR):
        r = client.get("/boom")
    assert r.status_code == 500
    detail = r.json()["detail"]
    assert "secret" not in detail and "RuntimeError" not in detail
    request_id = detail.rsplit(" ", 1)[-1]
    assert request_id in caplog.text and "secret internal detail" in caplog.text


def test_under_api_the_same_failure_has_the_interpreter_error_shape() -> None:
    r = TestClient(app(), raise_server_exceptions=False).get("/api/boom")
    body = r.json()
    assert r.status_code == 500 and set(body) == {"message", "error_code", "error_id"}
    assert body["error_code"] == 1000 and "secret" not in body["message"]


def test_at_capacity_carries_retry_after() -> None:
    r = TestClient(app()).get("/full")
    assert r.status_code == 503 and r.headers["retry-after"] == "7"
    assert r.json() == {"detail": "all busy", "code": "at_capacity"}


def test_a_sandbox_that_cannot_start_now_is_a_503_to_retry_not_a_500() -> None:
    """CreateSession's contract has 503 for "no session leased", and no 500."""
    r = TestClient(app()).get("/no-template")
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.json() == {"detail": "the fork template is gone", "code": "sandbox_unavailable"}
