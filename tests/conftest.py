"""Suite-wide guards (no test reaches a real LLM) and the tiers of the suite (tests/tiers.py).

A test's tier comes from the fixtures it uses: `root`, `postgres`, `s3`, `chromium`; everything
else is the fast tier (`make test-fast`). A fast test that starts a real server or a real sandbox
backend without a fixture saying so fails: the fast tier stays honest.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.tiers import TIERS, needs, tiers_of

# Set before any Settings is built (SANDBANK_TEST_REAL_LLM=1 lifts it for the opt-in test).
os.environ["SANDBANK_LLM_OFFLINE"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line(
            "markers", f"{tier}: needs what the `{tier}` tier has (tests/tiers.py)"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A server (or any process) a test started and left running fails the run, and is
    ended so it does not outlive it."""
    import signal

    from tests.support import left_running

    leftovers = left_running()
    if not leftovers:
        return
    for pid, _ in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    listed = "\n".join(f"  {pid}: {cmdline}" for pid, cmdline in leftovers)
    session.config.get_terminal_writer().line(
        f"\nprocesses started by tests were left running (now killed):\n{listed}", red=True
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in tiers_of(item):
            item.add_marker(tier)


@pytest.fixture(autouse=True)
def _honest_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In the fast tier, starting a real server or a real backend fails the test at once."""
    if request.node.get_closest_marker("root") is not None:
        yield
        return
    from sandbank.sandbox.backends.unisolated import UnisolatedBackend
    from sandbank.sandbox.host.machine import IsolatedHost
    from tests.support import Server

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail(
            f"{request.node.nodeid} starts a real server or sandbox backend but uses no fixture "
            "of the root tier: take one (tests/tiers.py `needs`), or use the fake backend"
        )

    monkeypatch.setattr(Server, "start", refuse)
    monkeypatch.setattr(IsolatedHost, "check", refuse)
    monkeypatch.setattr(UnisolatedBackend, "check", refuse)
    yield


@pytest.fixture
@needs("root")
def machine() -> None:
    """For a test that starts real sandboxes or servers itself: it needs the root tier."""
