"""What the interpreter spec's own web client needs, over fakes: GetSession with its messages
after a timestamp, and the served schema's addition. The app runs in-process
(tests/fakeapp.py); test_spec_client.py keeps, on a real server, the Plotly figures real code
makes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakeapp import FakeApp
from tests.interpreter.harness import Client, assert_error
from tests.interpreter.test_api_http import Server
from tests.interpreter.test_life import CSV
from tests.interpreter.test_spec_client import CLIENT_HEADER, with_messages


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    fake = FakeApp(
        agent_answer_format="tags",
        trusted_user_header=CLIENT_HEADER,
        trusted_proxies="127.0.0.1/32",
    )
    with fake.running():
        yield Server(fake)


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


@pytest.fixture(scope="module")
def bob(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


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
