"""A real server, or a fleet's front over two nodes, for the real E2B SDKs to drive.

Both SDKs find it through their own settings: `E2B_API_URL` and `E2B_SANDBOX_URL` name the same
listener, `E2B_API_KEY` is one of its code-execution tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fleet.support import LoopbackFleet, scratch_dir
from tests.support import Server, data_dir
from tests.tiers import param

KEY_A, KEY_B = "e2b-test-key-a-0123456789", "e2b-test-key-b-0123456789"
# Room for the data stack's first imports in a sandbox (the suite's default is smaller).
LIMITS: dict[str, Any] = {
    "exec_tokens": f"{KEY_A},{KEY_B}",
    "memory_limit_mb": 384,
    "pids_limit": 128,
}


@dataclass(frozen=True)
class Target:
    """Where the SDKs are pointed: a single server or a fleet's front."""

    kind: str
    url: str

    def env(self, key: str = KEY_A) -> dict[str, str]:
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": key}


@pytest.fixture(scope="module", params=[param("server", "root"), param("fleet", "root")])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "server":
        with data_dir() as d:
            server = Server(d, pool_size=1, **LIMITS).start()
            try:
                yield Target("server", server.base_url)
            finally:
                server.stop()
        return
    with scratch_dir() as root:
        fleet = LoopbackFleet(
            root, nodes=2, node_overrides={"memory_limit_mb": 384, "pids_limit": 128}, **LIMITS
        ).start()
        try:
            yield Target("fleet", fleet.base_url)
        finally:
            fleet.stop()


@pytest.fixture(scope="module")
def sdk_env(target: Target) -> Iterator[Target]:
    """The Python SDK's settings, for the module's tests."""
    saved = {k: os.environ.get(k) for k in target.env()}
    os.environ.update(target.env())
    try:
        yield target
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
