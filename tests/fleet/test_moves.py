"""A drained node's sessions continue on another node, through the front, under the same ids:
two real nodes and a front, the nodes' snapshots moving through S3 (a moto server)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import httpx
import pytest

from sandbank.fleet.moves import move_key
from tests.files.conftest import moto_endpoint  # noqa: F401 - a fixture, used by name
from tests.fleet.support import TOKEN, LoopbackFleet, front, scratch_dir
from tests.support import Server
from tests.tiers import needs

TENANTS = ("token-a", "token-b")


class S3Fleet(LoopbackFleet):
    """Two nodes and a front; the nodes' object store a bucket of the moto server."""

    snapshots: Callable[[], list[str]]


@contextlib.contextmanager
def s3_fleet(endpoint: str, **node_overrides: Any) -> Iterator[S3Fleet]:
    bucket = f"sandbank-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=bucket)
    storage = {
        "storage_url": f"s3://{bucket}/fleet",
        "s3_endpoint_url": endpoint,
        "s3_region": "us-east-1",
        "s3_access_key_id": "testing",
        "s3_secret_access_key": "testing",
    }
    nodes = {**storage, "pause_on_shutdown": True, "fleet_drain_grace_seconds": 2}
    with scratch_dir() as root:
        f = S3Fleet(
            root, nodes=2, node_overrides={**nodes, **node_overrides}, exec_tokens=",".join(TENANTS)
        )

        def snapshots() -> list[str]:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix="fleet/snapshots/")
            return [o["Key"] for o in listed.get("Contents", [])]

        f.snapshots = snapshots
        f.start()
        try:
            yield f
        finally:
            f.stop()


@pytest.fixture(scope="module")
@needs("root", "s3")
def fleet(moto_endpoint: str) -> Iterator[S3Fleet]:  # noqa: F811
    with s3_fleet(moto_endpoint) as f:
        yield f


@pytest.fixture
@needs("root", "s3")
def checkpointing(moto_endpoint: str) -> Iterator[S3Fleet]:  # noqa: F811
    """Nodes that checkpoint a session idle for a second, the checkpoint copied to S3."""
    with s3_fleet(moto_endpoint, checkpoint_after_idle_seconds=1, reaper_interval_seconds=0.5) as f:
        yield f


def run(c: httpx.Client, sid: str, code: str, token: str = TENANTS[0]) -> httpx.Response:
    body = {"tool": "code_execution", "input": {"code": code}}
    return c.post(f"/sessions/{sid}/exec", json=body, headers={"Authorization": f"Bearer {token}"})


def stdout(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    out: str = r.json()["result_block"]["content"]["stdout"]
    return out


def moved(url: str, direction: str) -> int:
    """A node's count of sessions moved (its /metrics, behind the fleet token)."""
    r = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    line = f'sandbank_fleet_sessions_moved_total{{direction="{direction}"}} '
    found = [row for row in r.text.splitlines() if row.startswith(line)]
    return int(float(found[0].removeprefix(line))) if found else 0


def capacity(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/fleet/capacity", headers={"Authorization": f"Bearer {TOKEN}"})
    report: dict[str, Any] = r.json()
    return report


def test_a_drained_nodes_sessions_continue_on_another_node_with_the_same_ids(
    fleet: S3Fleet,
) -> None:
    auth = {"Authorization": f"Bearer {TENANTS[0]}"}
    with fleet.client() as c:
        sids = []
        for _ in range(4):  # placement spreads them: some land on each node
            r = c.post("/sessions", json={}, headers=auth)
            assert r.status_code == 201, r.text
            sids.append(r.json()["session_id"])
        sid = next(s for s in sids if s.startswith("node-0."))
        assert stdout(run(c, sid, "_ = open('notes.txt', 'w').write('kept')")) == ""
        drained = fleet.nodes["node-0"].base_url
        running: list[httpx.Response] = []
        call = threading.Thread(
            target=lambda: running.append(run(c, sid, "import time; time.sleep(1.5); x = 41"))
        )
        call.start()
        wait_for(lambda: capacity(drained)["inflight"] > 0, 10)
        r = httpx.post(f"{drained}/fleet/drain", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 202
        # Within the drain's grace, the node still serves its sessions' calls.
        assert stdout(run(c, sid, "print('during the grace')")) == "during the grace\n"
        call.join(10)
        assert stdout(running[0]) == ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            report = capacity(drained)
            if report["sessions"] == 0 and not report["moving"]:
                break
            time.sleep(0.2)
        assert report["sessions"] == 0 and report["draining"]
        # Each moved as its signed manifest, its state and its disk's data (not its holes).
        on_0 = sum(s.startswith("node-0.") for s in sids)
        assert len(fleet.snapshots()) == 3 * on_0
        assert moved(drained, "out") == on_0

        # The same id, through the front: its variables and files, now on node-1.
        assert stdout(run(c, sid, "print(x + 1)")) == "42\n"
        assert stdout(run(c, sid, "print(open('notes.txt').read())")) == "kept\n"
        # Another tenant's call with the id is answered as for an unknown session.
        assert run(c, sid, "print(x)", token=TENANTS[1]).status_code == 404
        # A second front, which has seen none of this, finds it too.
        with second_front(fleet) as other_front, other_front.client() as c2:
            assert stdout(run(c2, sid, "x += 1\nprint(x)")) == "42\n"
        assert stdout(run(c, sid, "print(x)")) == "42\n"
        # Every session continues, and is ended by its id.
        for other in sids:
            assert stdout(run(c, other, "print('here')")) == "here\n"
        assert capacity(fleet.nodes["node-1"].base_url)["sessions"] == len(sids)
        assert fleet.snapshots() == []  # each adopted once, then removed from the bucket
        assert moved(fleet.nodes["node-1"].base_url, "in") == on_0
        for other in sids:
            assert c.delete(f"/sessions/{other}", headers=auth).status_code == 204
        assert run(c, sid, "print(x)").status_code == 404


@contextlib.contextmanager
def second_front(fleet: LoopbackFleet) -> Iterator[Server]:
    d = fleet.front.data.parent / "front-2"
    d.mkdir(mode=0o711)
    nodes = [(name, s.base_url) for name, s in fleet.nodes.items()]
    server = front(d, nodes, exec_tokens=",".join(TENANTS)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
@needs("root")
def lone_node() -> Iterator[LoopbackFleet]:
    """One node on its own data directory (the object store there too) and a front."""
    nodes = {"pause_on_shutdown": True, "fleet_drain_grace_seconds": 1}
    with scratch_dir() as root:
        f = LoopbackFleet(root, nodes=1, node_overrides=nodes).start()
        try:
            yield f
        finally:
            f.stop()


def test_a_node_restarted_on_its_data_directory_finds_its_moved_sessions_again(
    lone_node: LoopbackFleet,
) -> None:
    with lone_node.client() as c:
        r = c.post("/sessions", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        assert stdout(run(c, sid, "y = 'still here'")) == ""
        node = lone_node.nodes["node-0"]
        node.stop()  # SIGTERM: it drains, and moves its session to DATA_DIR/objects
        node.start()  # another instance under the same name
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = run(c, sid, "print(y)")
            if r.status_code != 404 or "is gone" not in r.text:
                break
            time.sleep(0.2)  # until the front has heard from the new instance
        assert stdout(r) == "still here\n"


def key_of(public: str) -> str:
    node, tagged, _ = public.split(".")
    return move_key(node, tagged)


def wait_for(check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.2)


def test_a_lost_nodes_checkpointed_session_continues_on_another_node(
    checkpointing: S3Fleet,
) -> None:
    fleet = checkpointing
    auth = {"Authorization": f"Bearer {TENANTS[0]}"}
    with fleet.client() as c:
        sids = []
        for _ in range(4):
            r = c.post("/sessions", json={}, headers=auth)
            assert r.status_code == 201, r.text
            sids.append(r.json()["session_id"])
            first_on_0 = not any(s.startswith("node-0.") for s in sids[:-1])
            if sids[-1].startswith("node-0.") and first_on_0:
                # At once, before it has been idle long enough for a checkpoint without x.
                code = "x = 41\n_ = open('notes.txt', 'w').write('kept')"
                assert stdout(run(c, sids[-1], code)) == ""
        sid = next(s for s in sids if s.startswith("node-0."))
        manifest = f"fleet/snapshots/{key_of(sid)}/manifest.json"
        wait_for(lambda: manifest in fleet.snapshots(), 20)  # its checkpoint, copied off
        fleet.nodes["node-0"].stop(signal.SIGKILL)

        replies: list[httpx.Response] = []

        def answered() -> bool:
            replies.append(run(c, sid, "print(x + 1)"))
            return replies[-1].status_code != 404 or "is gone" not in replies[-1].text

        wait_for(answered, 10)  # the call that finds the node gone is told so
        assert stdout(replies[-1]) == "42\n"
        assert stdout(run(c, sid, "print(open('notes.txt').read())")) == "kept\n"
        assert manifest not in fleet.snapshots()  # adopted once

        # A session ended for good takes its exported checkpoint with it.
        on_1 = next(s for s in sids if s.startswith("node-1."))
        assert stdout(run(c, on_1, "y = 1")) == ""
        copied = f"fleet/snapshots/{key_of(on_1)}/manifest.json"
        wait_for(lambda: copied in fleet.snapshots(), 20)
        assert c.delete(f"/sessions/{on_1}", headers=auth).status_code == 204
        wait_for(lambda: not any(key_of(on_1) in k for k in fleet.snapshots()), 10)
        assert run(c, on_1, "print(y)").status_code == 404
