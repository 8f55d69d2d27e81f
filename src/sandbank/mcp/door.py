"""The MCP server over the sandbox port: each tool parses its arguments, makes one port call
(a session's first call also makes the session), and shapes the result.

What the model can act on (a failing program, a timeout, a bad argument, an unknown handle, a
missing file) is a result with `isError`; what it cannot (no room, a broken sandbox, a bug) is
an MCP error with a message that says so. Another tenant's handle is unknown, exactly as on the
code-execution API.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server import CacheHint, Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from .. import __version__
from ..config import Settings
from ..errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    SandbankError,
    SandboxUnavailable,
    SessionNotFound,
    Unprocessable,
)
from ..media import media_type
from ..protocol import codec
from ..protocol.calls import ToolCall
from ..protocol.sessions import SessionSpec
from ..sandbox.port import Sandboxes, copy_out, walk
from .results import (
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    URI_TEMPLATE,
    call_result,
    error_result,
    file_contents,
    file_uri,
    is_image,
    parse_uri,
)
from .sessions import Caller, DefaultGone, DefaultSessions
from .tools import SCHEMAS, TOOLS

log = logging.getLogger(__name__)
TENANT_KEY = "sandbank.tenant"  # where the HTTP guard leaves the caller's tenant in the scope
MAX_READ_BYTES = 10 * 1024 * 1024  # read_file and resources/read; larger files: GetFile
# The tool list changes with the server's version only: clients may keep it a while.
LIST_TTL = CacheHint(ttl_ms=600_000, scope="public")
INSTRUCTIONS = (
    "Sandbank runs Python and bash for you in isolated sandboxes that keep their state between "
    "calls. Every tool works in your default session unless you pass a session_id from "
    "start_session; use separate sessions for separate tasks. Files live in /workspace; figures "
    "come back as images. Sessions end after being idle for a while."
)

Context = ServerRequestContext[Any, Any]
Args = dict[str, Any]
Handler = Callable[[Caller, Args], Awaitable[types.CallToolResult]]


class McpDoor:
    """The MCP server of one app (HTTP) or process (stdio), over one sandbox port."""

    def __init__(self, sandboxes: Sandboxes, settings: Settings, stdio_tenant: str = "") -> None:
        self.sandboxes = sandboxes
        self.settings = settings
        self.stdio_tenant = stdio_tenant
        self.defaults = DefaultSessions()
        self._tools: dict[str, Handler] = {
            "run_python": self.run_python,
            "run_bash": self.run_bash,
            "text_editor": self.text_editor,
            "list_files": self.list_files,
            "read_file": self.read_file,
            "write_file": self.write_file,
            "start_session": self.start_session,
            "end_session": self.end_session,
            "pause_session": self.pause_session,
            "resume_session": self.resume_session,
        }
        assert set(self._tools) == set(SCHEMAS), "every tool listed has a handler"
        self.server: Server[Any] = Server(
            "sandbank",
            version=__version__,
            title="Sandbank code interpreter",
            instructions=INSTRUCTIONS,
            get_tool_input_schema=SCHEMAS.get,  # spares a tools/list per call (header checks)
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            cache_hints={
                "tools/list": LIST_TTL,
                "server/discover": LIST_TTL,
                "resources/templates/list": LIST_TTL,
            },
        )
        # Requests are logged and measured by the app's own middleware, not OpenTelemetry spans.
        self.server.middleware[:] = [
            m for m in self.server.middleware if "OpenTelemetry" not in type(m).__name__
        ]

    # --- who calls -------------------------------------------------------------------------
    def caller(self, ctx: Context) -> Caller:
        request: Request | None = ctx.request
        if request is None:  # stdio: one client, this process
            return Caller(self.stdio_tenant, "stdio")
        tenant = str(request.scope.get(TENANT_KEY, ""))
        mcp_session = request.headers.get("mcp-session-id")
        if mcp_session:
            return Caller(tenant, "mcp-session:" + _digest(mcp_session))
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        declared = "" if info is None else f"{info.name}\0{info.version}"
        return Caller(tenant, "client:" + _digest(declared))

    async def _session(self, caller: Caller, args: Args) -> tuple[str, bool]:
        """(the session a call names, or the caller's default one; whether it is the default)."""
        given = args.get("session_id")
        if given is not None:
            if not isinstance(given, str) or not given:
                raise Unprocessable("session_id must be a non-empty string (or left out)")
            return given, False

        def create() -> Awaitable[Any]:
            # Named after the caller, so another replica asking for it finds the same session
            # (on a fleet: on the node the name belongs to; see FleetSandboxes.create).
            return self.sandboxes.create(caller.tenant, SessionSpec(name=caller.identity))

        session_id, _ = await self.defaults.get_or_create(caller, create)
        return session_id, True

    @contextlib.asynccontextmanager
    async def _on_session(self, caller: Caller, args: Args) -> AsyncIterator[str]:
        """The session a call names (or the caller's default one), for the calls made on it
        in the block: a default session found gone is forgotten and said so (`DefaultGone`)."""
        session_id, default = await self._session(caller, args)
        try:
            yield session_id
        except SessionNotFound:
            if not default:
                raise
            self.defaults.forget(caller, session_id)
            raise DefaultGone(
                "your default session has ended (it was idle longer than its idle timeout, "
                "reached its lifetime, or the machine holding it went away): its variables and "
                "files are gone, and this call did not run. Call again to work in a fresh default "
                "session."
            ) from None

    # --- tools -------------------------------------------------------------------------------
    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        handler = self._tools.get(params.name)
        if handler is None:
            names = ", ".join(self._tools)
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}; tools: {names}")
        try:
            return await handler(self.caller(ctx), dict(params.arguments or {}))
        except DefaultGone as e:
            return error_result(e.message)
        except SessionNotFound as e:
            why = "it ended, or it is not yours" if e.message.startswith("no session") else ""
            return error_result(
                f"Session not found: {why or e.message.rstrip('.')}. Start a session with "
                "start_session, or leave session_id out to work in your default session."
            )
        except (BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge) as e:
            return error_result(e.message)
        except (AtCapacity, SandboxUnavailable) as e:
            raise MCPError(
                types.INTERNAL_ERROR,
                f"{e.message}; retry in {e.retry_after} s",
                {"retry_after_seconds": e.retry_after},
            ) from None
        except SandbankError as e:
            log.error("MCP tool %s failed: %s: %s", params.name, e.code, e.message)
            raise MCPError(types.INTERNAL_ERROR, f"the sandbox failed: {e.message}") from None
        except MCPError:
            raise
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("unexpected error in MCP tool %s, request id %s", params.name, request_id)
            raise MCPError(
                types.INTERNAL_ERROR,
                f"internal error; the server logged it with request id {request_id}",
            ) from None

    def _timeout(self, args: Args) -> float:
        s = self.settings
        given = args.get("timeout_seconds")
        if given is None:
            return float(min(s.exec_timeout_default, s.exec_timeout_max))
        if isinstance(given, bool) or not isinstance(given, int | float) or given < 1:
            raise Unprocessable("timeout_seconds must be an integer >= 1")
        return float(min(int(given), s.exec_timeout_max))

    async def _run(self, caller: Caller, args: Args, call: ToolCall) -> types.CallToolResult:
        timeout = self._timeout(args)
        async with self._on_session(caller, args) as session_id:
            result = await self.sandboxes.execute(session_id, caller.tenant, call, timeout)
        pictures: dict[str, bytes] = {}
        for path in [f for f in result.files if is_image(f)][:MAX_IMAGES]:
            try:
                pictures[path] = await self._read(session_id, caller.tenant, path, MAX_IMAGE_BYTES)
            except SandbankError:
                continue  # too large, or gone already: its link stays
        return call_result(session_id, result, timeout, pictures)

    async def run_python(self, caller: Caller, args: Args) -> types.CallToolResult:
        return await self._run(caller, args, codec.tool_call("code_execution", args))

    async def run_bash(self, caller: Caller, args: Args) -> types.CallToolResult:
        return await self._run(caller, args, codec.tool_call("bash_code_execution", args))

    async def text_editor(self, caller: Caller, args: Args) -> types.CallToolResult:
        call = codec.tool_call("text_editor_code_execution", args)
        return await self._run(caller, args, call)

    async def list_files(self, caller: Caller, args: Args) -> types.CallToolResult:
        path = _path(args, required=False)
        async with self._on_session(caller, args) as session_id:
            entries, truncated = await self.sandboxes.list_files(
                session_id, caller.tenant, path, self.settings.list_files_max
            )
        lines = [
            f"{e.path}/" if e.is_dir else f"{e.path}\t{e.size_bytes} bytes\t{_when(e.modified_at)}"
            for e in entries
        ]
        if truncated:
            lines.append(f"[more entries were left out: the listing stops at {len(entries)}]")
        return types.CallToolResult(
            content=[types.TextContent(text="\n".join(lines) or "(empty directory)")]
        )

    async def read_file(self, caller: Caller, args: Args) -> types.CallToolResult:
        path = _path(args)
        async with self._on_session(caller, args) as session_id:
            data = await self._read(session_id, caller.tenant, path, MAX_READ_BYTES)
        contents = file_contents(file_uri(session_id, path), path, data)
        block: types.ContentBlock
        if isinstance(contents, types.TextResourceContents):
            block = types.TextContent(text=contents.text)
        elif is_image(path):
            block = types.ImageContent(data=contents.blob, mime_type=contents.mime_type or "")
        else:
            block = types.EmbeddedResource(resource=contents)
        return types.CallToolResult(content=[block])

    async def write_file(self, caller: Caller, args: Args) -> types.CallToolResult:
        path = _path(args)
        content = args.get("content")
        if not isinstance(content, str):
            raise Unprocessable("content is required: a string")
        encoding = args.get("encoding", "utf-8")
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise Unprocessable("content is not valid base64") from None
        elif encoding == "utf-8":
            data = _utf8(content, "content").encode("utf-8")
        else:
            raise Unprocessable('encoding must be "utf-8" or "base64"')
        async with self._on_session(caller, args) as session_id:
            entry = await self.sandboxes.write_file(session_id, caller.tenant, path, _once(data))
        return types.CallToolResult(
            content=[types.TextContent(text=f"wrote {entry.size_bytes} bytes to {entry.path}")]
        )

    async def start_session(self, caller: Caller, args: Args) -> types.CallToolResult:
        spec = codec.parse_create({k: v for k, v in args.items() if k == "idle_timeout_seconds"})
        info = await self.sandboxes.create(
            caller.tenant, SessionSpec(idle_timeout=spec.idle_timeout)
        )
        handle = {
            "session_id": info.id,
            "idle_timeout_seconds": info.idle_timeout,
            "max_lifetime_seconds": info.max_lifetime,
        }
        text = (
            f"session_id: {info.id}\nPass it to the other tools. The session ends after "
            f"{info.idle_timeout} s unused, or at the latest {info.max_lifetime} s from now."
        )
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=handle
        )

    async def end_session(self, caller: Caller, args: Args) -> types.CallToolResult:
        given = args.get("session_id")
        if given is None:
            session_id = self.defaults.get(caller)
            if session_id is None:
                return types.CallToolResult(
                    content=[types.TextContent(text="you have no default session to end")]
                )
        else:
            session_id, _ = await self._session(caller, args)
        self.defaults.forget(caller, session_id)
        await self.sandboxes.destroy(session_id, caller.tenant)
        return types.CallToolResult(
            content=[types.TextContent(text=f"session {session_id} ended (or was gone already)")]
        )

    async def pause_session(self, caller: Caller, args: Args) -> types.CallToolResult:
        async with self._on_session(caller, args) as session_id:
            await self.sandboxes.pause(session_id, caller.tenant)
        return types.CallToolResult(
            content=[
                types.TextContent(
                    text=f"session {session_id} paused: nothing runs and it holds no memory; "
                    "its variables, shell and files are kept. The next call on it resumes it."
                )
            ],
            structured_content={"session_id": session_id, "state": "paused"},
        )

    async def resume_session(self, caller: Caller, args: Args) -> types.CallToolResult:
        async with self._on_session(caller, args) as session_id:
            await self.sandboxes.resume(session_id, caller.tenant)
        return types.CallToolResult(
            content=[types.TextContent(text=f"session {session_id} is running")],
            structured_content={"session_id": session_id, "state": "running"},
        )

    async def _read(self, session_id: str, tenant: str, path: str, cap: int) -> bytes:
        buffer = io.BytesIO()
        await copy_out(self.sandboxes, session_id, tenant, path, buffer, cap)
        return buffer.getvalue()

    # --- resources ---------------------------------------------------------------------------
    async def _list_resources(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """The files of the caller's default session (other sessions': through the template)."""
        caller = self.caller(ctx)
        session_id = self.defaults.get(caller)
        if session_id is None:
            return types.ListResourcesResult(resources=[])
        try:
            entries = await walk(self.sandboxes, session_id, caller.tenant)
        except SessionNotFound:
            self.defaults.forget(caller, session_id)
            return types.ListResourcesResult(resources=[])
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=e.path,
                    uri=file_uri(session_id, e.path),
                    mime_type=media_type(e.path),
                    size=e.size_bytes,
                )
                for e in entries
            ]
        )

    async def _list_templates(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="session-file",
            title="A file of a session's workspace",
            uri_template=URI_TEMPLATE,
            description="A file of a session's workspace, by its handle and workspace path.",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def _read_resource(
        self, ctx: Context, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        parsed = parse_uri(uri)
        if parsed is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {uri!r}", {"uri": uri})
        session_id, path = parsed
        caller = self.caller(ctx)
        try:
            data = await self._read(session_id, caller.tenant, path, MAX_READ_BYTES)
        except (NotFound, Forbidden, BadRequest) as e:  # an unknown session is a NotFound too
            raise MCPError(
                types.INVALID_PARAMS, f"resource not found: {uri} ({e.message})", {"uri": uri}
            ) from None
        except PayloadTooLarge as e:
            raise MCPError(types.INVALID_PARAMS, e.message, {"uri": uri}) from None
        except SandbankError as e:
            raise MCPError(types.INTERNAL_ERROR, f"the sandbox failed: {e.message}") from None
        return types.ReadResourceResult(contents=[file_contents(uri, path, data)])


def _path(args: Args, required: bool = True) -> str:
    path = args.get("path")
    if path is None and not required:
        return "."
    if not isinstance(path, str) or not path:
        raise Unprocessable("path is required: a non-empty string")
    return _utf8(path, "path")


def _utf8(value: str, name: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Unprocessable(
            f"{name} contains a lone surrogate: it must be valid Unicode text"
        ) from None
    return value


def _digest(text: str) -> str:
    """A client's own strings (of any length) as a fixed-size key."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
