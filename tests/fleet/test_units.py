"""Signed ids, placement and the static node list, without processes."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from sandbank.config import Settings
from sandbank.errors import SandbankError, SessionNotFound
from sandbank.fleet.ids import SessionIds
from sandbank.fleet.membership import Member, Membership, Report, parse_static
from sandbank.fleet.placement import choose


def test_a_signed_id_routes_to_its_node_and_nothing_else_verifies() -> None:
    ids = SessionIds("k1")
    public = ids.sign("tenant-a", "node-1", "AbC_-9")
    assert ids.verify("tenant-a", public) == ("node-1", "AbC_-9")
    node, local, mac = public.split(".")
    forged = [
        f"node-2.{local}.{mac}",  # steered to another node
        f"{node}.{local}x.{mac}",  # another session
        f"{node}.{local}.{mac[:-1]}A" if mac[-1] != "A" else f"{node}.{local}.{mac[:-1]}B",
        SessionIds("k2").sign("tenant-a", "node-1", "AbC_-9"),  # not this fleet's key
        "no-such-session",
        f"{node}.{local}",
        f"{node}.{local}.{mac}.extra",
        "ünï.côdé.x",
    ]
    for bad in forged:
        with pytest.raises(SessionNotFound):
            ids.verify("tenant-a", bad)
    with pytest.raises(SessionNotFound):  # another tenant's session does not exist for it
        ids.verify("tenant-b", public)


def report(sessions: int, max_sessions: int = 4, idle: int = 0, draining: bool = False) -> Report:
    return Report("n", "i0", "0", sessions, max_sessions, idle, 0, 2**30, draining)


def members(*reports: Report, up: bool = True) -> list[Member]:
    async def make() -> list[Member]:
        return [Member(f"n{i}", f"http://n{i}", up=up, report=r) for i, r in enumerate(reports)]

    return asyncio.run(make())


def test_placement_never_picks_a_draining_or_down_node_and_a_full_one_last() -> None:
    rng = random.Random(1)
    ms = members(report(0, draining=True), report(4, idle=0), report(3))
    assert all(choose(ms, 2, rng, set()).name == "n2" for _ in range(20))  # type: ignore[union-attr]
    # Full by its last report: asked all the same (it answers 503 when it still is).
    assert choose(ms[:2], 2, rng, set()).name == "n1"  # type: ignore[union-attr]
    assert choose(ms[:2], 2, rng, {"n1"}) is None  # asked once already: no more
    assert choose(members(report(0, draining=True)), 2, rng, set()) is None
    assert choose(members(report(0), up=False), 2, rng, set()) is None
    # Of two full ones, the one that answered its last health check first.
    two_full = members(report(4, idle=0), report(4, idle=0))
    two_full[0].missed = 1
    assert choose(two_full, 2, rng, set()).name == "n1"  # type: ignore[union-attr]
    # A full node whose sessions are idle can still reclaim one, as a single server does.
    assert choose(members(report(4, idle=1)), 2, rng, set()) is not None


def test_placement_takes_the_least_loaded_of_its_sample_and_counts_its_own_placements() -> None:
    rng = random.Random(2)
    ms = members(report(2), report(1))
    assert choose(ms, 2, rng, set()).name == "n1"  # type: ignore[union-attr]
    ms[1].placed = 2  # placed here since the last report: now the busier one
    assert choose(ms, 2, rng, set()).name == "n0"  # type: ignore[union-attr]
    assert choose(ms, 2, rng, {"n0"}).name == "n1"  # type: ignore[union-attr]


def test_sessions_ended_through_the_front_free_room_before_the_next_report() -> None:
    (full,) = members(report(4, idle=0))  # its last report: four busy sessions, no room
    assert not full.accepting()
    full.released()  # one of them ended through this front since
    assert full.accepting() and full.used() == 3
    for _ in range(10):  # never below none at all, however many ends it hears of
        full.released()
    assert full.used() == 0


def test_static_node_list() -> None:
    assert parse_static("a=http://x:1/, b=https://y") == [("a", "http://x:1"), ("b", "https://y")]
    with pytest.raises(SandbankError):
        parse_static("a=ftp://x")


def capacity_body(name: str) -> dict[str, object]:
    return {
        "name": name, "instance": "i1", "version": "t", "sessions": 0, "max_sessions": 4,
        "idle": 0, "inflight": 0, "memory_available_bytes": 1 << 30, "draining": False,
    }  # fmt: skip


@pytest.mark.anyio
async def test_a_starting_front_gives_a_slow_node_more_rounds_before_it_counts_it_out() -> None:
    """A first capacity report lost to a loaded machine must not put a live node out."""
    answered: dict[str, int] = {"a": 0, "b": 0}

    def node(request: httpx.Request) -> httpx.Response:
        name = request.url.host
        answered[name] += 1
        if name == "b" and answered[name] == 1:
            raise httpx.ReadTimeout("slow", request=request)  # b misses the first round
        return httpx.Response(200, json=capacity_body(name))

    settings = Settings(
        role="front", fleet_token="t" * 32, fleet_nodes="a=http://a:1,b=http://b:1",
        fleet_refresh_seconds=0.01, interpreter_api="off",
    )  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(node)) as client:
        membership = Membership(settings, client)
        await membership.start()
        try:
            assert sorted(m.name for m in membership.up()) == ["a", "b"]
            assert answered["b"] == 2
        finally:
            await membership.close()

    def down(request: httpx.Request) -> httpx.Response:
        if request.url.host == "b":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=capacity_body(request.url.host))

    async with httpx.AsyncClient(transport=httpx.MockTransport(down)) as client:
        membership = Membership(settings, client)
        await membership.start()  # a node that never answers is out after START_TRIES rounds
        try:
            assert [m.name for m in membership.up()] == ["a"]
        finally:
            await membership.close()


@pytest.mark.parametrize(
    ("node", "local"),
    [("Node-1", "abc"), ("node.1", "abc"), ("-node", "abc"), ("n" * 64, "abc"), ("n", "a.b"),
     ("n", ""), ("n", "a" * 129), ("n", "a/b")],
)  # fmt: skip
def test_a_node_name_or_id_that_would_not_route_back_is_never_signed(node: str, local: str) -> None:
    with pytest.raises(ValueError, match="unexpected node name or session id"):
        SessionIds("k1").sign("tenant-a", node, local)
