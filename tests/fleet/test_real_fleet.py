"""A real fleet on one machine: three nodes, each in a network namespace with its own address on
a bridge this test creates, and two fronts; kill -9, a cut link, a chat that loses its sandbox,
and a rolling restart of the fronts under traffic."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from tests.files.conftest import moto_endpoint  # noqa: F401 - a fixture, used by name
from tests.fleet.netns import Bridge, NetnsNode
from tests.fleet.support import NODE_LIMITS, TOKEN, scratch_dir
from tests.interpreter.fake_llm import FakeLLM, fake_llm
from tests.interpreter.harness import Client, Server, openai_env
from tests.postgres import running_postgres
from tests.support import TEST_LIMITS
from tests.tiers import needs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
CODE = {"tool": "code_execution", "input": {"code": "print(6 * 7)"}}
CSV = b"name,value\na,1\nb,2\nc,39\n"


class RealFleet:
    def __init__(self, root: Path, bridge: Bridge, llm: FakeLLM, storage: dict[str, str]) -> None:
        self.bridge = bridge
        self.nodes: list[NetnsNode] = []
        for i, (ns, addr) in enumerate(zip(bridge.namespaces, bridge.addresses, strict=True)):
            d = root / f"node-{i}"
            d.mkdir(mode=0o711)
            self.nodes.append(
                NetnsNode(
                    d, ns, addr, role="node", fleet_token=TOKEN, fleet_node_name=f"node-{i}",
                    **NODE_LIMITS,
                )
            )  # fmt: skip
        spec = ",".join(f"node-{i}={n.base_url}" for i, n in enumerate(self.nodes))
        front_env = {
            "SANDBANK_ROLE": "front",
            "SANDBANK_FLEET_TOKEN": TOKEN,
            "SANDBANK_FLEET_NODES": spec,
            "SANDBANK_FLEET_REFRESH_SECONDS": "0.5",
            "SANDBANK_SHUTDOWN_DELAY_SECONDS": "1",
            "SANDBANK_RUNTIME_DIR": str(TEST_LIMITS["runtime_dir"]),
        }
        self.fronts = []
        for name, env in (
            # With the interpreter API, on PostgreSQL and S3.
            ("front-a", {**front_env, **openai_env(llm.url), **storage}),
            ("front-b", {**front_env, "SANDBANK_INTERPRETER_API": "off"}),
        ):
            d = root / name
            d.mkdir(mode=0o711)
            ready = "/api/openapi.json" if name == "front-a" else "/health"
            self.fronts.append(Server(d, env, ready))

    def start(self) -> RealFleet:
        try:
            for n in self.nodes:
                n.launch()
            for n in self.nodes:
                n.wait_ready()
            for f in self.fronts:
                f.start()
        except BaseException:
            self.stop()  # what did start is not left running
            raise
        return self

    def stop(self) -> None:
        for f in self.fronts:
            if f.proc is not None and f.proc.poll() is None:
                f.stop()
        for i, n in enumerate(self.nodes):
            killed = n.proc is not None and n.proc.poll() is not None
            self.bridge.link(i, up=True)
            if killed:  # a node started on its data dir removes what the killed one left
                with contextlib.suppress(RuntimeError):
                    n.launch()
                    n.wait_ready()
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()
                n.proc.wait(30)


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    with fake_llm() as fake:
        yield fake


@pytest.fixture(scope="module")
@needs("postgres", "s3")
def storage(moto_endpoint: str) -> Iterator[dict[str, str]]:  # noqa: F811
    """The suite's PostgreSQL and S3 (moto) servers, for the front with the interpreter API."""
    bucket = f"sandbank-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    with running_postgres() as database_url:
        yield {
            "SANDBANK_DATABASE_URL": database_url,
            "SANDBANK_STORAGE_URL": f"s3://{bucket}/objects",
            "SANDBANK_S3_ENDPOINT_URL": moto_endpoint,
            "SANDBANK_S3_REGION": "us-east-1",
            "SANDBANK_S3_ACCESS_KEY_ID": "testing",
            "SANDBANK_S3_SECRET_ACCESS_KEY": "testing",
        }


@pytest.fixture(scope="module")
@needs("root")
def fleet(llm: FakeLLM, storage: dict[str, str]) -> Iterator[RealFleet]:
    bridge = Bridge(3).create()
    try:
        with scratch_dir() as root:
            f = RealFleet(root, bridge, llm, storage)
            try:
                yield f.start()
            finally:
                f.stop()
    finally:
        bridge.remove()


@pytest.fixture(scope="module")
def alice(fleet: RealFleet) -> Iterator[Client]:
    with fleet.fronts[0].new_user() as client:
        yield client


def http(fleet: RealFleet, i: int = 0) -> httpx.Client:
    return httpx.Client(base_url=fleet.fronts[i].url, timeout=30)


def node_of(session_id: str) -> str:
    return session_id.split(".")[0]


def sessions_on(fleet: RealFleet, i: int) -> int:
    r = httpx.get(
        f"{fleet.nodes[i].base_url}/fleet/capacity",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=2,
    )
    return int(r.json()["sessions"])


def test_sessions_spread_over_the_three_machines_from_either_front(fleet: RealFleet) -> None:
    with http(fleet, 0) as a, http(fleet, 1) as b:
        page = a.get("/")  # the front with the interpreter API serves the web page too
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        sids = [
            (a if i % 2 else b).post("/sessions", json={}).json()["session_id"] for i in range(9)
        ]
        assert {node_of(s) for s in sids} == {"node-0", "node-1", "node-2"}
        for i, sid in enumerate(sids):  # any front routes any session
            r = (b if i % 2 else a).post(f"/sessions/{sid}/exec", json=CODE)
            assert r.json()["result_block"]["content"]["stdout"] == "42\n"
            assert (a if i % 2 else b).delete(f"/sessions/{sid}").status_code == 204


def test_kill_9_of_a_node_a_clear_404_at_once_new_sessions_elsewhere_the_chat_recovers(
    fleet: RealFleet, alice: Client, llm: FakeLLM
) -> None:
    chat = alice.new_session()
    assert alice.upload(chat, "data.csv", CSV).status_code == 204
    alice.ask(chat, "Draw a chart of data.csv")
    assert alice.wait(chat)["status"] == "DONE"
    holder = next(i for i in range(3) if sessions_on(fleet, i) == 1)  # the chat's sandbox
    with http(fleet, 1) as c:
        # Held until some land on the holder: the front places each on the least loaded node,
        # and one ended at once would leave the others emptier than the holder every time.
        sids: list[str] = []
        others: list[str] = []
        for _ in range(12):
            sid = c.post("/sessions", json={}).json()["session_id"]
            (sids if node_of(sid) == f"node-{holder}" else others).append(sid)
        for sid in others:
            c.delete(f"/sessions/{sid}")
        assert sids
        proc = fleet.nodes[holder].proc
        assert proc is not None
        proc.kill()
        proc.wait()
        t0 = time.monotonic()
        r = c.post(f"/sessions/{sids[0]}/exec", json=CODE)
        assert time.monotonic() - t0 < 2
        assert r.status_code == 404
        assert f"the machine holding it (node-{holder})" in r.json()["detail"]
        time.sleep(1)  # both fronts' health checks have seen it by now
        for front in (0, 1):
            with http(fleet, front) as f:
                t0 = time.monotonic()
                assert f.get(f"/sessions/{sids[-1]}/files/list").status_code == 404
                assert time.monotonic() - t0 < 0.5
                placed = [f.post("/sessions", json={}).json()["session_id"] for _ in range(4)]
                assert f"node-{holder}" not in {node_of(s) for s in placed}
                for sid in placed:
                    f.delete(f"/sessions/{sid}")
    # The chat's next question gets a new sandbox with its files, and the agent is told.
    asked = len(llm.requests)
    alice.ask(chat, "Draw a chart of data.csv again")
    session = alice.wait(chat)
    assert session["status"] == "DONE", session
    messages = alice.ok("GET", f"/api/sessions/{chat}/messages")
    assert "TOTAL 42" in messages[-1]["content"]
    prompts = [str(r["messages"][0]["content"]) for r in llm.requests[asked:]]
    assert any("the sandbox was restarted" in p for p in prompts)


def test_a_node_cut_off_answers_promptly_and_is_back_when_its_link_is(fleet: RealFleet) -> None:
    alive = [i for i, n in enumerate(fleet.nodes) if n.proc is not None and n.proc.poll() is None]
    cut = alive[0]
    with http(fleet, 0) as c:
        sid = next(
            s
            for s in (c.post("/sessions", json={}).json()["session_id"] for _ in range(12))
            if node_of(s) == f"node-{cut}"
        )
        out: dict[str, Any] = {}

        def long_call() -> None:
            with http(fleet, 0) as c2:
                t0 = time.monotonic()
                body = {"tool": "code_execution", "input": {"code": "import time; time.sleep(25)"}}
                out["r"] = c2.post(f"/sessions/{sid}/exec", json=body)
                out["t"] = time.monotonic() - t0

        t = threading.Thread(target=long_call)
        t.start()
        time.sleep(0.5)
        fleet.bridge.link(cut, up=False)
        t.join(10)
        assert out["r"].status_code == 404 and out["t"] < 0.5 + 4
        assert f"node-{cut}" in out["r"].json()["detail"]
        t0 = time.monotonic()
        assert c.post(f"/sessions/{sid}/exec", json=CODE).status_code == 404
        assert time.monotonic() - t0 < 0.5
        placed = [c.post("/sessions", json={}).json()["session_id"] for _ in range(3)]
        assert f"node-{cut}" not in {node_of(s) for s in placed}
        fleet.bridge.link(cut, up=True)
        # Back for both fronts (each checks on its own), before the next test sends through either.
        for front in (0, 1):
            with http(fleet, front) as f:
                deadline = time.monotonic() + 10
                while (
                    f.get("/health").json()["nodes_up"] < len(alive) and time.monotonic() < deadline
                ):
                    time.sleep(0.2)
                assert f.get("/health").json()["nodes_up"] == len(alive)
        for s in placed:
            c.delete(f"/sessions/{s}")


class ServiceLike:
    """What a Kubernetes Service gives clients of the fronts: only ready endpoints, and a new
    connection per request (so no request is ever sent on a connection a front is closing)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.ready = set(urls)
        self.stop = threading.Event()
        self.rr = itertools.count()
        self.checker = threading.Thread(target=self._check, daemon=True)
        self.checker.start()

    def _check(self) -> None:
        while not self.stop.wait(0.1):
            for url in self.urls:
                try:
                    ok = httpx.get(f"{url}/health", timeout=0.5).status_code == 200
                except httpx.HTTPError:
                    ok = False
                (self.ready.add if ok else self.ready.discard)(url)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for _ in range(50):
            ready = sorted(self.ready)
            if ready:
                url = ready[next(self.rr) % len(ready)]
                try:
                    return httpx.request(method, url + path, timeout=30, **kwargs)
                except httpx.ConnectError:
                    pass  # never reached the front: safe to send elsewhere
            time.sleep(0.05)
        raise AssertionError("no front was ready for 2.5 s")


def test_a_rolling_restart_of_both_fronts_under_traffic_fails_no_request(
    fleet: RealFleet,
) -> None:
    service = ServiceLike([f.url for f in fleet.fronts])
    failures: list[str] = []
    done = threading.Event()
    cycles = [0]

    def traffic() -> None:
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline and cycles[0] < 2000:
            try:
                r = service.request("POST", "/sessions", json={})
                if r.status_code != 201:
                    failures.append(f"create {r.status_code} {r.text}")
                    continue
                sid = r.json()["session_id"]
                r = service.request("POST", f"/sessions/{sid}/exec", json=CODE)
                if r.status_code != 200 or "42" not in r.text:
                    failures.append(f"exec {r.status_code} {r.text}")
                r = service.request("DELETE", f"/sessions/{sid}")
                if r.status_code != 204:
                    failures.append(f"destroy {r.status_code}")
                cycles[0] += 1
            except (httpx.HTTPError, AssertionError) as e:
                failures.append(repr(e))

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        time.sleep(1)
        for front in fleet.fronts:
            before = cycles[0]
            front.stop()
            front.start()
            time.sleep(1)
            assert cycles[0] > before  # traffic went on through the restart
    finally:
        done.set()
        worker.join(60)
        service.stop.set()
    assert failures == []
    assert cycles[0] > 4
