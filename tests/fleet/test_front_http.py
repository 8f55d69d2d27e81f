"""A fleet over fakes (two nodes and a front in this process): routing, tokens, capacity, DNS.

Each node is the whole app on the fake backend, served by uvicorn on loopback; the front is the
whole app with the fleet role. The fake sandboxes keep one variable in their workspace, enough
to see that each call reaches the node holding its session. test_front.py keeps, with real
processes, what needs one: a node that drains on SIGTERM, a node killed and restarted.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from tests.fakeapp import FakeApp, canned
from tests.fleet.support import NODE_LIMITS, TOKEN
from tests.fleet.test_front import CODE, capacity, create, node_of
from tests.support import free_port


async def one_variable(call: ToolCall, workspace: Path) -> ExecResult:
    """`x = 'text'` keeps the text in the sandbox; `print(x)` prints it; the rest is canned."""
    if isinstance(call, PythonCall) and call.code.startswith("x = "):
        (workspace / ".x").write_text(ast.literal_eval(call.code.removeprefix("x = ")))
        return ExecResult()
    if isinstance(call, PythonCall) and call.code == "print(x)":
        return ExecResult(stdout=(workspace / ".x").read_text() + "\n")
    return await canned(call, workspace)


def fake_node(name: str, **overrides: Any) -> FakeApp:
    settings = {**NODE_LIMITS, **overrides}
    return FakeApp(one_variable, role="node", fleet_token=TOKEN, fleet_node_name=name, **settings)


def fake_front(**overrides: Any) -> FakeApp:
    settings: dict[str, Any] = {
        "role": "front",
        "fleet_token": TOKEN,
        "interpreter_api": "off",
        "exec_timeout_max": 30,
        "exec_timeout_default": 30,
        "fleet_refresh_seconds": 0.5,
    }
    return FakeApp(**{**settings, **overrides})


class FakeFleet:
    def __init__(self, nodes: dict[str, str], front: FakeApp) -> None:
        self.nodes = nodes  # name → base URL
        self.front = front


@pytest.fixture(scope="module")
def fleet() -> Iterator[FakeFleet]:
    with contextlib.ExitStack() as stack:
        nodes = {f"node-{i}": stack.enter_context(fake_node(f"node-{i}").serving()) for i in (0, 1)}
        front = fake_front(fleet_nodes=",".join(f"{n}={url}" for n, url in nodes.items()))
        stack.enter_context(front.running())
        yield FakeFleet(nodes, front)


@pytest.fixture
def client(fleet: FakeFleet) -> httpx.Client:
    assert fleet.front.http is not None
    return fleet.front.http


def test_a_node_answers_only_the_fleet_token(fleet: FakeFleet) -> None:
    url = fleet.nodes["node-0"]
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
    fleet: FakeFleet, client: httpx.Client
) -> None:
    sid = create(client)
    for _ in range(100):  # a report sent before the placement may land after it: the next counts it
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples
        }
        used = [samples[("sandbank_fleet_node_sessions", (("node", n),))] for n in fleet.nodes]
        if sum(used) >= 1:
            break
        time.sleep(0.05)
    assert samples[("sandbank_fleet_nodes", (("state", "accepting"),))] == 2
    assert samples[("sandbank_fleet_nodes", (("state", "down"),))] == 0
    for name in ("node-0", "node-1"):
        assert samples[("sandbank_fleet_node_max_sessions", (("node", name),))] == 6
    assert sum(used) >= 1  # the session just placed (reported, or counted as placed)
    node = httpx.get(
        f"{fleet.nodes[node_of(sid)]}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).text
    assert "sandbank_sessions_max 6.0" in node
    client.delete(f"/sessions/{sid}")


def test_pause_and_resume_reach_the_node_holding_the_session(client: httpx.Client) -> None:
    sid = create(client)
    r = client.post(f"/sessions/{sid}/resume")  # running already: its handle, by its public id
    assert r.status_code == 200 and r.json()["session_id"] == sid
    assert r.json()["state"] == "running"
    r = client.post(f"/sessions/{sid}/pause")  # the node's answer: fakes keep no snapshots
    assert r.status_code == 409
    assert r.json()["detail"] == (
        "sessions cannot be paused on this server: its isolation (fake) keeps no snapshots"
    )
    assert client.post(f"/sessions/{sid[:-2]}xx/pause").status_code == 404
    assert client.delete(f"/sessions/{sid}").status_code == 204


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


def test_dns_membership_and_tenants_through_a_front_with_exec_tokens() -> None:
    with fake_node("dns-node-7", pool_size=0).serving() as url:
        port = url.rsplit(":", 1)[1]
        # `localhost` stands in for a headless Service: its A record is the node, which
        # names itself in its report.
        f = fake_front(fleet_nodes="", fleet_dns=f"localhost:{port}", exec_tokens="token-a,token-b")
        with f.running() as c:
            a = {"Authorization": "Bearer token-a"}
            b = {"Authorization": "Bearer token-b"}
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
            assert httpx.post(f"{url}/fleet/drain", headers=token).status_code == 202
            r = c.post("/sessions", json={}, headers=a)
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
            assert c.post(f"/sessions/{sid}/exec", json=CODE, headers=a).status_code == 404
            assert capacity(url)["sessions"] == 0


def test_a_node_full_by_its_last_report_is_asked_and_makes_room() -> None:
    """The front's count is a report old: sessions it placed since count as busy. A node that
    is full by that count is asked all the same; it reclaims an idle session (as one server
    does) and the client is not told the fleet is full."""
    with fake_node("full-node", pool_size=0, max_sessions=2).serving() as url:
        # One report, at the start: every placement after it is this front's own count.
        f = fake_front(fleet_nodes=f"full-node={url}", fleet_refresh_seconds=60)
        with f.running() as c:
            sids = [create(c) for _ in range(4)]
            assert capacity(url)["sessions"] == 2  # the two oldest were reclaimed
            r = c.post(f"/sessions/{sids[-1]}/exec", json=CODE)
            assert r.status_code == 200
            assert c.post(f"/sessions/{sids[0]}/exec", json=CODE).status_code == 404


def test_a_session_is_placed_on_a_node_that_offers_the_isolation_it_asks_for() -> None:
    with contextlib.ExitStack() as stack:
        urls = {
            iso: stack.enter_context(fake_node(f"node-{iso}", isolation=iso).serving())
            for iso in ("fork", "gvisor")
        }
        f = fake_front(fleet_nodes=",".join(f"node-{i}={u}" for i, u in urls.items()))
        c = stack.enter_context(f.running())
        for iso in ("gvisor", "fork", "gvisor", "fork"):
            r = c.post("/sessions", json={"isolation": iso})
            assert r.status_code == 201, r.text
            assert node_of(r.json()["session_id"]) == f"node-{iso}"
            assert r.json()["isolation"] == iso
        r = c.post("/sessions", json={"isolation": "bwrap"})
        assert r.status_code == 422
        assert "'fork', 'gvisor'" in r.json()["detail"], r.text
        assert capacity(urls["fork"])["isolations"] == ["fork"]


def test_a_front_applies_the_operators_isolation_rule_for_a_tenant() -> None:
    """The nodes see no clients' tenants: the front forces a tenant's isolation
    (`SANDBANK_TENANT_ISOLATION`) on its sessions, and refuses another asked for."""
    forced = hashlib.sha256(b"token-b").hexdigest()[:8]
    with contextlib.ExitStack() as stack:
        urls = {
            iso: stack.enter_context(fake_node(f"node-{iso}", isolation=iso).serving())
            for iso in ("fork", "gvisor")
        }
        f = fake_front(
            fleet_nodes=",".join(f"node-{i}={u}" for i, u in urls.items()),
            exec_tokens="token-a,token-b",
            tenant_isolation=f"{forced}=gvisor",
        )
        c = stack.enter_context(f.running())
        b = {"Authorization": "Bearer token-b"}
        for body in ({}, {"isolation": "gvisor"}, {"labels": {"k": "v"}}):
            r = c.post("/sessions", json=body, headers=b)
            assert r.status_code == 201, r.text
            assert (r.json()["isolation"], node_of(r.json()["session_id"])) == (
                "gvisor",
                "node-gvisor",
            )
        r = c.post("/sessions", json={"isolation": "fork"}, headers=b)
        assert r.status_code == 422 and "SANDBANK_TENANT_ISOLATION" in r.json()["detail"], r.text
        a = {"Authorization": "Bearer token-a"}  # no rule: its hint stands
        r = c.post("/sessions", json={"isolation": "fork"}, headers=a)
        assert (r.status_code, r.json()["isolation"]) == (201, "fork"), r.text


def test_a_client_cannot_name_a_session_through_a_front(client: httpx.Client) -> None:
    """The node's name header is the fronts' alone: a client's never passes a front (were it
    passed, the node would give the named session back twice)."""
    headers = {"x-sandbank-session-name": "someone-else"}
    made = [client.post("/sessions", json={}, headers=headers).json()["session_id"] for _ in "ab"]
    for sid in made:
        client.delete(f"/sessions/{sid}")
    assert made[0] != made[1]


def _until_nodes_up(client: httpx.Client, count: int) -> None:
    deadline = time.monotonic() + 10
    while client.get("/health").json()["nodes_up"] != count:
        assert time.monotonic() < deadline, f"never {count} nodes up"
        time.sleep(0.05)


def test_a_lost_node_answers_gone_at_once_and_its_return_is_a_restart() -> None:
    """A node that stops answering (its process gone: here its listener closed) makes its
    sessions 404 at once; back under its name, it is another instance and they stay gone
    (test_real_fleet.py has a node killed with SIGKILL)."""
    port = free_port()
    front = fake_front(fleet_nodes=f"node-1=http://127.0.0.1:{port}")
    with front.running() as client:
        with fake_node("node-1").serving(port):
            _until_nodes_up(client, 1)
            sid = create(client)
            assert node_of(sid) == "node-1"
        t0 = time.monotonic()
        r = client.post(f"/sessions/{sid}/exec", json=CODE)
        assert time.monotonic() - t0 < 2
        assert r.status_code == 404 and "machine holding it (node-1)" in r.json()["detail"]
        assert client.get(f"/sessions/{sid}/files/list").status_code == 404
        assert client.delete(f"/sessions/{sid}").status_code == 204
        r = client.post("/sessions", json={})  # nowhere left to place it
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        assert client.get("/health").json()["nodes_up"] == 0
        with fake_node("node-1").serving(port):  # back under its name
            _until_nodes_up(client, 1)
            r = client.post(f"/sessions/{sid}/exec", json=CODE)
            assert r.status_code == 404
            assert "machine holding it (node-1) restarted" in r.json()["detail"]
            again = create(client)
            assert client.post(f"/sessions/{again}/exec", json=CODE).status_code == 200


def test_a_front_reaches_its_nodes_directly_whatever_proxy_its_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy the operator names for the model's API (HTTP_PROXY...) is not the way to the
    fleet's nodes: the capacity probes went there (and found nothing), the calls did not."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
        monkeypatch.setenv(name.lower(), dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with fake_node("node-1").serving() as url:
        front = fake_front(fleet_nodes=f"node-1={url}")
        with front.running() as client:
            _until_nodes_up(client, 1)
            sid = create(client)
            assert client.post(f"/sessions/{sid}/exec", json=CODE).status_code == 200
