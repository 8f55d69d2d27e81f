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


# Whether the test being set up or run may start real servers and backends (tests/tiers.py).
_ROOT_ALLOWED = [True]


def _refuse_outside_the_root_tier(owner: type, name: str) -> None:
    real = getattr(owner, name)

    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ROOT_ALLOWED[0]:
            pytest.fail(
                f"{owner.__name__}.{name}: a test of the fast tier starts a real server or "
                'sandbox backend; give the fixture that does it `@needs("root")` '
                "(tests/tiers.py), or use the fake backend"
            )
        return real(self, *args, **kwargs)

    setattr(owner, name, guarded)


def pytest_sessionstart(session: pytest.Session) -> None:
    from sandbank.sandbox.backends.unisolated import UnisolatedBackend
    from sandbank.sandbox.host.machine import IsolatedHost
    from tests.support import Server

    for owner, name in ((Server, "start"), (IsolatedHost, "check"), (UnisolatedBackend, "check")):
        _refuse_outside_the_root_tier(owner, name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Fixtures of every scope are set up for a test here: they start real things only for a
    test of the root tier (a module's fixture is made for its first test)."""
    _ROOT_ALLOWED[0] = item.get_closest_marker("root") is not None
    try:
        return (yield)
    finally:
        _ROOT_ALLOWED[0] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    _ROOT_ALLOWED[0] = item.get_closest_marker("root") is not None
    try:
        return (yield)
    finally:
        _ROOT_ALLOWED[0] = True


@pytest.fixture
@needs("root")
def machine() -> None:
    """For a test that starts real sandboxes or servers itself: it needs the root tier."""
