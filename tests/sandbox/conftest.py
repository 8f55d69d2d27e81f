"""The runtime's contract suite: every test runs against each backend claiming its property.

A test (or module) says what it needs with `@pytest.mark.claims(INTERPRETERS, ...)` (the
properties in sandbank.sandbox.backend); the `runtime` fixture is parametrized with every
backend that claims them all, so a new backend inherits the whole suite by being listed here.
`SANDBANK_TEST_BACKENDS=bwrap,none` narrows the list.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbank.protocol.calls import BashCall, EditorCall, ExecResult, PythonCall
from sandbank.protocol.sessions import SessionInfo
from sandbank.sandbox.backends.base import INTERPRETERS, Backend
from sandbank.sandbox.backends.bwrap import BwrapBackend
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.backends.fork import ForkBackend
from sandbank.sandbox.backends.gvisor import GvisorBackend
from sandbank.sandbox.backends.unisolated import UnisolatedBackend
from sandbank.sandbox.local import LocalSandboxes
from sandbank.sandbox.sessions import ExecSession
from tests.support import data_dir, settings
from tests.tiers import param

BACKENDS: dict[str, type[Backend]] = {
    "bwrap": BwrapBackend,
    "fork": ForkBackend,
    "none": UnisolatedBackend,
    "fake": FakeBackend,
    "gvisor": GvisorBackend,
}
# gvisor runs the whole suite when named (`SANDBANK_TEST_BACKENDS=gvisor`); by default its own
# module (test_gvisor.py) runs the parts that differ from bwrap's, within the suite's budget.
DEFAULT_BACKENDS = "bwrap,fork,none,fake"
NOT_GVISOR = ("bwrap", "fork", "none", "fake")  # for what holds of the host kernel's sandboxes
_CHOSEN = [b for b in os.environ.get("SANDBANK_TEST_BACKENDS", DEFAULT_BACKENDS).split(",") if b]


def isolation_of(backend_name: str) -> str:
    """The `isolation` setting of a backend (the fake is given to the runtime directly)."""
    return backend_name if backend_name in ("none", "fork", "gvisor") else "bwrap"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" not in metafunc.fixturenames:
        return
    needed: set[str] = set()
    for marker in metafunc.definition.iter_markers("claims"):
        needed.update(marker.args)
    needed = needed or {INTERPRETERS}  # unmarked tests need real interpreters
    names = [n for n in _CHOSEN if needed <= BACKENDS[n].claims]
    for marker in metafunc.definition.iter_markers("only_backends"):
        names = [n for n in names if n in marker.args]  # a backend's own promises
    # Real backends run real interpreters: the root tier. The fake runs nothing: the fast one.
    params = [n if n == "fake" else param(n, "root", id=n) for n in names]
    metafunc.parametrize("backend_name", params, scope="module")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def module_data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


@pytest.fixture(scope="module")
async def runtime(module_data: Path, backend_name: str) -> AsyncIterator[LocalSandboxes]:
    config = settings(
        module_data, cpu_limit=0.5, isolation=isolation_of(backend_name), gvisor_platform="ptrace"
    )
    rt = LocalSandboxes(config, BACKENDS[backend_name](config))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


@pytest.fixture
async def session(runtime: LocalSandboxes) -> AsyncIterator[ExecSession]:
    info = await runtime.create("tests")
    try:
        yield runtime.session(info.id, "tests")
    finally:
        await runtime.destroy(info.id, "tests")


class Shell:
    """Terse calls against one session."""

    def __init__(self, runtime: LocalSandboxes, session: ExecSession | SessionInfo) -> None:
        self.runtime = runtime
        self.session = runtime.session(session.id, "tests")

    async def py(self, code: str, timeout: float = 20) -> ExecResult:
        return await self.runtime.execute(self.session.id, "tests", PythonCall(code), timeout)

    async def sh(self, command: str, timeout: float = 20) -> ExecResult:
        return await self.runtime.execute(self.session.id, "tests", BashCall(command), timeout)

    async def edit(self, timeout: float = 20, **kwargs: object) -> ExecResult:
        call = EditorCall(**kwargs)  # type: ignore[arg-type]
        return await self.runtime.execute(self.session.id, "tests", call, timeout)


@pytest.fixture
def sb(runtime: LocalSandboxes, session: ExecSession) -> Shell:
    return Shell(runtime, session)
