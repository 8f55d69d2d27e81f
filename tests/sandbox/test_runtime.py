"""Sessions over any backend (the fake included): capacity, fair reclaim between tenants, expiry."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sandbank.config import Settings
from sandbank.errors import AtCapacity, SessionNotFound, TenantShareReached
from sandbank.protocol.sessions import SessionSpec
from sandbank.sandbox import files as transfers
from sandbank.sandbox.backends.base import RUNTIME
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.local import LocalSandboxes
from tests.sandbox.conftest import BACKENDS, isolation_of
from tests.support import settings

pytestmark = [pytest.mark.anyio, pytest.mark.claims(RUNTIME)]

MakeRuntime = Callable[..., Awaitable[LocalSandboxes]]


@pytest.fixture
async def make_runtime(module_data: Path, backend_name: str) -> AsyncIterator[MakeRuntime]:
    made: list[LocalSandboxes] = []

    async def make(tenants: int = 1, **overrides: Any) -> LocalSandboxes:
        # A directory of its own: a runtime closed by an earlier test left its sessions paused
        # in its own, for the next start there to resume.
        data = module_data / f"rt{len(made)}-{secrets.token_hex(3)}"
        config = settings(data, isolation=isolation_of(backend_name), **overrides)
        rt = LocalSandboxes(config, BACKENDS[backend_name](config), tenants=tenants)
        await rt.start()
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.close()


def alive(rt: LocalSandboxes, tenant: str) -> int:
    """The tenant's running sessions (a paused one holds no sandbox)."""
    return sum(1 for s in rt.sessions() if s.tenant == tenant and not (s.paused or s.pausing))


def gave_way(rt: LocalSandboxes, session_id: str, tenant: str) -> None:
    """The session made room: paused where the backend keeps snapshots, else ended."""
    if rt.store is None:
        with pytest.raises(SessionNotFound):
            rt.session(session_id, tenant)
    else:
        session = rt.session(session_id, tenant)
        assert session.paused or session.pausing


async def test_a_full_server_reclaims_from_the_tenant_over_its_share(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(max_sessions=4)
    a = [await rt.create("a") for _ in range(3)]
    await rt.create("b")
    await rt.create("b")  # full: a holds more than its share, so a gives way
    assert (alive(rt, "a"), alive(rt, "b")) == (2, 2)
    gave_way(rt, a[0].id, "a")  # its least recently used one
    await rt.create("a")  # a is at its share: its own session goes, never b's
    assert (alive(rt, "a"), alive(rt, "b")) == (2, 2)


async def test_a_tenant_at_its_own_cap_reclaims_its_own_sessions(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(max_sessions=8, max_sessions_per_tenant=2)
    first = await rt.create("a")
    await rt.create("a")
    await rt.create("b")
    await rt.create("a")
    assert (alive(rt, "a"), alive(rt, "b")) == (2, 1)
    gave_way(rt, first.id, "a")


async def test_busy_sessions_of_the_greedy_tenant_mean_a_refusal_not_anothers_loss(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(max_sessions=4)
    greedy = [rt.session((await rt.create("a")).id, "a") for _ in range(3)]
    other = await rt.create("b")
    for s in greedy:
        await s.lock.acquire()  # a call in progress on each
    try:
        with pytest.raises(AtCapacity):
            await rt.create("b")
        rt.session(other.id, "b")
    finally:
        for s in greedy:
            s.lock.release()


async def _busy(rt: LocalSandboxes, tenant: str) -> list[Any]:
    """A call in progress on each of the tenant's sessions (their locks held)."""
    held = [s for s in rt.sessions() if s.tenant == tenant]
    for s in held:
        await s.lock.acquire()
    return held


async def test_with_several_tenants_one_keeping_every_session_busy_leaves_room_for_others(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(tenants=2, max_sessions=8)
    for _ in range(6):
        await rt.create("a")
    held = await _busy(rt, "a")
    try:
        with pytest.raises(TenantShareReached) as refused:
            await rt.create("a")
        assert "the most it may hold (6: three quarters of the server's 8)" in str(refused.value)
        assert "all busy" in str(refused.value)
        await rt.create("b")
        await rt.create("b")
        assert (alive(rt, "a"), alive(rt, "b")) == (6, 2)
    finally:
        for s in held:
            s.lock.release()


async def test_while_a_tenant_waits_the_others_at_their_share_get_no_more(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(max_sessions=4)
    for _ in range(4):
        await rt.create("a")
    held = await _busy(rt, "a")
    try:
        with pytest.raises(AtCapacity) as full:
            await rt.create("b")  # b now waits
        assert "all 4 sessions of this server are busy" in str(full.value)
        await rt.destroy(held[0].id, "a")  # room for one
        with pytest.raises(TenantShareReached) as share:
            await rt.create("a")  # a holds 3, over its share (2) while b waits
        assert "fair share of the server's 4 while other clients wait" in str(share.value)
        await rt.create("b")  # what freed up went to b
        assert (alive(rt, "a"), alive(rt, "b")) == (3, 1)
    finally:
        for s in held:
            s.lock.release()


async def test_a_tenant_named_in_tenant_max_sessions_has_its_own_limit(
    make_runtime: MakeRuntime,
) -> None:
    big, small = "abcdef0123456789abcdef01", "0123456789abcdef01234567"
    rt = await make_runtime(tenants=2, max_sessions=8, tenant_max_sessions="abcdef01=8")
    for _ in range(8):
        await rt.create(big)
    assert alive(rt, big) == 8  # past the default three quarters
    held = await _busy(rt, big)
    try:
        with pytest.raises(TenantShareReached) as refused:
            await rt.create(big)
        assert "(8: SANDBANK_TENANT_MAX_SESSIONS)" in str(refused.value)
        with pytest.raises(AtCapacity):
            await rt.create(small)
    finally:
        for s in held:
            s.lock.release()


async def test_expiry_is_decided_at_the_time_given(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    s = await rt.create("t", SessionSpec(idle_timeout=10, max_lifetime=100))
    rt.reap(now=s.last_activity_at + 5)
    rt.session(s.id, "t")
    rt.reap(now=s.last_activity_at + 11)
    with pytest.raises(SessionNotFound):
        rt.session(s.id, "t")


async def test_a_download_sends_at_most_the_size_the_file_had_when_opened(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime()
    s = rt.session((await rt.create("t")).id, "t")
    path = s.sandbox.workspace / "growing.log"
    path.write_bytes(b"a" * 1000)
    download = await transfers.open_download(s, "growing.log")
    with path.open("ab") as f:
        f.write(b"b" * 5000)  # it grows while it is sent
    body = b"".join([chunk async for chunk in download.chunks])
    assert (download.size, body) == (1000, b"a" * 1000)
    assert s.open_files == set()  # the transfer let go of its file


class SlowSweepBackend(FakeBackend):
    """A fake whose sweep takes a while and counts its runs, each one started after `gate`."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.runs = 0
        self.threads: set[int] = set()

    def sweep(self) -> None:
        self.runs += 1
        self.threads.add(threading.get_ident())
        time.sleep(0.05)


async def test_sweeps_run_off_the_loop_one_at_a_time_and_a_burst_shares_them(
    tmp_path: Path,
) -> None:
    backend = SlowSweepBackend(settings(tmp_path, isolation="none"))
    rt = LocalSandboxes(backend.settings, backend)
    await rt.start()
    try:
        await rt.sweep()
        assert backend.runs == 1 and threading.get_ident() not in backend.threads
        # Twenty callers at once share one sweep, which starts after all of them called.
        await asyncio.gather(*(rt.sweep() for _ in range(20)))
        assert backend.runs == 2
        # A caller arriving during a sweep waits for one that starts after its call.
        first = asyncio.ensure_future(rt.sweep())
        await asyncio.sleep(0.01)
        runs_at_call = backend.runs
        await rt.sweep()
        assert backend.runs == runs_at_call + 1 and first.done()
    finally:
        await rt.close()


def test_session_ids_never_begin_with_an_option_character() -> None:
    """`sandbank exec --session ID` took one id in 64 (those beginning with `-`) for an option."""
    rt = LocalSandboxes(settings(Path("/nonexistent")), FakeBackend(settings(Path("/x"))))
    ids = [rt.new_id() for _ in range(20_000)]
    assert all(i[0] in "0123456789abcdef" for i in ids)
    assert len(set(ids)) == len(ids) and {len(i) for i in ids} == {30}
    assert {i[:6] for i in ids} == {rt.instance}


async def test_a_session_of_an_earlier_server_run_is_said_to_have_ended_with_it(
    make_runtime: MakeRuntime,
) -> None:
    before = await make_runtime()
    old = await before.create("t")
    after = await make_runtime()  # the same server, started again
    with pytest.raises(SessionNotFound) as caught:
        after.session(old.id, "t")
    assert "ended when the server restarted" in caught.value.message
    assert "create a new session" in caught.value.message
    with pytest.raises(SessionNotFound, match=r"^no session 'unknown'$"):
        after.session("unknown", "t")
    mine = await after.create("t")
    with pytest.raises(SessionNotFound, match=r"^no session "):
        after.session(mine.id, "another tenant")  # never told apart from an unknown one
