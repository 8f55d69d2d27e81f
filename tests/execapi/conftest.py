"""Fixtures: a real `sandbank serve` per module, and validators built from the contract itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from tests.support import REPO, Server, data_dir
from tests.tiers import needs

# The repository's own copy of contract v1 (tests/test_contracts.py keeps it equal to the
# user's document when ../shared is beside the checkout).
SPEC_PATH = REPO / "src" / "sandbank" / "execapi" / "contract-v1.yaml"


@pytest.fixture(scope="session")
def spec() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text())
    return doc


class Contract:
    """Validates response bodies against the schemas of contract v1."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def check(self, response: httpx.Response, schema: str) -> Any:
        body = response.json()
        root = {"$ref": f"#/components/schemas/{schema}", "components": self.spec["components"]}
        jsonschema.Draft202012Validator(root).validate(body)
        return body


@pytest.fixture(scope="session")
def contract(spec: dict[str, Any]) -> Contract:
    return Contract(spec)


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    with data_dir() as d:
        srv = Server(
            d, pool_size=1, max_sessions=8, exec_timeout_default=30, exec_timeout_max=30
        ).start()
        try:
            yield srv
        finally:
            srv.stop()


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def session_id(client: httpx.Client) -> Iterator[str]:
    r = client.post("/sessions", json={})
    assert r.status_code == 201, r.text
    sid: str = r.json()["session_id"]
    yield sid
    client.delete(f"/sessions/{sid}")


def run(client: httpx.Client, sid: str, tool: str, **inp: Any) -> dict[str, Any]:
    r = client.post(f"/sessions/{sid}/exec", json={"tool": tool, "input": inp})
    assert r.status_code == 200, r.text
    content: dict[str, Any] = r.json()["result_block"]["content"]
    return content


__all__ = ["Contract", "Path", "run"]
