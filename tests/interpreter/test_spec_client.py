"""What the interpreter spec's own web client needs of a real server: answers naming files in
tags, Plotly figures saved as files, tool records with `python_code`. GetSession with its
messages is tested over fakes in test_spec_client_http.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, openai_env, running
from tests.interpreter.test_life import CSV
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
