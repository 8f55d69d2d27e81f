"""Contract v1's HTTP behaviour through a front, over fakes: the tests of
tests/execapi/test_http_contract.py, unchanged, against a front and two nodes on loopback.

Each node is the whole app on the fake backend served by uvicorn in this process; the front is
the whole app with the fleet role, reached through TestClient. test_conformance.py runs the
tests of real execution through a real fleet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import tests.execapi.test_http_contract as http_contract
from tests.execapi.conftest import contract, session_id, spec
from tests.fakeapp import FakeApp
from tests.fleet.support import NODE_LIMITS, TOKEN

__all__ = ["contract", "session_id", "spec"]  # the suite's fixtures, used here too

globals().update({k: v for k, v in vars(http_contract).items() if k.startswith("test_")})


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with contextlib.ExitStack() as stack:
        nodes = []
        for i in range(2):
            name = f"node-{i}"
            node = FakeApp(role="node", fleet_token=TOKEN, fleet_node_name=name, **NODE_LIMITS)
            nodes.append(f"{name}={stack.enter_context(node.serving())}")
        settings: dict[str, Any] = {
            "role": "front",
            "fleet_token": TOKEN,
            "fleet_nodes": ",".join(nodes),
            "interpreter_api": "off",
            "exec_timeout_max": 30,
            "exec_timeout_default": 30,
            "fleet_refresh_seconds": 0.5,
        }
        front = FakeApp(**settings)
        yield stack.enter_context(front.running())
