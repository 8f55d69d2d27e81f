"""The fleet overlays/production describes, run on loopback with its own settings: its replica
counts, ConfigMap and Secret values (from the .example files) as the pods would read them, and
the README's first-user step; only what names the cluster is replaced (`LOOPBACK`)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import boto3
import httpx
import pytest

from tests.files.conftest import moto_endpoint  # noqa: F401 - a fixture, used by name
from tests.fleet.kustomize import render
from tests.fleet.support import scratch_dir
from tests.fleet.test_deploy import copy_with_secrets, environment, one
from tests.interpreter.fake_llm import FakeLLM, fake_llm
from tests.interpreter.harness import Client, openai_env
from tests.postgres import running_postgres
from tests.support import SANDBANK, Server, free_port
from tests.tiers import needs

# What a cluster gives and loopback cannot: each replaced, nothing else.
LOOPBACK = (
    "SANDBANK_FLEET_DNS",  # the nodes' A records: here a static list of loopback ports
    "SANDBANK_DATABASE_URL",  # a PostgreSQL this test starts
    "SANDBANK_STORAGE_URL",  # a bucket of moto's S3 server
    "SANDBANK_S3_ENDPOINT_URL",
    "SANDBANK_S3_ACCESS_KEY_ID",
    "SANDBANK_S3_SECRET_ACCESS_KEY",
    "SANDBANK_S3_REGION",
    "SANDBANK_PUBLIC_BASE_URL",  # the first front's loopback address
    "SANDBANK_LLM_MODEL",  # the scripted model on loopback
    "SANDBANK_LLM_API_KEY",
)
CSV = b"name,value\nnorth,1\nsouth,41\n"


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    with fake_llm() as fake:
        yield fake


@dataclass
class Fleet:
    fronts: list[Server]
    nodes: list[Server]
    front_env: dict[str, str]
    node_env: dict[str, str]


@pytest.fixture(scope="module")
@needs("root", "postgres")
def fleet(moto_endpoint: str, llm: FakeLLM) -> Iterator[Fleet]:  # noqa: F811
    with scratch_dir() as root:
        docs = render(copy_with_secrets(root) / "overlays" / "production")
        front_env = environment(docs, "Deployment")
        node_env = environment(docs, "StatefulSet")
        node_count = one(docs, "StatefulSet")["spec"]["replicas"]
        front_count = one(docs, "Deployment", "sandbank-front")["spec"]["replicas"]
        bucket = f"sandbank-{uuid.uuid4().hex[:12]}"
        s3 = {"SANDBANK_S3_ENDPOINT_URL": moto_endpoint, "SANDBANK_S3_REGION": "us-east-1",
              "SANDBANK_S3_ACCESS_KEY_ID": "testing", "SANDBANK_S3_SECRET_ACCESS_KEY": "testing"}  # fmt: skip
        boto3.client(
            "s3", endpoint_url=moto_endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        ).create_bucket(Bucket=bucket)  # fmt: skip
        with running_postgres() as database_url:
            nodes = []
            for i in range(node_count):
                d = root / f"node-{i}"
                d.mkdir(mode=0o711)
                env = {**node_env, "SANDBANK_FLEET_NODE_NAME": f"sandbank-node-{i}"}
                nodes.append(Server(d, {k: v for k, v in env.items() if k not in LOOPBACK}))
            fronts = []
            for i in range(front_count):
                d = root / f"front-{i}"
                d.mkdir(mode=0o711)
                fronts.append(Server(d, {}, ready="/api/openapi.json"))
            listed = ",".join(f"sandbank-node-{i}={n.url}" for i, n in enumerate(nodes))
            for front in fronts:
                front.env.update({k: v for k, v in front_env.items() if k not in LOOPBACK})
                front.env.update(
                    {
                        "SANDBANK_FLEET_NODES": listed,
                        "SANDBANK_DATABASE_URL": database_url,
                        "SANDBANK_STORAGE_URL": f"s3://{bucket}/prod",
                        **s3,
                        "SANDBANK_PUBLIC_BASE_URL": fronts[0].url,
                        "SANDBANK_ALLOWED_HOSTS": front_env["SANDBANK_ALLOWED_HOSTS"]
                        + ",127.0.0.1",
                        **openai_env(llm.url),
                    }
                )
            servers = nodes + fronts
            try:
                with ThreadPoolExecutor(len(nodes)) as pool:
                    for started in [pool.submit(n.start) for n in nodes]:
                        started.result()
                with ThreadPoolExecutor(len(fronts)) as pool:  # their migrations race
                    for started in [pool.submit(f.start) for f in fronts]:
                        started.result()
                yield Fleet(fronts, nodes, front_env, node_env)
            finally:
                logs = []
                for server in servers:
                    if server.proc is not None and server.proc.poll() is None:
                        server.stop()
                    logs.append(server.log.read_text())
                for server in servers:
                    shutil.rmtree(server.data, ignore_errors=True)
    for log in logs:
        assert "Traceback" not in log, log[-5000:]


def test_each_process_says_what_it_is(fleet: Fleet) -> None:
    for i, node in enumerate(fleet.nodes):
        assert f": fleet node sandbank-node-{i} on " in node.log.read_text()
    for front in fleet.fronts:
        assert ": fleet front (nodes: sandbank-node-0=" in front.log.read_text()


def test_the_first_user_then_a_chat_served_by_every_front(fleet: Fleet) -> None:
    """`kubectl exec deploy/sandbank-front -- sandbank users create NAME` (README), then the page's
    calls: an upload through S3, a question, its answer read through the other front."""
    a, b = fleet.fronts
    made = subprocess.run(
        [SANDBANK, "users", "create", "alice"],
        env=a.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    with Client(a.url, key, "alice") as on_a, Client(b.url, key, "alice") as on_b:
        sid = on_a.new_session()
        assert on_b.upload(sid, "data.csv", CSV).status_code == 204  # straight to S3
        on_b.ask(sid, "Make a chart of data.csv")
        assert on_a.wait(sid)["status"] == "DONE"
        answer = on_b.ok("GET", f"/api/sessions/{sid}/messages")[-1]
        assert answer["role"] == "assistant" and "TOTAL 42" in answer["content"]
        assert {f["filename"] for f in on_a.ok("GET", f"/api/sessions/{sid}/files")} == {
            "data.csv",
            "chart.png",
        }
    page = httpx.get(b.url + "/")
    assert (
        page.status_code == 200 and "connect-src 'self' " in page.headers["content-security-policy"]
    )  # and the S3 endpoint the browser uploads to
    config = httpx.get(b.url + "/ui/config.json").json()
    assert config["assistant"]["available"] is True


def test_the_code_execution_api_through_either_front(fleet: Fleet) -> None:
    a, b = fleet.fronts
    token = fleet.front_env["SANDBANK_EXEC_TOKENS"].split(",")[0]
    auth = {"Authorization": f"Bearer {token}"}
    created = httpx.post(a.url + "/sessions", json={}, headers=auth)
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    assert sid.startswith("sandbank-node-")  # never an option character
    run = httpx.post(
        f"{b.url}/sessions/{sid}/exec",
        json={"tool": "code_execution", "input": {"code": "print(6 * 7)"}},
        headers=auth,
        timeout=60,
    )
    assert run.json()["result_block"]["content"]["stdout"] == "42\n"
    refused = httpx.post(a.url + "/sessions", json={})
    assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    httpx.delete(f"{a.url}/sessions/{sid}", headers=auth)


def test_prometheus_reads_fronts_and_nodes_with_its_token_alone(fleet: Fleet) -> None:
    scraper = {"Authorization": f"Bearer {fleet.front_env['SANDBANK_METRICS_TOKEN']}"}
    for server in [*fleet.fronts, *fleet.nodes]:
        deadline = time.monotonic() + 5
        r = httpx.get(server.url + "/metrics", headers=scraper)
        while r.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            r = httpx.get(server.url + "/metrics", headers=scraper)
        assert r.status_code == 200 and "sandbank_http_requests_total" in r.text
        assert httpx.get(server.url + "/metrics").status_code == 401
    node = fleet.nodes[0]
    assert httpx.post(node.url + "/sessions", json={}, headers=scraper).status_code == 401


def test_a_front_runs_as_the_manifests_non_root_user(fleet: Fleet) -> None:
    """The front Deployment runs as uid 10001 on a read-only root: it holds no sandbox, so
    start-up asks nothing of root (before, it stopped: "must start as root")."""
    with scratch_dir() as root:
        docs = render(copy_with_secrets(root) / "overlays" / "production")
        uid = one(docs, "Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        data = root / "front-data"
        data.mkdir()
        shutil.chown(data, uid, uid)
        front = fleet.fronts[0]
        port = free_port()
        env = {**front.env, "SANDBANK_DATA_DIR": str(data), "SANDBANK_PORT": str(port)}
        log = root / "front.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", SANDBANK,
                 "serve"],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()[-2000:]
            assert httpx.get(f"http://127.0.0.1:{port}/health").json()["nodes_up"] == len(
                fleet.nodes
            )
        finally:
            proc.terminate()
            proc.wait(30)
