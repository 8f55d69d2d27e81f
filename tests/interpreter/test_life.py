"""A session's whole life over HTTP on the default stack: SQLite, local disk, in-process sandboxes."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, openai_env, running

CSV = b"name,value\na,1\nb,2\nc,39\n"


@pytest.fixture(scope="module")
def server(llm: FakeLLM) -> Iterator[Server]:
    with running(openai_env(llm.url)) as s:
        yield s


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


def check_whole_life(client: Client) -> None:
    """Create, upload, ask, poll, read the history, download the chart, delete."""
    sid = client.new_session()
    assert client.upload(sid, "data.csv", CSV).status_code == 204
    files = client.ok("GET", f"/api/sessions/{sid}/files")
    assert files == [{"filename": "data.csv", "size": len(CSV), "origin": "user"}]

    question = client.ask(sid, "Draw a chart of data.csv")
    assert question["role"] == "user" and question["internal"] is False
    session = client.wait(sid)
    assert session["status"] == "DONE", session

    history = client.ok("GET", f"/api/sessions/{sid}/messages")
    roles = [(m["role"], m["internal"]) for m in history]
    assert roles[0] == ("user", False)
    assert roles[-1] == ("assistant", False)
    assert ("trace", True) in roles
    tool = [json.loads(m["content"]) for m in history if m["role"] == "tool"]
    assert len(tool) == 1
    assert 'pd.read_csv("data.csv")' in tool[0]["input"]["code"]
    assert "TOTAL 42" in tool[0]["output"]["stdout"]
    assert "TOTAL 42" in history[-1]["content"]
    stamps = [m["timestamp"] for m in history]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    later = client.ok("GET", f"/api/sessions/{sid}/messages", params={"from": stamps[0]})
    assert [m["timestamp"] for m in later] == stamps[1:]

    files = {f["filename"]: f for f in client.ok("GET", f"/api/sessions/{sid}/files")}
    assert files["chart.png"]["origin"] == "assistant"
    assert files["data.csv"]["origin"] == "user"
    link = client.ok(
        "GET", f"/api/sessions/{sid}/files/download", params={"filename": "chart.png"}
    )
    chart = httpx.get(link["url"])
    assert chart.status_code == 200
    assert chart.content.startswith(b"\x89PNG")
    assert len(chart.content) == files["chart.png"]["size"]
    assert chart.headers["x-content-type-options"] == "nosniff"
    assert chart.headers["content-type"] == "image/png"
    assert chart.headers["content-disposition"].startswith("inline")  # an image may show
    link = client.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "data.csv"})
    data = httpx.get(link["url"])
    assert data.content == CSV
    assert data.headers["content-disposition"].startswith("attachment")
    assert data.headers["content-security-policy"].startswith("sandbox")
    assert list(csv.reader(io.StringIO(data.text)))[0] == ["name", "value"]

    assert client.ok("DELETE", f"/api/sessions/{sid}") == {}
    gone = client.http.get(f"/api/sessions/{sid}")
    assert gone.status_code == 404
    assert httpx.get(link["url"]).status_code == 404


def test_whole_life_on_the_default_stack(alice: Client) -> None:
    check_whole_life(alice)
