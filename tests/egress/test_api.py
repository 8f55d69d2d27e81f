"""CreateSession's `network` hint on a real `sandbank serve`: clamped, never widened, validated."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.egress.upstream import Upstream
from tests.support import Server, data_dir
from tests.tiers import needs


@pytest.fixture(scope="module")
def web() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


@pytest.fixture(scope="module")
@needs("root")
def client(web: Upstream) -> Iterator[httpx.Client]:
    p = web.port
    with data_dir() as d:
        srv = Server(
            d,
            egress_allow=f"allowed.test:{p},127.0.0.1:{p}",
            egress_allow_max=f"allowed.test:*,*.corp.test:443,127.0.0.1:{p}",
            egress_test_hosts="allowed.test=127.0.0.1,evil.test=127.0.0.1",
        ).start()
        try:
            with srv.client() as c:
                yield c
        finally:
            srv.stop()


def run(client: httpx.Client, sid: str, command: str) -> str:
    r = client.post(
        f"/sessions/{sid}/exec",
        json={"tool": "bash_code_execution", "input": {"command": command}},
    )
    r.raise_for_status()
    return str(r.json()["result_block"]["content"]["stdout"])


def test_without_a_hint_a_session_gets_the_operators_policy(
    client: httpx.Client, web: Upstream
) -> None:
    r = client.post("/sessions", json={})
    assert r.status_code == 201
    body = r.json()
    assert body["network"] == {"allow": [f"allowed.test:{web.port}", f"127.0.0.1:{web.port}"]}
    try:
        out = run(client, body["session_id"], f"curl -sS http://allowed.test:{web.port}/api")
        assert out.startswith("hello from upstream /api")
    finally:
        client.delete(f"/sessions/{body['session_id']}")


def test_a_hint_is_clamped_to_the_ceiling_and_enforced(client: httpx.Client, web: Upstream) -> None:
    hint = ["x.corp.test:443", "evil.test:*", f"evil.test:{web.port}", "*.test:443",
            "allowed.test:8443", "10.0.0.0/8:443"]  # fmt: skip
    r = client.post("/sessions", json={"network": {"allow": hint}})
    assert r.status_code == 201
    sid = r.json()["session_id"]
    try:
        assert r.json()["network"] == {"allow": ["x.corp.test:443", "allowed.test:8443"]}
        out = run(
            client,
            sid,
            f"curl -sS -o /dev/null -w '%{{http_code}} ' http://evil.test:{web.port}/; "
            f"curl -sS -o /dev/null -w '%{{http_code}}' http://allowed.test:{web.port}/",
        )
        assert out == "403 403"
    finally:
        client.delete(f"/sessions/{sid}")


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
