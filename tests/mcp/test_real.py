"""The official MCP client against real servers and real sandboxes: streamable HTTP and stdio,
both protocol eras, and two fleet fronts answering one handle. Tokens, handles and refusals are
tested with the same client over fakes in test_door.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.fleet.support import front, node, scratch_dir
from tests.mcp.support import ERAS, MODERN, http_client, images, links, stdio, text
from tests.support import Server, data_dir, env_for
from tests.tiers import needs

pytestmark = pytest.mark.anyio
TOKENS = "tok-alice-0123456789,tok-bob-9876543210"
ALICE, BOB = TOKENS.split(",")
LIMITS: dict[str, Any] = {"exec_timeout_default": 30, "exec_timeout_max": 30, "max_sessions": 12}
CHART = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('sales')"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    with data_dir() as d:
        srv = Server(d, exec_tokens=TOKENS, pool_size=1, interpreter_api="off", **LIMITS).start()
        try:
            yield srv
        finally:
            srv.stop()


def mcp_url(server: Server) -> str:
    return f"{server.base_url}/mcp"


async def check_a_conversation(client: Client) -> None:
    """What every transport and era must do, on one client."""
    names = [t.name for t in (await client.list_tools()).tools]
    assert {"run_python", "run_bash", "text_editor", "start_session", "end_session"} <= set(names)

    # State through a handle.
    r = await client.call_tool("start_session", {})
    assert r.structured_content is not None
    sid = r.structured_content["session_id"]
    await client.call_tool("run_python", {"code": "x = 41", "session_id": sid})
    r = await client.call_tool("run_python", {"code": "print(x + 1)", "session_id": sid})
    assert not r.is_error and text(r) == "42"

    # State through the default session, which is not the handle's.
    await client.call_tool("run_python", {"code": "y = 'default'"})
    r = await client.call_tool("run_python", {"code": "print(y, 'x' in globals())"})
    assert text(r) == "default False"
    r = await client.call_tool("run_bash", {"command": "cd /tmp && export Z=7"})
    r = await client.call_tool("run_bash", {"command": "echo $PWD $Z"})
    assert text(r) == "/tmp 7"

    # A chart comes back as an image (and as a link to its file).
    r = await client.call_tool("run_python", {"code": CHART, "session_id": sid})
    assert not r.is_error, text(r)
    (image,) = images(r)
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(b"\x89PNG\r\n\x1a\n")
    assert [link.name for link in links(r)] == ["figure_1.png"]
    (contents,) = (await client.read_resource(str(links(r)[0].uri))).contents
    assert base64.b64decode(contents.blob) == base64.b64decode(image.data)  # type: ignore[union-attr]

    # A table as text.
    r = await client.call_tool(
        "run_python",
        {"code": "import pandas as pd\ndisplay(pd.DataFrame({'a': [1, 2]}))", "session_id": sid},
    )
    assert "a" in text(r) and "<table" not in text(r)

    # An exception is a result with isError, with the user's traceback only.
    r = await client.call_tool("run_python", {"code": "1 / 0", "session_id": sid})
    assert r.is_error and "ZeroDivisionError" in text(r) and "[return code 1]" in text(r)
    assert "sandbank" not in text(r)
    r = await client.call_tool("run_bash", {"command": "exit 3", "session_id": sid})
    assert r.is_error and "[return code 3]" in text(r)

    # The editor and the files.
    await client.call_tool(
        "text_editor",
        {"command": "create", "path": "a.py", "file_text": "one\n", "session_id": sid},
    )
    await client.call_tool(
        "text_editor",
        {
            "command": "str_replace",
            "path": "a.py",
            "old_str": "one",
            "new_str": "two",
            "session_id": sid,
        },
    )
    r = await client.call_tool("read_file", {"path": "a.py", "session_id": sid})
    assert text(r) == "two\n"
    r = await client.call_tool("list_files", {"session_id": sid})
    assert "a.py\t4 bytes" in text(r) and "figure_1.png" in text(r)

    await client.call_tool("end_session", {"session_id": sid})
    r = await client.call_tool("run_python", {"code": "1", "session_id": sid})
    assert r.is_error and "start_session" in text(r)


async def test_a_paused_session_resumes_with_its_variables(server: Server) -> None:
    async with http_client(mcp_url(server), ALICE, mode="auto") as client:
        sid = (await client.call_tool("start_session", {})).structured_content["session_id"]
        await client.call_tool("run_python", {"code": "kept = 6 * 7", "session_id": sid})
        r = await client.call_tool("pause_session", {"session_id": sid})
        assert not r.is_error and r.structured_content == {"session_id": sid, "state": "paused"}
        r = await client.call_tool("run_python", {"code": "print(kept)", "session_id": sid})
        assert not r.is_error and "42" in text(r)
        await client.call_tool("pause_session", {"session_id": sid})
        r = await client.call_tool("resume_session", {"session_id": sid})
        assert r.structured_content == {"session_id": sid, "state": "running"}
        async with http_client(mcp_url(server), BOB, mode="auto") as bob:
            r = await bob.call_tool("pause_session", {"session_id": sid})
            assert r.is_error and "not found" in text(r).lower()
        await client.call_tool("end_session", {"session_id": sid})


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_streamable_http_in_both_eras(server: Server, mode: str) -> None:
    async with http_client(mcp_url(server), ALICE, mode=mode) as client:
        assert client.protocol_version == ERAS[mode]
        assert client.server_info is not None and client.server_info.name == "sandbank"
        await check_a_conversation(client)


async def test_a_timeout_says_so_and_the_session_lives_on(server: Server) -> None:
    async with http_client(mcp_url(server), ALICE) as client:
        await client.call_tool("run_python", {"code": "kept = 1"})
        r = await client.call_tool(
            "run_python", {"code": "import time\ntime.sleep(20)", "timeout_seconds": 1}
        )
        assert r.is_error and "timed out after 1 s" in text(r)
        r = await client.call_tool("run_python", {"code": "print(kept)"})
        assert text(r) == "1"


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_two_clients_get_two_sessions(server: Server, mode: str) -> None:
    url = mcp_url(server)
    async with (
        http_client(url, ALICE, mode=mode, name="first") as first,
        http_client(url, ALICE, mode=mode, name="second") as second,
    ):
        await first.call_tool("run_python", {"code": "mine = 'first'"})
        r = await second.call_tool("run_python", {"code": "print(globals().get('mine'))"})
        assert text(r) == "None"
        r = await first.call_tool("run_python", {"code": "print(mine)"})
        assert text(r) == "first"


# --- stdio ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_stdio_over_this_machines_sandboxes(mode: str, machine: None) -> None:
    with data_dir() as d:
        env = env_for(d, pool_size=0, **LIMITS)
        async with stdio(["mcp", "--data-dir", str(d)], env, mode, d / "mcp.log") as client:
            assert client.protocol_version == ERAS[mode]
            await check_a_conversation(client)
        log = (d / "mcp.log").read_text()
        assert "serving MCP on stdio" in log  # logs go to stderr, never into the protocol


# --- two front replicas ----------------------------------------------------------------------
@pytest.fixture(scope="module")
@needs("root")
def fronts() -> Iterator[tuple[Server, Server]]:
    with scratch_dir() as root:
        (root / "node").mkdir(mode=0o711)
        worker = node(root / "node", "node-0").start()
        made: list[Server] = []
        try:
            for name in ("front-a", "front-b"):
                (root / name).mkdir(mode=0o711)
                made.append(
                    front(root / name, [("node-0", worker.base_url)], exec_tokens=TOKENS).start()
                )
            yield made[0], made[1]
        finally:
            for f in made:
                f.stop()
            worker.stop()


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_two_front_replicas_answer_the_same_handle(
    fronts: tuple[Server, Server], mode: str
) -> None:
    a, b = fronts
    async with (
        http_client(mcp_url(a), ALICE, mode=mode) as on_a,
        http_client(mcp_url(b), ALICE, mode=mode) as on_b,
        http_client(mcp_url(b), BOB, mode=mode) as bob_on_b,
    ):
        sid = (await on_a.call_tool("start_session", {})).structured_content["session_id"]
        assert sid.startswith("node-0.")  # the fleet's signed id: it names its node
        await on_a.call_tool("run_python", {"code": "x = 41", "session_id": sid})
        r = await on_b.call_tool("run_python", {"code": "print(x + 1)", "session_id": sid})
        assert text(r) == "42"
        r = await on_b.call_tool("run_python", {"code": CHART, "session_id": sid})
        assert len(images(r)) == 1  # the figure is read from the node through the front
        r = await bob_on_b.call_tool("run_python", {"code": "print(x)", "session_id": sid})
        assert r.is_error and "Session not found" in text(r)


@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_a_default_session_is_found_from_either_front(
    fronts: tuple[Server, Server], mode: str
) -> None:
    a, b = fronts
    name = f"desktop-{mode}"
    async with (
        http_client(mcp_url(a), ALICE, mode=mode, name=name) as on_a,
        http_client(mcp_url(b), ALICE, mode=mode, name=name) as on_b,
        http_client(mcp_url(b), BOB, mode=mode, name=name) as bob_on_b,
    ):
        await on_a.call_tool("run_python", {"code": "where = 'a'"})
        r = await on_b.call_tool("run_python", {"code": "print(globals().get('where'))"})
        # The 2026-07-28 client is one caller on both fronts; two handshake-era MCP sessions
        # are two callers, as on one server.
        assert text(r) == ("a" if mode == "auto" else "None")
        r = await bob_on_b.call_tool("run_python", {"code": "print(globals().get('where'))"})
        assert text(r) == "None"  # another token: its own


async def test_a_2026_client_needs_no_stickiness(fronts: tuple[Server, Server]) -> None:
    """Every request of one client goes to the other replica than the last one."""
    ports = [f.port for f in fronts]
    sent = 0

    async def alternate(request: httpx2.Request) -> None:
        nonlocal sent
        request.url = request.url.copy_with(port=ports[sent % 2])
        sent += 1

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {ALICE}"}, event_hooks={"request": [alternate]}
    )
    async with http, Client(streamable_http_client(mcp_url(fronts[0]), http_client=http)) as client:
        assert client.protocol_version == MODERN
        sid = (await client.call_tool("start_session", {})).structured_content["session_id"]
        for i in range(4):
            r = await client.call_tool(
                "run_python",
                {"code": "n = globals().get('n', 0) + 1\nprint(n)", "session_id": sid},
            )
            assert text(r) == str(i + 1)
        # Its default session too.
        for i in range(4):
            r = await client.call_tool(
                "run_python", {"code": "m = globals().get('m', 0) + 1\nprint(m)"}
            )
            assert text(r) == str(i + 1)
    assert sent >= 9
