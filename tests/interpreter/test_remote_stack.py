"""The whole life again on PostgreSQL + S3 (moto) + sandboxes of a second server, over HTTP."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator

import boto3
import httpx
import pytest

from tests.files.conftest import moto_endpoint  # noqa: F401 - a fixture, used by name
from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, running
from tests.interpreter.test_life import CSV
from tests.postgres import running_postgres
from tests.tiers import needs

TOKEN = "backend-token-for-tests"


@pytest.fixture(scope="module")
@needs("root")
def backend() -> Iterator[Server]:
    """A second `sandbank serve`: only its code-execution API, behind a token."""
    env = {"SANDBANK_INTERPRETER_API": "off", "SANDBANK_EXEC_TOKENS": TOKEN}
    with running(env, ready="/health") as server:
        yield server


@pytest.fixture(scope="module")
@needs("root", "postgres", "s3")
def server(backend: Server, moto_endpoint: str, llm: FakeLLM) -> Iterator[Server]:  # noqa: F811
    bucket = f"sandbank-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    with running_postgres() as database_url:
        env = {
            "SANDBANK_DATABASE_URL": database_url,
            "SANDBANK_STORAGE_URL": f"s3://{bucket}/objects",
            "SANDBANK_S3_ENDPOINT_URL": moto_endpoint,
            "SANDBANK_S3_REGION": "us-east-1",
            "SANDBANK_S3_ACCESS_KEY_ID": "testing",
            "SANDBANK_S3_SECRET_ACCESS_KEY": "testing",
            "SANDBANK_SANDBOX_URL": backend.url,
            "SANDBANK_SANDBOX_TOKEN": TOKEN,
            "SANDBANK_EXEC_API": "off",
            "SANDBANK_POOL_SIZE": "0",  # its own runtime is unused
            "SANDBANK_LLM_MODEL": "anthropic:claude-fake",
            "SANDBANK_LLM_BASE_URL": llm.url,
            "SANDBANK_LLM_API_KEY": "fake-key",
        }
        with running(env) as s:
            yield s


def test_whole_life_on_postgres_s3_and_a_remote_backend(server: Server, llm: FakeLLM) -> None:
    with server.new_user() as client:
        check_life_on_s3(client, llm)


def check_life_on_s3(client: Client, llm: FakeLLM) -> None:
    sid = client.new_session()
    upload = client.upload(sid, "data.csv", CSV)
    assert upload.status_code == 204, upload.text
    form = client.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": "x.csv"})
    policy = json.loads(base64.b64decode(form["fields"]["policy"]))
    assert ["content-length-range", 0, 16 * 1024 * 1024] in policy["conditions"]
    files = client.ok("GET", f"/api/sessions/{sid}/files")
    assert files == [{"filename": "data.csv", "size": len(CSV), "origin": "user"}]

    asked = len(llm.paths)
    client.ask(sid, "Draw a chart of data.csv")
    session = client.wait(sid)
    assert session["status"] == "DONE", session
    assert session["sandbox"] == "running"  # read from the remote backend's listing
    assert llm.paths[asked:] and all(p == "/v1/messages" for p in llm.paths[asked:])
    history = client.ok("GET", f"/api/sessions/{sid}/messages")
    tool = [json.loads(m["content"]) for m in history if m["role"] == "tool"]
    assert "TOTAL 42" in tool[0]["output"]["stdout"]
    assert history[-1]["role"] == "assistant" and "TOTAL 42" in history[-1]["content"]

    files = {f["filename"]: f for f in client.ok("GET", f"/api/sessions/{sid}/files")}
    assert files["chart.png"]["origin"] == "assistant"
    link = client.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "chart.png"})
    chart = httpx.get(link["url"])
    assert chart.status_code == 200
    assert chart.content.startswith(b"\x89PNG")
    assert "attachment" in chart.headers["content-disposition"]

    client.ok("DELETE", f"/api/sessions/{sid}")
    assert client.http.get(f"/api/sessions/{sid}").status_code == 404
    assert httpx.get(link["url"]).status_code in (403, 404)  # S3 hides missing keys


def test_a_changed_upload_is_placed_again_from_the_store(server: Server) -> None:
    """Remotely uploads are only mode 0444: code may remove them, the store keeps them."""
    with server.new_user() as client:
        sid = client.new_session()
        assert client.upload(sid, "data.csv", CSV).status_code == 204
        client.ask(sid, "Try to overwrite data.csv")
        assert client.wait(sid)["status"] == "DONE"
        files = {f["filename"]: f for f in client.ok("GET", f"/api/sessions/{sid}/files")}
        assert files["data.csv"] == {"filename": "data.csv", "size": len(CSV), "origin": "user"}
        client.ask(sid, "Draw a chart of data.csv")
        assert client.wait(sid)["status"] == "DONE"
        answer = client.ok("GET", f"/api/sessions/{sid}/messages")[-1]["content"]
        assert "TOTAL 42" in answer
        client.ok("DELETE", f"/api/sessions/{sid}")
