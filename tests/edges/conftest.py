"""One real `sandbank serve` per module, with the edge's bounds made small enough to reach."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Server, data_dir

TOKEN = "edge-test-token-31c9"
EDGE = {
    "max_connections": 60,
    "max_connections_per_client": 30,
    "head_timeout_seconds": 1.5,
    "keepalive_timeout_seconds": 1.0,
    "exec_tokens": TOKEN,
}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with data_dir() as data:
        running = Server(data, **EDGE).start()
        try:
            yield running
        finally:
            running.stop()
