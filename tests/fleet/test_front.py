"""A fleet on loopback (two nodes, one front, real processes): routing, tokens, drain, loss."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fleet.support import TOKEN, LoopbackFleet, front, node, scratch_dir
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


def test_a_node_answers_only_the_fleet_token(fleet: LoopbackFleet) -> None:
    url = fleet.nodes["node-0"].base_url
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        assert httpx.post(f"{url}/sessions", json={}, headers=headers).status_code == 401
        assert httpx.get(f"{url}/fleet/capacity", headers=headers).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200  # kubelet probes carry no secret
    report = httpx.get(f"{url}/fleet/capacity", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert report["name"] == "node-0" and report["max_sessions"] == 6
    assert report["draining"] is False and report["memory_available_bytes"] > 0


def test_sessions_spread_across_nodes_and_each_call_reaches_its_node(
    client: httpx.Client,
) -> None:
    sids = [create(client) for _ in range(6)]
    assert {node_of(s) for s in sids} == {"node-0", "node-1"}
    for sid in sids:
        r = client.post(f"/sessions/{sid}/exec", json={**CODE, "input": {"code": f"x = {sid!r}"}})
        assert r.status_code == 200
    for sid in sids:  # each session's state is where its id says
        r = client.post(f"/sessions/{sid}/exec", json={**CODE, "input": {"code": "print(x)"}})
        assert r.json()["result_block"]["content"]["stdout"] == f"{sid}\n"
        assert client.delete(f"/sessions/{sid}").status_code == 204


def test_the_front_reports_its_nodes_capacity_as_metrics(
    fleet: LoopbackFleet, client: httpx.Client
) -> None:
    sid = create(client)
    text = httpx.get(f"{fleet.base_url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("sandbank_fleet_nodes", (("state", "accepting"),))] == 2
    assert samples[("sandbank_fleet_nodes", (("state", "down"),))] == 0
    for name in ("node-0", "node-1"):
        assert samples[("sandbank_fleet_node_max_sessions", (("node", name),))] == 6
    used = [samples[("sandbank_fleet_node_sessions", (("node", n),))] for n in fleet.nodes]
    assert sum(used) >= 1  # the session just placed (reported, or counted as placed)
    node = httpx.get(
        f"{fleet.nodes[node_of(sid)].base_url}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).text
    assert "sandbank_sessions_max 6.0" in node
    client.delete(f"/sessions/{sid}")


def test_a_forged_or_altered_session_id_is_refused(client: httpx.Client) -> None:
    sid = create(client)
    node, local, mac = sid.split(".")
    other = "node-1" if node == "node-0" else "node-0"
    for bad in (
        f"{other}.{local}.{mac}",
        f"{node}.{local}.AAAA{mac[4:]}",
        f"{node}.{local}",
        local,
    ):
        r = client.post(f"/sessions/{bad}/exec", json=CODE)
        assert r.status_code == 404 and "no session" in r.json()["detail"], bad
        assert client.get(f"/sessions/{bad}/files/list").status_code == 404
        assert client.delete(f"/sessions/{bad}").status_code == 204
    assert client.post(f"/sessions/{sid}/exec", json=CODE).status_code == 200  # untouched
    client.delete(f"/sessions/{sid}")


def test_a_file_streams_through_the_front_both_ways(client: httpx.Client) -> None:
    sid = create(client)
    blob = bytes(range(256)) * 4096  # 1 MiB

    r = client.post(f"/sessions/{sid}/files", files={"file": ("b.bin", blob)}, data={"path": "b"})
    assert r.status_code == 201 and r.json()["size_bytes"] == len(blob)
    with client.stream("GET", f"/sessions/{sid}/files", params={"path": "b"}) as r:
        got = b"".join(r.iter_bytes())
        assert r.headers["x-content-type-options"] == "nosniff"
    assert got == blob
    client.delete(f"/sessions/{sid}")


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


def test_a_killed_node_answers_gone_at_once_and_new_sessions_go_elsewhere(
    fleet: LoopbackFleet, client: httpx.Client
) -> None:
    # Runs after the drain: node-0 has exited, node-1 holds everything.
    sid = create(client)
    assert node_of(sid) == "node-1"
    node1 = fleet.nodes["node-1"]
    assert node1.proc is not None
    node1.proc.kill()
    node1.proc.wait()
    t0 = time.monotonic()
    r = client.post(f"/sessions/{sid}/exec", json=CODE)
    assert time.monotonic() - t0 < 2
    assert r.status_code == 404 and "machine holding it (node-1)" in r.json()["detail"]
    assert client.get(f"/sessions/{sid}/files/list").status_code == 404
    assert client.delete(f"/sessions/{sid}").status_code == 204
    r = client.post("/sessions", json={})  # nowhere left to place it
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    assert client.get("/health").json()["nodes_up"] == 0
    # The machine comes back under its name (a restarted pod): its old sessions stay gone.
    node1.start()
    deadline = time.monotonic() + 10
    while client.get("/health").json()["nodes_up"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    r = client.post(f"/sessions/{sid}/exec", json=CODE)
    assert r.status_code == 404 and "machine holding it (node-1) restarted" in r.json()["detail"]
    again = create(client)
    assert node_of(again) == "node-1"
    assert client.post(f"/sessions/{again}/exec", json=CODE).status_code == 200
    client.delete(f"/sessions/{again}")


def test_dns_membership_and_tenants_through_a_front_with_exec_tokens(machine: None) -> None:
    with scratch_dir() as root:
        (root / "n").mkdir(mode=0o711)
        (root / "f").mkdir(mode=0o711)
        n = node(root / "n", "dns-node-7", pool_size=0).start()
        try:
            # `localhost` stands in for a headless Service: its A record is the node, which
            # names itself in its report.
            f = front(
                root / "f", [], fleet_nodes="", fleet_dns=f"localhost:{n.port}",
                exec_tokens="token-a,token-b",
            ).start()  # fmt: skip
            try:
                a = {"Authorization": "Bearer token-a"}
                b = {"Authorization": "Bearer token-b"}
                with f.client() as c:
                    assert c.post("/sessions", json={}).status_code == 401
                    sid = c.post("/sessions", json={}, headers=a).json()["session_id"]
                    assert node_of(sid) == "dns-node-7"
                    assert c.post(f"/sessions/{sid}/exec", json=CODE, headers=a).status_code == 200
                    # Another tenant's session does not exist for it, on any operation.
                    assert c.post(f"/sessions/{sid}/exec", json=CODE, headers=b).status_code == 404
                    assert c.get(f"/sessions/{sid}/files/list", headers=b).status_code == 404
                    assert c.delete(f"/sessions/{sid}", headers=b).status_code == 204
                    assert c.post(f"/sessions/{sid}/exec", json=CODE, headers=a).status_code == 200
                    # The drain command: no new session anywhere (503); with no call running,
                    # its sessions end at once.
                    token = {"Authorization": f"Bearer {TOKEN}"}
                    assert httpx.post(f"{n.base_url}/fleet/drain", headers=token).status_code == 202
                    r = c.post("/sessions", json={}, headers=a)
                    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
                    assert c.post(f"/sessions/{sid}/exec", json=CODE, headers=a).status_code == 404
                    assert capacity(n.base_url)["sessions"] == 0
            finally:
                f.stop()
        finally:
            n.stop()
