"""What the interpreter spec's own web client needs: GetSession with its messages, answers naming
files in tags, Plotly figures saved as files, tool records with `python_code`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, openai_env, running
from tests.interpreter.test_life import CSV, assert_error
from tests.tiers import needs

CLIENT_HEADER = "X-Code-Interpreter-User-Id"  # the header the spec's web client sends


@pytest.fixture(scope="module")
@needs("root")
def server(llm: FakeLLM) -> Iterator[Server]:
    env = {
        **openai_env(llm.url),
        "SANDBANK_AGENT_ANSWER_FORMAT": "tags",
        "SANDBANK_TRUSTED_USER_HEADER": CLIENT_HEADER,
        "SANDBANK_TRUSTED_PROXIES": "127.0.0.1/32",
    }
    with running(env) as s:
        yield s


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


@pytest.fixture(scope="module")
def bob(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


def with_messages(client: Client, sid: str, after: object) -> dict[str, Any]:
    session: dict[str, Any] = client.ok(
        "GET", f"/api/sessions/{sid}", params={"include_messages_from": after}
    )
    return session


def test_get_session_carries_the_visible_messages_after_a_timestamp(
    alice: Client, bob: Client
) -> None:
    sid = alice.new_session()
    assert alice.upload(sid, "data.csv", CSV).status_code == 204
    alice.ask(sid, "Draw a chart of data.csv")
    assert alice.wait(sid)["status"] == "DONE"

    plain = alice.ok("GET", f"/api/sessions/{sid}")
    assert "messages" not in plain  # without the parameter, nothing changes
    full = with_messages(alice, sid, 0)
    assert {k: v for k, v in full.items() if k != "messages"} == plain
    history = alice.ok("GET", f"/api/sessions/{sid}/messages")
    assert any(m["internal"] for m in history)  # the run left tool and trace messages
    visible = [
        {"timestamp": m["timestamp"], "role": m["role"], "content": m["content"]}
        for m in history
        if not m["internal"]
    ]
    assert full["messages"] == visible  # exactly these fields: the client refuses any other
    assert [m["role"] for m in full["messages"]] == ["user", "assistant"]
    assert "TOTAL 42" in full["messages"][-1]["content"]

    # Strictly after the timestamp, which the client takes from the last message it has.
    first, last = (m["timestamp"] for m in (full["messages"][0], full["messages"][-1]))
    assert with_messages(alice, sid, first)["messages"] == full["messages"][1:]
    assert with_messages(alice, sid, first - 0.001)["messages"] == full["messages"]
    assert with_messages(alice, sid, last)["messages"] == []

    for bad in ("yesterday", "nan", "inf", ""):
        response = alice.http.get(f"/api/sessions/{sid}", params={"include_messages_from": bad})
        assert "include_messages_from" in assert_error(response, 400, 1001)
    others = bob.http.get(f"/api/sessions/{sid}", params={"include_messages_from": 0})
    assert_error(others, 403, 1011)
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_answers_name_files_in_tags_and_plotly_figures_are_served(
    server: Server, alice: Client, llm: FakeLLM
) -> None:
    question = "Plot data.csv with plotly"
    with httpx.Client(base_url=server.url, headers={CLIENT_HEADER: alice.name}) as web_client:
        sid = web_client.post("/api/sessions").json()["session_id"]
        assert alice.upload(sid, "data.csv", CSV).status_code == 204
        assert web_client.post(f"/api/sessions/{sid}/messages", json={"content": question})
    assert alice.wait(sid)["status"] == "DONE"

    asked = next(r for r in llm.requests if r["messages"][-1].get("content") == question)
    system = asked["messages"][0]["content"]
    assert "<png>figure_1.png</png>" in system and "<plotly>plotly_1.json</plotly>" in system
    assert "![chart]" not in system

    answer = with_messages(alice, sid, 0)["messages"][-1]
    assert answer["role"] == "assistant"
    for tag in ("<png>figure_1.png</png>", "<plotly>plotly_1.json</plotly>", "<md>summary.md</md>"):
        assert tag in answer["content"]

    history = alice.ok("GET", f"/api/sessions/{sid}/messages")
    tool = next(json.loads(m["content"]) for m in history if m["role"] == "tool")
    assert tool["python_code"] == tool["input"]["code"]
    assert "fig.show()" in tool["python_code"], tool["output"]
    assert sorted(tool["output"]["files"]) == ["figure_1.png", "plotly_1.json", "summary.md"], tool[
        "output"
    ]

    files = {f["filename"]: f for f in alice.ok("GET", f"/api/sessions/{sid}/files")}
    assert files["plotly_1.json"]["origin"] == "assistant"
    link = alice.ok(
        "GET", f"/api/sessions/{sid}/files/download", params={"filename": "plotly_1.json"}
    )
    served = httpx.get(link["url"])
    assert served.status_code == 200
    figure = served.json()
    assert figure["data"][0]["type"] == "bar"
    assert figure["data"][0]["x"] == ["a", "b", "c"]
    assert figure["layout"]["title"]["text"] == "Sum 42"
    alice.ok("DELETE", f"/api/sessions/{sid}")


def test_the_served_schema_lists_the_get_session_addition(alice: Client) -> None:
    doc = alice.ok("GET", "/api/openapi.json")
    get = doc["paths"]["/api/sessions/{session_id}"]["get"]
    refs = [p["$ref"].rsplit("/", 1)[-1] for p in get["parameters"]]
    assert refs == ["sessionIdParam", "includeMessagesFromParam"]
    assert doc["components"]["parameters"]["includeMessagesFromParam"]["name"] == (
        "include_messages_from"
    )
    schemas = doc["components"]["schemas"]
    assert set(schemas["SessionMessage"]["properties"]) == {"timestamp", "role", "content"}
    assert "python_code" in schemas["ToolRecord"]["properties"]
    additions = doc["info"]["x-sandbank-additions"]
    assert "components.parameters.includeMessagesFromParam" in additions
    assert "paths./api/sessions/{session_id}.get.parameters" in additions
