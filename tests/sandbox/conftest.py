"""Fixtures: one real isolated runtime per test module and backend, with test-sized limits.

Every test here runs once per isolation backend named in `SANDBANK_TEST_BACKENDS`
(comma-separated, default `bwrap`), e.g. `SANDBANK_TEST_BACKENDS=bwrap,fork`; runtimes a test
builds itself with `tests.support.settings` get the same backend.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from unittest import mock

import pytest

from sandbank.sandbox.base import BashCall, EditorCall, ExecResult, PythonCall
from sandbank.sandbox.sessions import Runtime, Session
from tests.support import TEST_LIMITS, data_dir, settings

BACKENDS = [b.strip() for b in os.environ.get("SANDBANK_TEST_BACKENDS", "bwrap").split(",")]


@pytest.fixture(scope="module", params=[b for b in BACKENDS if b], autouse=True)
def isolation(request: pytest.FixtureRequest) -> Iterator[str]:
    with mock.patch.dict(TEST_LIMITS, isolation=request.param):
        yield str(request.param)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def module_data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


@pytest.fixture(scope="module")
async def runtime(module_data: Path, isolation: str) -> AsyncIterator[Runtime]:
    rt = Runtime(settings(module_data, cpu_limit=0.5))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.shutdown()


@pytest.fixture
async def session(runtime: Runtime) -> AsyncIterator[Session]:
    s = await runtime.create("tests")
    try:
        yield s
    finally:
        await runtime.destroy(s.id, "tests")


class Shell:
    """Terse calls against one session."""

    def __init__(self, runtime: Runtime, session: Session) -> None:
        self.runtime = runtime
        self.session = session

    async def py(self, code: str, timeout: float = 20) -> ExecResult:
        return await self.runtime.execute(self.session.id, "tests", PythonCall(code), timeout)

    async def sh(self, command: str, timeout: float = 20) -> ExecResult:
        return await self.runtime.execute(self.session.id, "tests", BashCall(command), timeout)

    async def edit(self, timeout: float = 20, **kwargs: object) -> ExecResult:
        call = EditorCall(**kwargs)  # type: ignore[arg-type]
        return await self.runtime.execute(self.session.id, "tests", call, timeout)


@pytest.fixture
def sb(runtime: Runtime, session: Session) -> Shell:
    return Shell(runtime, session)
