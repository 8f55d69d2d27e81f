"""The MCP door over the fake backend (no root): shapes of results and errors, sessions, auth.

The fake backend runs nothing: `answer` below scripts what each call returns. What real code
does (state kept, charts drawn) is in test_real.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import MCPError
from mcp_types import EmbeddedResource, TextResourceContents

from sandbank.app import create_app, create_exec_app
from sandbank.errors import AtCapacity
from sandbank.protocol.calls import (
    RC_TIMEOUT,
    BashCall,
    EditorCall,
    ExecResult,
    PythonCall,
    ToolCall,
)
from sandbank.protocol.sessions import SessionSpec
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.local import LocalSandboxes
from tests.fakeapp import FakeApp, canned
from tests.mcp.support import ERAS, MODERN, http_client, images, links, stdio, text
from tests.support import data_dir, env_for, settings

pytestmark = pytest.mark.anyio
TOKENS = "tok-alice-0123456789,tok-bob-9876543210"
ALICE, BOB = TOKENS.split(",")
URL = "http://localhost/mcp"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def answer(call: ToolCall) -> ExecResult:
    """What the fake sandbox says to each call."""
    if isinstance(call, BashCall):
        return ExecResult(stdout=f"ran {call.command}\n")
    if isinstance(call, EditorCall):
        return ExecResult(stdout=f"{call.command} {call.path}\n")
    assert isinstance(call, PythonCall)
    code = call.code
    if code == "fail":
        return ExecResult(
            stderr="Traceback ...\nZeroDivisionError: division by zero\n", return_code=1
        )
    if code == "slow":
        await asyncio.sleep(30)
    if code == "chart":
        return ExecResult(files=["figure_1.png", "data.csv"])
    if code == "display":
        table = {"data": {"text/plain": "   a\n0  1", "text/html": "<table/>"}}
        picture = {"data": {"image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure>"}}
        return ExecResult(stdout="", displays=[table, picture])
    return ExecResult(stdout=f"ran {code}\n")


@pytest.fixture
def data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


@contextlib.asynccontextmanager
async def served(data: Path, **overrides: Any) -> AsyncIterator[tuple[Any, FakeBackend]]:
    s = settings(
        data,
        **{
            "exec_tokens": TOKENS,
            "interpreter_api": "off",
            "exec_timeout_max": 2,
            "exec_timeout_default": 2,
            **overrides,
        },
    )
    backend = FakeBackend(s, answer)
    app = create_app(s, sandboxes=LocalSandboxes(s, backend))
    async with app.router.lifespan_context(app):
        yield app, backend


@pytest.fixture
async def app(data: Path) -> AsyncIterator[tuple[Any, FakeBackend]]:
    async with served(data) as both:
        yield both


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_tools_are_listed_for_a_model_and_cacheable(app: Any, mode: str) -> None:
    async with http_client(URL, ALICE, app=app[0], mode=mode) as client:
        assert client.protocol_version == ERAS[mode]
        listed = await client.list_tools()
        names = [t.name for t in listed.tools]
        assert names == [
            "run_python", "run_bash", "text_editor", "list_files", "read_file", "write_file",
            "start_session", "end_session", "pause_session", "resume_session",
        ]  # fmt: skip
        for tool in listed.tools:
            assert tool.description and len(tool.description) > 40
            assert tool.input_schema["type"] == "object"
        editor = next(t for t in listed.tools if t.name == "text_editor")
        assert editor.input_schema["properties"]["command"]["enum"] == [
            "view", "create", "str_replace", "insert", "undo_edit",
        ]  # fmt: skip
        if mode == "auto":  # cache hints exist on the 2026-07-28 wire only
            assert listed.ttl_ms == 600_000 and listed.cache_scope == "public"
            assert client.instructions and "session_id" in client.instructions


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_a_result_carries_output_images_and_files(app: Any, mode: str) -> None:
    async with http_client(URL, ALICE, app=app[0], mode=mode) as client:
        r = await client.call_tool("run_python", {"code": "print(1)"})
        assert not r.is_error and text(r) == "ran print(1)"
        # A figure saved as a file comes back as an image, every produced file as a link.
        png = base64.b64encode(PNG).decode()
        await client.call_tool(
            "write_file", {"path": "figure_1.png", "content": png, "encoding": "base64"}
        )
        r = await client.call_tool("run_python", {"code": "chart"})
        assert [i.mime_type for i in images(r)] == ["image/png"]
        assert base64.b64decode(images(r)[0].data) == PNG
        assert [link.name for link in links(r)] == ["figure_1.png", "data.csv"]
        assert "[files] figure_1.png, data.csv" in text(r)
        # Display bundles: a table as text, a PNG as an image.
        r = await client.call_tool("run_python", {"code": "display"})
        assert "   a\n0  1" in text(r) and "<table/>" not in text(r)
        assert len(images(r)) == 1


async def test_a_failing_program_and_a_timeout_are_error_results(app: Any) -> None:
    async with http_client(URL, ALICE, app=app[0]) as client:
        r = await client.call_tool("run_python", {"code": "fail"})
        assert r.is_error and "ZeroDivisionError" in text(r) and "[return code 1]" in text(r)
        r = await client.call_tool("run_python", {"code": "slow", "timeout_seconds": 1})
        assert r.is_error and "timed out after 1 s" in text(r)
        assert f"return code {RC_TIMEOUT}" in text(r)
        # Asking for more than the server allows is clamped to its maximum (2 s here).
        r = await client.call_tool("run_python", {"code": "slow", "timeout_seconds": 600})
        assert r.is_error and "timed out after 2 s" in text(r)


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("run_python", {}, "code is required"),
        ("run_python", {"code": ""}, "code must not be empty"),
        ("run_python", {"code": 5}, "code must be a string"),
        ("run_python", {"code": "1", "timeout_seconds": "soon"}, "timeout_seconds must be"),
        ("run_python", {"code": "1", "session_id": 7}, "session_id must be"),
        ("run_bash", {"cmd": "ls"}, "command is required"),
        ("text_editor", {"command": "delete", "path": "a"}, "command must be one of"),
        ("text_editor", {"command": "str_replace", "path": "a"}, "old_str is required"),
        ("text_editor", {"command": "create"}, "path is required"),
        ("read_file", {}, "path is required"),
        ("write_file", {"path": "a"}, "content is required"),
        ("write_file", {"path": "a", "content": "!", "encoding": "base64"}, "not valid base64"),
        ("write_file", {"path": "a", "content": "x", "encoding": "latin-1"}, "encoding must be"),
        ("write_file", {"path": "../a", "content": "x"}, "workspace"),
        ("read_file", {"path": "missing.txt"}, "missing.txt"),
        ("start_session", {"idle_timeout_seconds": 0}, "idle_timeout_seconds must be"),
    ],
)
async def test_bad_arguments_are_error_results_naming_what_is_wrong(
    app: Any, tool: str, args: dict[str, Any], message: str
) -> None:
    async with http_client(URL, ALICE, app=app[0]) as client:
        r = await client.call_tool(tool, args)
        assert r.is_error, text(r)
        assert message in text(r)


async def test_an_unknown_tool_is_a_protocol_error(app: Any) -> None:
    async with http_client(URL, ALICE, app=app[0]) as client:
        with pytest.raises(MCPError, match="unknown tool 'rm_rf'"):
            await client.call_tool("rm_rf", {})


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_a_handle_names_one_session_and_belongs_to_its_token(app: Any, mode: str) -> None:
    asgi, backend = app
    async with (
        http_client(URL, ALICE, app=asgi, mode=mode) as alice,
        http_client(URL, BOB, app=asgi, mode=mode) as bob,
    ):
        r = await alice.call_tool("start_session", {"idle_timeout_seconds": 60})
        assert r.structured_content is not None
        sid = r.structured_content["session_id"]
        assert r.structured_content["idle_timeout_seconds"] == 60
        assert sid in text(r)
        await alice.call_tool("run_python", {"code": "a", "session_id": sid})
        await alice.call_tool("run_bash", {"command": "b", "session_id": sid})
        (sandbox,) = backend.sandboxes
        assert sandbox.calls == [PythonCall("a"), BashCall("b")]
        # Bob's token does not see Alice's session: the same answer as for an unknown one.
        r = await bob.call_tool("run_python", {"code": "c", "session_id": sid})
        unknown = await bob.call_tool("run_python", {"code": "c", "session_id": "nope"})
        assert r.is_error and unknown.is_error
        assert text(r).replace(sid, "X") == text(unknown).replace("nope", "X")
        assert "start_session" in text(r)
        r = await bob.call_tool("end_session", {"session_id": sid})
        assert not sandbox.closed  # not his to end
        with pytest.raises(MCPError, match="resource not found"):
            await bob.read_resource(f"sandbank://sessions/{sid}/files/a.txt")
        assert len(sandbox.calls) == 2
        # The handle is the code-execution API's own session id, for its token only.
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi)) as api:
            listed = [
                await api.get(
                    f"http://localhost/sessions/{sid}/files/list",
                    headers={"Authorization": f"Bearer {token}"},
                )
                for token in (BOB, ALICE)
            ]
        assert [r.status_code for r in listed] == [404, 200]
        await alice.call_tool("end_session", {"session_id": sid})
        r = await alice.call_tool("run_python", {"code": "d", "session_id": sid})
        assert r.is_error and "Session not found" in text(r)


async def test_a_client_without_a_handle_works_in_its_default_session(app: Any) -> None:
    asgi, backend = app
    async with (
        http_client(URL, ALICE, app=asgi, name="one") as one,
        http_client(URL, ALICE, app=asgi, name="one") as one_again,
        http_client(URL, ALICE, app=asgi, name="two") as two,
        http_client(URL, BOB, app=asgi, name="one") as bobs,
    ):
        await asyncio.gather(*(one.call_tool("run_python", {"code": f"{i}"}) for i in range(3)))
        await one_again.call_tool("run_python", {"code": "3"})
        assert len(backend.sandboxes) == 1  # concurrent first calls made one session
        assert len(backend.sandboxes[0].calls) == 4  # same token, same client: same session
        await two.call_tool("run_python", {"code": "x"})
        await bobs.call_tool("run_python", {"code": "x"})
        assert len(backend.sandboxes) == 3  # another client, another token: their own


async def test_handshake_era_clients_get_a_default_session_per_mcp_session(app: Any) -> None:
    asgi, backend = app
    async with (
        http_client(URL, ALICE, app=asgi, mode="legacy") as first,
        http_client(URL, ALICE, app=asgi, mode="legacy") as second,
    ):
        await first.call_tool("run_python", {"code": "a"})
        await first.call_tool("run_python", {"code": "b"})
        await second.call_tool("run_python", {"code": "c"})
        assert [len(s.calls) for s in backend.sandboxes] == [2, 1]


async def test_a_default_session_that_ended_says_so_and_the_next_call_starts_afresh(
    app: Any,
) -> None:
    asgi, backend = app
    async with http_client(URL, ALICE, app=asgi) as client:
        await client.call_tool("run_python", {"code": "a"})
        local: LocalSandboxes = asgi.state.services.local
        (session,) = local.sessions()
        local.reap(now=session.last_activity_at + session.idle_timeout + 1)  # idle: reclaimed
        r = await client.call_tool("run_python", {"code": "b"})
        assert r.is_error and "default session has ended" in text(r)
        assert "did not run" in text(r)
        r = await client.call_tool("run_python", {"code": "c"})
        assert not r.is_error and text(r) == "ran c"
        assert [c for s in backend.sandboxes for c in s.calls] == [PythonCall("a"), PythonCall("c")]
        # end_session without a handle ends the default one.
        r = await client.call_tool("end_session", {})
        assert not r.is_error and backend.sandboxes[1].closed
        r = await client.call_tool("end_session", {})
        assert "no default session" in text(r)


async def test_a_named_session_is_given_back_while_it_lives(data: Path) -> None:
    """What lets any replica find a caller's default session: the port keeps the name."""
    s = settings(data, interpreter_api="off")
    local = LocalSandboxes(s, FakeBackend(s))
    await local.start()
    try:
        first, second = await asyncio.gather(
            local.create("t1", SessionSpec(name="client-a")),
            local.create("t1", SessionSpec(name="client-a")),
        )
        assert first.id == second.id  # at once, too: one session per name
        assert (await local.create("t2", SessionSpec(name="client-a"))).id != first.id
        assert (await local.create("t1", SessionSpec(name="client-b"))).id != first.id
        assert (await local.create("t1")).id != first.id  # unnamed: always new
        await local.destroy(first.id, "t1")
        again = await local.create("t1", SessionSpec(name="client-a"))
        assert again.id != first.id
        assert len(local.sessions()) == 4
    finally:
        await local.close()


async def test_files_tools_and_resources(app: Any) -> None:
    async with http_client(URL, ALICE, app=app[0]) as client:
        assert (await client.list_resources()).resources == []  # no default session yet
        r = await client.call_tool("write_file", {"path": "notes/a.txt", "content": "héllo"})
        assert text(r) == "wrote 6 bytes to notes/a.txt"
        r = await client.call_tool("read_file", {"path": "/workspace/notes/a.txt"})
        assert text(r) == "héllo"
        await client.call_tool(
            "write_file", {"path": "b.bin", "content": "AAEC", "encoding": "base64"}
        )
        r = await client.call_tool("read_file", {"path": "b.bin"})
        (block,) = r.content
        assert isinstance(block, EmbeddedResource) and block.resource.blob == "AAEC"  # type: ignore[union-attr]
        r = await client.call_tool("list_files", {})
        assert "notes/" in text(r) and "b.bin\t3 bytes" in text(r)
        r = await client.call_tool("list_files", {"path": "notes"})
        assert text(r).startswith("notes/a.txt\t6 bytes")
        listed = (await client.list_resources()).resources
        assert sorted(res.name for res in listed) == ["b.bin", "notes/a.txt"]
        uri = next(str(res.uri) for res in listed if res.name == "notes/a.txt")
        (contents,) = (await client.read_resource(uri)).contents
        assert isinstance(contents, TextResourceContents) and contents.text == "héllo"
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == [
            "sandbank://sessions/{session_id}/files/{+path}"
        ]
        for bad in ("sandbank://sessions/x", "file:///etc/passwd", uri.replace("a.txt", "zz")):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(bad)
            assert caught.value.error.code == -32602


async def test_the_editor_goes_through_to_the_sandbox(app: Any) -> None:
    asgi, backend = app
    async with http_client(URL, ALICE, app=asgi) as client:
        r = await client.call_tool(
            "text_editor", {"command": "insert", "path": "a.py", "insert_line": 0, "new_str": "x"}
        )
        assert text(r) == "insert a.py"
        r = await client.call_tool(
            "text_editor", {"command": "view", "path": "a.py", "view_range": [1, -1]}
        )
        assert backend.sandboxes[0].calls == [
            EditorCall("insert", "a.py", insert_line=0, new_str="x"),
            EditorCall("view", "a.py", view_range=(1, -1)),
        ]


async def test_a_server_failure_is_an_mcp_error_with_a_clear_message(data: Path) -> None:
    async with served(data) as (asgi, _):
        local: LocalSandboxes = asgi.state.services.local

        async def full(*args: Any, **kwargs: Any) -> Any:
            raise AtCapacity("every sandbox is busy", retry_after=7)

        local.create = full  # type: ignore[method-assign]
        async with http_client(URL, ALICE, app=asgi) as client:
            with pytest.raises(MCPError, match="every sandbox is busy; retry in 7 s") as caught:
                await client.call_tool("run_python", {"code": "1"})
            assert caught.value.error.data == {"retry_after_seconds": 7}


@pytest.mark.parametrize("mode", sorted(ERAS))
@pytest.mark.parametrize("token", [None, "wrong-token"])
async def test_a_client_without_a_valid_token_is_refused(
    app: Any, mode: str, token: str | None
) -> None:
    with pytest.RaisesGroup(
        pytest.RaisesExc(MCPError, match="Unauthorized: "), flatten_subgroups=True
    ):
        async with http_client(URL, token, app=app[0], mode=mode):
            pass
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app[0])) as raw:
        r = await raw.post(
            URL, json={}, headers={"Authorization": f"Bearer {token}"} if token else {}
        )
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        body = r.json()
        assert body["detail"] and body["error"]["code"] == -32001  # the API's shape and JSON-RPC's


async def test_without_tokens_the_door_is_open_as_the_api_is(data: Path) -> None:
    async with served(data, exec_tokens="") as (asgi, _), http_client(URL, app=asgi) as client:
        r = await client.call_tool("run_bash", {"command": "ls"})
        assert text(r) == "ran ls"


async def test_mcp_is_off_with_the_code_execution_api(data: Path) -> None:
    async with (
        served(data, exec_api="off", exec_tokens="") as (asgi, _),
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi)) as raw,
    ):
        assert (await raw.post(URL, json={})).status_code == 404


async def test_on_a_separate_listener_mcp_is_served_there(data: Path) -> None:
    async with served(data, exec_api="separate") as (asgi, _):
        exec_app = create_exec_app(asgi.state.services, asgi.state.services.settings)
        async with http_client(URL, ALICE, app=exec_app) as client:
            assert text(await client.call_tool("run_bash", {"command": "ls"})) == "ran ls"
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi)) as raw:
            assert (await raw.post(URL, json={})).status_code == 404


async def test_a_raw_2026_request_gets_one_json_answer(app: Any) -> None:
    """What a client without the SDK sends: headers and `_meta` as the revision asks."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run_bash", "arguments": {"command": "ls"}, "_meta": meta},
    }  # fmt: skip
    headers = {
        "Authorization": f"Bearer {ALICE}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "run_bash",
    }
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app[0])) as raw:
        r = await raw.post(URL, json=body, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in r.headers
    result = r.json()["result"]
    assert result["content"][0] == {"type": "text", "text": "ran ls"}
    assert result["isError"] is False


async def keeping(call: ToolCall, workspace: Path) -> ExecResult:
    """`v = 5` keeps 5 in the sandbox and `print(v * 2)` prints 10; the rest is canned."""
    if isinstance(call, PythonCall) and call.code == "v = 5":
        (workspace / ".v").write_text("5")
        return ExecResult()
    if isinstance(call, PythonCall) and call.code == "print(v * 2)":
        return ExecResult(stdout=f"{int((workspace / '.v').read_text()) * 2}\n")
    return await canned(call, workspace)


async def test_stdio_over_a_running_server() -> None:
    """`sandbank mcp --url` (a real process) bridges stdio to a server's door: the app over
    fakes, served on loopback."""
    fake = FakeApp(keeping, exec_tokens=TOKENS, interpreter_api="off")
    with fake.serving() as url, data_dir() as d:
        env = {**env_for(d), "SANDBANK_SANDBOX_TOKEN": ALICE}
        async with stdio(["mcp", "--url", url], env, "auto", d / "mcp.log") as client:
            r = await client.call_tool("start_session", {})
            assert r.structured_content is not None
            sid = r.structured_content["session_id"]
            await client.call_tool("run_python", {"code": "v = 5", "session_id": sid})
        # The session is the server's, under the token's tenant.
        async with http_client(f"{url}/mcp", ALICE) as client:
            r = await client.call_tool("run_python", {"code": "print(v * 2)", "session_id": sid})
            assert text(r) == "10"
        async with http_client(f"{url}/mcp", BOB) as client:
            r = await client.call_tool("run_python", {"code": "print(v * 2)", "session_id": sid})
            assert r.is_error and "Session not found" in text(r)


async def test_pausing_where_the_isolation_keeps_no_snapshots_is_an_error_result(app: Any) -> None:
    async with http_client(URL, ALICE, app=app[0], mode="auto") as client:
        sid = (await client.call_tool("start_session", {})).structured_content["session_id"]
        r = await client.call_tool("pause_session", {"session_id": sid})
        assert r.is_error and "cannot be paused" in text(r)
        r = await client.call_tool("run_python", {"code": "print(1)", "session_id": sid})
        assert not r.is_error  # and it goes on
