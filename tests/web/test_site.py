"""The web UI's routes and headers, without a browser: where the page is served and what it allows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from sandbank.app import create_app
from sandbank.web import csp
from tests.support import data_dir, settings


def client_of(data: Path, **overrides: object) -> TestClient:
    """The app without its lifespan: the page's routes need nothing started."""
    return TestClient(create_app(settings(data, **overrides)), base_url="http://localhost")


@pytest.fixture
def data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


def test_the_page_and_its_files_carry_the_policy(data: Path) -> None:
    client = client_of(data)
    page = client.get("/")
    assert page.status_code == 200 and '<script type="module" src="ui/app.js">' in page.text
    for path in ("/ui/app.js", "/ui/vendor/purify.es.mjs", "/ui/style.css"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert (
            response.headers["content-security-policy"] == page.headers["content-security-policy"]
        )
        assert response.headers["x-content-type-options"] == "nosniff"
    assert client.get("/ui/nothing.js").status_code == 404


def test_the_page_does_not_shadow_the_code_execution_api(data: Path) -> None:
    client = client_of(data)
    assert client.post("/").status_code == 405
    assert client.get("/sessions/x/exec").status_code == 405  # a POST route: not a file
    assert client.get("/elsewhere").json() == {"detail": "Not Found", "code": "not_found"}


def test_the_page_can_be_turned_off(data: Path) -> None:
    client = client_of(data, web_ui="off")
    assert client.get("/").status_code == 404
    assert client.get("/ui/app.js").status_code == 404


def test_uploads_may_go_to_the_object_store_s_origin(data: Path) -> None:
    policy = csp(
        settings(
            data,
            s3_endpoint_url="https://minio.example:9000/",
            web_storage_origins="https://bucket.s3.example, not a url",
        )
    )
    connect = next(d for d in policy.split("; ") if d.startswith("connect-src"))
    assert connect == "connect-src 'self' https://bucket.s3.example https://minio.example:9000"
    assert "img-src 'self' blob:;" in policy  # images still come only from blobs the page made
