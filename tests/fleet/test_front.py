"""A fleet on loopback (two nodes, one front, real processes): a node that drains on SIGTERM.
Routing, tokens, capacity, DNS membership and a node lost then back are tested over fakes in
test_front_http.py; test_real_fleet.py kills a node with SIGKILL.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fleet.support import TOKEN, LoopbackFleet, scratch_dir
from tests.tiers import needs

CODE = {"tool": "code_execution", "input": {"code": "print(6 * 7)"}}


@pytest.fixture(scope="module")
@needs("root")
def fleet() -> Iterator[LoopbackFleet]:
    with scratch_dir() as root:
        f = LoopbackFleet(root, nodes=2, node_overrides={"fleet_drain_grace_seconds": 4}).start()
        try:
            yield f
        finally:
            f.stop()


@pytest.fixture
def client(fleet: LoopbackFleet) -> Iterator[httpx.Client]:
    with fleet.client() as c:
        yield c


def create(client: httpx.Client) -> str:
    r = client.post("/sessions", json={})
    assert r.status_code == 201, r.text
    sid: str = r.json()["session_id"]
    return sid


def capacity(node_url: str) -> dict[str, Any]:
    r = httpx.get(f"{node_url}/fleet/capacity", headers={"Authorization": f"Bearer {TOKEN}"})
    report: dict[str, Any] = r.json()
    return report


def node_of(session_id: str) -> str:
    return session_id.split(".")[0]


def test_a_draining_node_finishes_its_calls_and_takes_no_new_session(
    fleet: LoopbackFleet, client: httpx.Client
) -> None:
    sids = [create(client) for _ in range(6)]
    on_0 = [s for s in sids if node_of(s) == "node-0"][:2]
    assert len(on_0) == 2
    out: dict[str, Any] = {}

    def call(key: str, sid: str, code: str) -> None:
        with fleet.client() as c:
            body = {"tool": "code_execution", "input": {"code": code}}
            out[key] = c.post(f"/sessions/{sid}/exec", json=body)

    calls = [
        threading.Thread(
            target=call, args=("short", on_0[0], "import time; time.sleep(2); print('done')")
        ),
        threading.Thread(target=call, args=("long", on_0[1], "import time; time.sleep(60)")),
    ]
    for t in calls:
        t.start()
    node0 = fleet.nodes["node-0"]
    deadline = time.monotonic() + 10
    while capacity(node0.base_url)["inflight"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node0.proc is not None
    node0.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # Within node-1's room (it holds about half of the six): placement never relies on a
    # reclaim a node may or may not make between two capacity reports.
    placed = [create(client) for _ in range(2)]
    assert {node_of(s) for s in placed} == {"node-1"}
    for t in calls:
        t.join(20)
    # The call that ends within the grace (4 s) finishes; the one still running then ends
    # with a result when the node ends its sessions.
    assert out["short"].status_code == 200
    assert out["short"].json()["result_block"]["content"]["stdout"] == "done\n"
    assert out["long"].status_code == 200
    assert out["long"].json()["result_block"]["content"]["return_code"] == 137
    # Then it exits (uvicorn re-raises the signal it caught).
    assert node0.proc.wait(15) in (0, -signal.SIGTERM)
    for sid in sids + placed:
        client.delete(f"/sessions/{sid}")
