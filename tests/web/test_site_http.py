"""The page's HTTP side over fakes: its config and the API reference, with their policies. The
app runs in-process (tests/fakeapp.py); the browser tests of tests/web keep what the page does.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fakeapp import FakeApp
from tests.web.conftest import TRUSTED_HEADER


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeApp]:
    made = FakeApp(trusted_user_header=TRUSTED_HEADER, trusted_proxies="127.0.0.1/32")
    with made.running():
        yield made


@pytest.fixture(scope="module")
def client(fake: FakeApp) -> httpx.Client:
    assert fake.http is not None
    return fake.http


def test_the_reference_is_served_with_the_pages_policy(client: httpx.Client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "ui/reference.js" in page.text


def test_the_config_tells_a_proxied_user_apart(fake: FakeApp, client: httpx.Client) -> None:
    name, _ = fake.new_user()
    alone = client.get("/ui/config.json").json()
    assistant = alone.pop("assistant")
    assert alone == {
        "sign_in": True,
        "session_ttl_seconds": 604800,
        "documents": ["openapi.json", "api/openapi.json"],
    }
    assert assistant["available"] is True and assistant["message"] is None
    proxied = client.get("/ui/config.json", headers={TRUSTED_HEADER: name})
    assert proxied.json()["sign_in"] is False
    assert "default-src 'none'" in proxied.headers["content-security-policy"]
