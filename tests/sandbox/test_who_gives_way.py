"""Who gives way at capacity (sandbox/sessions.py `victim` and `expired`), in-process: the
caller's own least recently used idle session first, then a tenant over its fair share; never a
busy session nor another tenant within its share. test_runtime.py checks it through the sessions
of a running server."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbank.errors import AtCapacity
from sandbank.sandbox.backends.fake import FakeSandbox, succeed
from sandbank.sandbox.sessions import ExecSession, victim


def session(tenant: str, last: float, busy: bool = False, name: str = "") -> ExecSession:
    made = ExecSession(
        id=name or f"{tenant}-{last}",
        tenant=tenant,
        sandbox=FakeSandbox("sb", Path("/nonexistent"), succeed),
        idle_timeout=60,
        max_lifetime=3600,
        created_at=0.0,
        last_activity_at=last,
    )
    made.inflight = 1 if busy else 0
    return made


def test_below_capacity_nobody_gives_way() -> None:
    sessions = [session("a", 1), session("b", 2)]
    assert victim(sessions, "a", max_sessions=3, limit=(3, "SANDBANK_MAX_SESSIONS")) is None


def test_at_its_own_cap_a_tenant_reclaims_its_least_recently_used_idle_session() -> None:
    mine = [session("a", 5), session("a", 1), session("a", 3, busy=True)]
    assert (
        victim([*mine, session("b", 0)], "a", max_sessions=10, limit=(3, "SANDBANK_MAX_SESSIONS"))
        is mine[1]
    )


def test_at_its_own_cap_with_all_busy_a_tenant_is_refused() -> None:
    mine = [session("a", 1, busy=True), session("a", 2, busy=True)]
    with pytest.raises(AtCapacity, match="holds 2 sessions, the most it may hold") as refused:
        victim(mine, "a", max_sessions=10, limit=(2, "SANDBANK_MAX_SESSIONS"))
    assert refused.value.retry_after == 5


def test_a_full_server_takes_from_the_tenant_over_its_share_not_from_others() -> None:
    greedy = [session("g", t) for t in (4, 2, 6)]
    modest = [session("m", 0)]  # the least recent of all, but within its share
    assert (
        victim([*greedy, *modest], "new", max_sessions=4, limit=(4, "SANDBANK_MAX_SESSIONS"))
        is greedy[1]
    )


def test_the_caller_over_its_share_gives_way_first() -> None:
    mine = [session("a", 9), session("a", 8)]
    other = [session("b", 1), session("b", 2)]
    assert (
        victim([*mine, *other], "a", max_sessions=4, limit=(4, "SANDBANK_MAX_SESSIONS")) is mine[1]
    )


def test_a_full_server_whose_tenants_over_share_are_busy_refuses() -> None:
    sessions = [session("g", t, busy=True) for t in range(3)] + [session("m", 0)]
    with pytest.raises(AtCapacity, match="all 4 sessions of this server are busy"):
        victim(sessions, "new", max_sessions=4, limit=(4, "SANDBANK_MAX_SESSIONS"))


def test_a_session_expires_by_lifetime_or_by_idleness_but_not_while_busy() -> None:
    idle = session("a", 100)
    assert idle.expired(150) is None
    assert idle.expired(161) == "idle timeout"
    busy = session("a", 100, busy=True)
    assert busy.expired(161) is None
    assert busy.expired(3601) == "maximum lifetime reached"
