"""Fixtures for the agent's tests; importing this module makes model endpoints loopback-only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.agent.fakes import FakeWorkbench, RecordingSink

# Set before any Settings is built, so no test can reach a real LLM by accident
# (SANDBANK_TEST_REAL_LLM=1 lifts it for the opt-in real_llm test).
os.environ["SANDBANK_LLM_OFFLINE"] = "1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def workbench(tmp_path: Path) -> FakeWorkbench:
    root = tmp_path / "workspace"
    root.mkdir()
    return FakeWorkbench(root)


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
