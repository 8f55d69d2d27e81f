"""Contract v1 through a front: the code-execution conformance suite, pointed at a fleet."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import tests.execapi.test_conformance as single_server
from tests.execapi.conftest import SPEC_PATH, client, contract, session_id
from tests.fleet.support import LoopbackFleet, scratch_dir
from tests.tiers import needs

__all__ = ["client", "contract", "session_id"]  # the suite's fixtures, used here too

# Every test of the single-server suite, unchanged; the cap test starts a server of its own.
SKIPPED = {"test_put_file_over_the_cap_is_413_and_nothing_is_written"}
globals().update(
    {k: v for k, v in vars(single_server).items() if k.startswith("test_") and k not in SKIPPED}
)


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[LoopbackFleet]:
    with scratch_dir() as root:
        fleet = LoopbackFleet(root, nodes=2).start()
        try:
            yield fleet
        finally:
            fleet.stop()


@pytest.fixture(scope="session")
def spec() -> dict[str, Any]:
    """The contract, from the repository's own copy (as tests/execapi reads it)."""
    doc: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text())
    return doc
