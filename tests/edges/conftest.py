"""The server's edge with its bounds made small enough to reach: the app over fakes served on
loopback with the listener `sandbank serve` uses (tests/fakeapp.py), in this process; and one
real `sandbank serve` for what only its own process shows (the memory it holds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakeapp import FakeApp
from tests.support import Server, data_dir
from tests.tiers import needs

TOKEN = "edge-test-token-31c9"
EDGE: dict[str, Any] = {
    "max_connections": 60,
    "max_connections_per_client": 30,
    "head_timeout_seconds": 1.5,
    "keepalive_timeout_seconds": 1.0,
    "exec_tokens": TOKEN,
}


@dataclass(frozen=True)
class Edge:
    """A listener on loopback: its port, and the process serving it."""

    port: int
    pid: int


@pytest.fixture(scope="module")
def server() -> Iterator[Edge]:
    fake = FakeApp(**EDGE)
    with fake.serving() as url:
        yield Edge(int(url.rsplit(":", 1)[1]), os.getpid())


@pytest.fixture(scope="module")
@needs("root")
def real_server() -> Iterator[Edge]:
    with data_dir() as data:
        running = Server(data, **EDGE).start()
        try:
            assert running.proc is not None
            yield Edge(running.port, running.proc.pid)
        finally:
            running.stop()
