"""The warm pool's size follows demand: a burst grows it, quiet shrinks it, sessions keep room."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbank.config import Settings
from sandbank.sandbox import pool as pool_module
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.local import LocalSandboxes
from tests.support import settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def started(s: Settings) -> LocalSandboxes:
    rt = LocalSandboxes(s, FakeBackend(s))
    await rt.start()
    await rt.pool.wait_full(timeout=10)
    return rt


@pytest.fixture
async def grown(tmp_path: Path) -> AsyncIterator[LocalSandboxes]:
    rt = await started(settings(tmp_path, pool_size=2, pool_size_max=12, max_sessions=20))
    try:
        yield rt
    finally:
        await rt.close()


async def test_a_burst_of_leases_grows_the_pool_so_the_next_burst_is_served_from_it(
    grown: LocalSandboxes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sandbank.sandbox.pool")
    first = [await grown.create("t") for _ in range(8)]
    assert grown.pool.size == 8
    assert any("grows to 8" in m for m in caplog.messages)
    for info in first:
        await grown.destroy(info.id, "t")
    await grown.pool.wait_full(timeout=10)
    assert grown.pool.ready == 8
    pooled = {sandbox.id for sandbox in grown.pool._ready}
    second = [await grown.create("t") for _ in range(8)]
    # Every one of the second burst came from the pool: no lease waited for a start.
    assert {grown.session(i.id, "t").sandbox.id for i in second} == pooled
    for info in second:
        await grown.destroy(info.id, "t")


async def test_the_pool_grows_no_further_than_its_ceiling(grown: LocalSandboxes) -> None:
    leased = [await grown.create("t") for _ in range(16)]
    assert grown.pool.size == 12
    for info in leased:
        await grown.destroy(info.id, "t")


async def test_a_grown_pool_leaves_the_room_sessions_need(tmp_path: Path) -> None:
    rt = await started(settings(tmp_path, pool_size=2, pool_size_max=12, max_sessions=10))
    try:
        leased = [await rt.create("t") for _ in range(9)]
        assert rt.pool.size == 9
        await asyncio.sleep(0.5)  # the refill has run
        # Nine sessions of ten: the pool holds no more than the room they leave with its floor.
        assert rt.pool.ready <= 10 + 2 - 9
        for info in leased:
            await rt.destroy(info.id, "t")
        await rt.pool.wait_full(timeout=10)
        assert rt.pool.ready == 9
    finally:
        await rt.close()


async def test_a_quiet_pool_shrinks_back_to_its_floor(
    grown: LocalSandboxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    leased = [await grown.create("t") for _ in range(6)]
    for info in leased:
        await grown.destroy(info.id, "t")
    await grown.pool.wait_full(timeout=10)
    assert grown.pool.ready == 6
    monkeypatch.setattr(pool_module, "KEEP_GROWN", 0.0)
    grown.pool._wake.set()
    async with asyncio.timeout(5):
        while grown.pool.ready > 2:  # noqa: ASYNC110 - bounded by the timeout
            await asyncio.sleep(0.02)
    assert grown.pool.size == 2
    backend = grown.backend
    assert isinstance(backend, FakeBackend)
    assert sum(not s.closed for s in backend.sandboxes) == 2  # the surplus was closed


async def test_a_pool_set_by_hand_does_not_grow(tmp_path: Path) -> None:
    s = settings(tmp_path, pool_size=2, max_sessions=20)
    assert s.pool_size_max == 2
    rt = await started(s)
    try:
        leased = [await rt.create("t") for _ in range(6)]
        assert rt.pool.size == 2
        for info in leased:
            await rt.destroy(info.id, "t")
    finally:
        await rt.close()


def test_a_derived_fork_pool_may_grow_to_a_burst_of_sessions() -> None:
    s = Settings(isolation="fork", max_sessions=40)
    assert (s.pool_size, s.pool_size_max) == (2, 40)
    assert Settings(isolation="fork", max_sessions=400).pool_size_max == 64
    assert Settings(isolation="bwrap", max_sessions=400).pool_size_max == 2
    assert Settings(isolation="fork", max_sessions=400, pool_size_max=3).pool_size_max == 20
