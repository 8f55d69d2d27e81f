"""Suite-wide guards (no test reaches a real LLM) and the tiers of the suite.

Tiers, as markers set here from where a test lives and what it is parametrized with:
- `root`: starts real sandboxes or servers (needs root, bubblewrap, cgroups, loop devices);
- `postgres`, `s3`, `chromium`: needs Debian's PostgreSQL, moto's S3 server, or Chromium;
- everything else is the fast tier: `make test-fast` (no root, seconds).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

# Set before any Settings is built (SANDBANK_TEST_REAL_LLM=1 lifts it for the opt-in test).
os.environ["SANDBANK_LLM_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[1]
TIERS = ("root", "postgres", "s3", "chromium")
# Where tests start real sandboxes or `sandbank serve` (prefixes of paths from the checkout).
ROOT = (
    "tests/sandbox/",
    "tests/execapi/",
    "tests/interpreter/test_life",
    "tests/interpreter/test_abuse",
    "tests/interpreter/test_lifecycle",
    "tests/interpreter/test_remote_stack",
    "tests/interpreter/test_spec_client",
    "tests/interpreter/test_replica",
    "tests/leasing/test_remote.py",
    "tests/fleet/",
    "tests/egress/",
    "tests/edges/",
    "tests/agent/test_loop_real_sandbox",
    "tests/agent/test_inspect_real_sandbox",
    "tests/interpreter/test_cli",
    "tests/interpreter/test_logs",
    "tests/interpreter/test_metrics",
    "tests/interpreter/test_sqlite_lock",
    "tests/test_metrics",
    "tests/web/test_page_states",
    "tests/web/test_reference",
    "tests/web/test_ui",
    "tests/web/test_tags",
    "tests/test_cli",
    "tests/test_doctor",
    "tests/test_fuzz",
)
CHROMIUM = (
    "tests/web/test_ui",
    "tests/web/test_tags",
    "tests/web/test_page_states",
    "tests/web/test_reference",
)


def tiers_of(item: pytest.Item) -> set[str]:
    path = item.path.relative_to(REPO).as_posix()
    params = {str(v) for v in getattr(getattr(item, "callspec", None), "params", {}).values()}
    found = set()
    if path.startswith(ROOT) and "fake" not in params:
        found.add("root")
    if path.startswith(CHROMIUM):
        found.add("chromium")
    if "postgresql" in params or "remote_stack" in path or "replica" in path:
        found.add("postgres")
    if "s3" in params or path.endswith("test_s3.py") or "remote_stack" in path:
        found.add("s3")
    return found


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line(
            "markers", f"{tier}: a test of the `{tier}` tier (tests/conftest.py)"
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
