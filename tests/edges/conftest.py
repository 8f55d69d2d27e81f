"""One real `sandbank serve` per module, with the edge's bounds made small enough to reach."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    with data_dir() as data:
        running = Server(data, **EDGE).start()
        try:
            yield running
        finally:
            running.stop()
