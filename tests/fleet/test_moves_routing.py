"""Where a front sends a call on a session whose node is not holding it (fleet/front.py's
`route`), over nodes faked at the front's `send`: no process, no socket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbank.config import Settings
from sandbank.errors import AtCapacity, SessionNotFound
from sandbank.fleet.front import Fleet, rendezvous
from sandbank.fleet.membership import Member, Report
from sandbank.fleet.moves import move_key
from sandbank.protocol.http1 import Reply

pytestmark = pytest.mark.anyio
TOKEN = "fleet-token-for-routing"
TENANT = "tenant-a"
A, B = "0a0a0a0a", "0b0b0b0b"  # node instances


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeNodes:
    """Answers a front's adoption requests as the nodes would; records them."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], str] = {}  # (node, key) -> its id there
        self.stored: set[str] = set()  # keys with a snapshot in the object store
        self.claimed: set[str] = set()  # keys another node is adopting now
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def send(
        self, member: Member, method: str, target: str, headers: dict[str, str], body: Any = None,
        stream: bool = False,
    ) -> Reply:  # fmt: skip
        assert (method, target) == ("POST", "/fleet/adopt")
        request = json.loads(body)
        self.asked.append((member.name, request))
        key = request["key"]
        if (member.name, key) in self.held:
            return answer(self.held[member.name, key], member)
        if request["claim"] and key in self.claimed:
            return Reply(503, {})
        if request["claim"] and key in self.stored:
            self.stored.discard(key)
            self.held[member.name, key] = "adopted-id"
            return answer("adopted-id", member)
        return Reply(404, {})


def answer(local: str, member: Member) -> Reply:
    body = json.dumps({"session_id": local, "instance": member.instance}).encode()
    return Reply(200, {}, body)


def member(
    name: str, instance: str, draining: bool = False, up: bool = True, adopts: bool = True
) -> Member:
    r = Report(name, instance, "0", 1, 8, 1, 0, 2**30, draining, adopts=adopts)
    return Member(name, f"http://{name}", up=up, report=r, instance=instance, ever_up=True)


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Fleet, FakeNodes]]:
    settings = Settings(role="front", fleet_token=TOKEN, fleet_nodes="n0=http://n0,n1=http://n1")
    f = Fleet(settings)
    nodes = FakeNodes()
    f.send = nodes.send  # type: ignore[method-assign]
    yield f, nodes
    await f.close()


def public(f: Fleet, node: str, instance: str, local: str = "s1") -> str:
    return f.ids.sign(TENANT, node, instance + local)


async def test_a_session_on_its_running_node_is_sent_there_without_asking(
    fleet: tuple[Fleet, FakeNodes],
) -> None:
    f, nodes = fleet
    f.membership.members = {"n0": member("n0", A), "n1": member("n1", B)}
    routed, local = await f.route(TENANT, public(f, "n0", A))
    assert (routed.name, local) == ("n0", "s1")
    assert nodes.asked == []


async def test_a_drained_nodes_session_is_adopted_by_its_rendezvous_node_then_found_there(
    fleet: tuple[Fleet, FakeNodes],
) -> None:
    f, nodes = fleet
    f.membership.members = {"n0": member("n0", A, draining=True), "n1": member("n1", B)}
    sid = public(f, "n0", A)
    key = move_key("n0", A + "s1")
    nodes.stored.add(key)
    routed, local = await f.route(TENANT, sid)
    assert (routed.name, local) == ("n1", "adopted-id")
    # Asked to claim it, and told its node still runs (a checkpoint there would be older).
    assert nodes.asked == [("n1", {"key": key, "claim": True, "lost": False})]
    routed, _ = await f.route(TENANT, sid)
    assert routed.name == "n1" and len(nodes.asked) == 1  # remembered: no second question
    # A front that never saw it finds it the same way (the holder answers for it).
    other = Fleet(Settings(role="front", fleet_token=TOKEN, fleet_nodes="n0=http://n0"))
    other.send = nodes.send  # type: ignore[method-assign]
    other.membership.members = f.membership.members
    try:
        assert (await other.route(TENANT, sid))[0].name == "n1"
    finally:
        await other.close()
    # Another tenant's call with the id does not get as far as asking.
    with pytest.raises(SessionNotFound):
        await f.route("tenant-b", sid)


async def test_within_a_drains_grace_the_call_goes_to_the_draining_node(
    fleet: tuple[Fleet, FakeNodes],
) -> None:
    f, nodes = fleet
    f.membership.members = {"n0": member("n0", A, draining=True), "n1": member("n1", B)}
    routed, local = await f.route(TENANT, public(f, "n0", A))
    assert (routed.name, local) == ("n0", "s1")  # nothing moved yet: it is still there
    assert {name for name, _ in nodes.asked} == {"n0", "n1"}


async def test_a_lost_nodes_session_is_asked_for_as_lost_and_gone_when_nowhere(
    fleet: tuple[Fleet, FakeNodes],
) -> None:
    f, nodes = fleet
    f.membership.members = {"n0": member("n0", A, up=False), "n1": member("n1", B)}
    sid = public(f, "n0", A)
    with pytest.raises(SessionNotFound, match="gone"):
        await f.route(TENANT, sid)
    assert nodes.asked[0] == ("n1", {"key": move_key("n0", A + "s1"), "claim": True, "lost": True})
    # Being adopted by a node another front chose: retry, not gone.
    nodes.claimed.add(move_key("n0", A + "s1"))
    with pytest.raises(AtCapacity):
        await f.route(TENANT, sid)


async def test_a_node_restarted_under_its_name_is_asked_too(
    fleet: tuple[Fleet, FakeNodes],
) -> None:
    f, nodes = fleet
    f.membership.members = {"n0": member("n0", "0c0c0c0c"), "n1": member("n1", B)}
    up = list(f.membership.members.values())
    # A session whose key belongs to the other node: the restarted one is asked after it.
    local = next(f"s{i}" for i in range(64) if rendezvous(up, move_key("n0", f"{A}s{i}")) is up[1])
    sid = public(f, "n0", A, local)  # made by n0's instance before its restart
    key = move_key("n0", A + local)
    nodes.held["n0", key] = "found-again"  # what it moved to its own data directory
    routed, found = await f.route(TENANT, sid)
    assert (routed.name, found) == ("n0", "found-again")
    assert [name for name, _ in nodes.asked] == ["n1", "n0"]


async def test_a_node_that_keeps_no_snapshots_is_not_asked_to_adopt(
    fleet: tuple[Fleet, FakeNodes],
) -> None:
    f, nodes = fleet
    f.membership.members = {
        "n0": member("n0", A, up=False),
        "n1": member("n1", B, adopts=False),  # gVisor only, say
        "n2": member("n2", "0d0d0d0d"),
    }
    key = move_key("n0", A + "s1")
    nodes.stored.add(key)
    routed, local = await f.route(TENANT, public(f, "n0", A))
    assert (routed.name, local) == ("n2", "adopted-id")
    assert nodes.asked[0] == ("n2", {"key": key, "claim": True, "lost": True})
