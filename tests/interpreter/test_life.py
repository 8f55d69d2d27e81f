"""The interpreter API on a real server, on the default stack (SQLite, local disk, real sandboxes),
with a model on loopback: the whole life of a question that runs real code. The API's HTTP
behaviour alone (keys, errors, limits, uploads, CORS...) is tested over fakes in test_api_http.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, assert_error, openai_env, running
from tests.tiers import needs

__all__ = ["CSV", "assert_error"]  # used by the other real-server modules

CSV = b"name,value\na,1\nb,2\nc,39\n"


@pytest.fixture(scope="module")
@needs("root")
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
    link = client.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "chart.png"})
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

    assert client.ok("DELETE", f"/api/sessions/{sid}") == {}
    gone = client.http.get(f"/api/sessions/{sid}")
    assert gone.status_code == 404
    assert httpx.get(link["url"]).status_code == 404


def test_whole_life_on_the_default_stack(alice: Client, llm: FakeLLM) -> None:
    asked = len(llm.paths)
    check_whole_life(alice)
    assert llm.paths[asked:] and all(p == "/v1/chat/completions" for p in llm.paths[asked:])


def test_the_agent_cannot_change_an_upload(alice: Client) -> None:
    sid = alice.new_session()
    assert alice.upload(sid, "data.csv", CSV).status_code == 204
    alice.ask(sid, "Try to overwrite data.csv")
    assert alice.wait(sid)["status"] == "DONE"
    tool = next(
        json.loads(m["content"])
        for m in alice.ok("GET", f"/api/sessions/{sid}/messages")
        if m["role"] == "tool"
    )
    out = tool["output"]["stdout"]
    assert "CHANGED" not in out
    assert out.count("REFUSED PermissionError") == 3
    assert "name,value" in out
    files = alice.ok("GET", f"/api/sessions/{sid}/files")
    assert files == [{"filename": "data.csv", "size": len(CSV), "origin": "user"}]
    alice.ok("DELETE", f"/api/sessions/{sid}")
