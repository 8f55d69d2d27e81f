"""CreateSession's `network` hint over fakes: clamped to the ceiling, never widened, validated,
documented. The app runs in-process on the fake backend (tests/fakeapp.py); test_api.py keeps,
on a real server, that the policy in force is what the sandbox's traffic meets.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fakeapp import FakeApp

PORT = 8123  # an upstream's port, as the real-server test has one


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    p = PORT
    fake = FakeApp(
        egress_allow=f"allowed.test:{p},127.0.0.1:{p}",
        egress_allow_max=f"allowed.test:*,*.corp.test:443,127.0.0.1:{p}",
        egress_test_hosts="allowed.test=127.0.0.1,evil.test=127.0.0.1",
    )
    with fake.running() as http:
        yield http


def test_without_a_hint_a_session_gets_the_operators_policy(client: httpx.Client) -> None:
    r = client.post("/sessions", json={})
    assert r.status_code == 201
    assert r.json()["network"] == {"allow": [f"allowed.test:{PORT}", f"127.0.0.1:{PORT}"]}
    client.delete(f"/sessions/{r.json()['session_id']}")


def test_a_hint_is_clamped_to_the_ceiling(client: httpx.Client) -> None:
    hint = ["x.corp.test:443", "evil.test:*", f"evil.test:{PORT}", "*.test:443",
            "allowed.test:8443", "10.0.0.0/8:443"]  # fmt: skip
    r = client.post("/sessions", json={"network": {"allow": hint}})
    assert r.status_code == 201
    assert r.json()["network"] == {"allow": ["x.corp.test:443", "allowed.test:8443"]}
    client.delete(f"/sessions/{r.json()['session_id']}")


def test_none_turns_the_network_off(client: httpx.Client) -> None:
    r = client.post("/sessions", json={"network": "none"})
    assert r.status_code == 201 and r.json()["network"] == "none"
    client.delete(f"/sessions/{r.json()['session_id']}")


@pytest.mark.parametrize(
    ("hint", "message"),
    [
        (5, "network must be"),
        ({"allow": "pypi.org:443"}, "network must be"),
        ({"allow": [1]}, "network must be"),
        ({"allow": ["pypi.org"]}, "network.allow: 'pypi.org': expected HOST:PORT"),
        ({"allow": ["a.com:1"] * 101}, "more than 100 entries"),
    ],
)
def test_a_malformed_hint_is_422_naming_it(
    client: httpx.Client, hint: object, message: str
) -> None:
    r = client.post("/sessions", json={"network": hint})
    assert r.status_code == 422 and message in r.json()["detail"], r.text


def test_the_hint_and_the_policy_in_force_are_documented_additions(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert "network" in schemas["CreateSessionRequest"]["properties"]
    assert "network" in schemas["SessionHandle"]["properties"]
    added = doc["info"]["x-sandbank-additions"]
    assert "components.schemas.CreateSessionRequest.properties.network" in added
