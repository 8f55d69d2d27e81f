"""HTTP routes of the code-execution API: parse, make one runtime call, serialize."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import BadRequest, PayloadTooLarge, Unprocessable, UnsupportedMediaType
from ..http import SSE_HEADERS, grouped_routes, sse, untrusted_file_headers
from ..multipart import FormStream, is_multipart
from ..sandbox import transfers
from ..sandbox.base import ExecResult
from ..sandbox.sessions import ExecSession, Runtime
from ..sandbox.workspace import media_type
from . import schemas
from .auth import TokenAuth

MAX_JSON_BODY = 16 * 1024 * 1024


class ExecApi:
    """The code-execution API's routes over the runtime."""

    def __init__(self, runtime: Runtime, auth: TokenAuth) -> None:
        self.runtime = runtime
        self.auth = auth
        self.settings = runtime.settings

    def routes(self) -> list[Route]:
        return grouped_routes(
            [
                ("/sessions", "POST", self.create_session),
                ("/sessions/{session_id}", "DELETE", self.destroy_session),
                ("/sessions/{session_id}/exec", "POST", self.execute),
                ("/sessions/{session_id}/files/list", "GET", self.list_files),
                ("/sessions/{session_id}/files", "GET", self.get_file),
                ("/sessions/{session_id}/files", "POST", self.put_file),
                ("/health", "GET", self.health),
            ]
        )

    def _tenant(self, request: Request) -> str:
        return self.auth.tenant(request.headers.get("authorization"))

    def _session(self, request: Request) -> ExecSession:
        return self.runtime.get(request.path_params["session_id"], self._tenant(request))

    async def create_session(self, request: Request) -> Response:
        tenant = self._tenant(request)
        body = await json_body(request, optional=True)
        idle, lifetime = schemas.parse_create(body)
        network = schemas.parse_network(body)
        session = await self.runtime.create(tenant, idle, lifetime, network)
        return JSONResponse(session_handle(session), status_code=201)

    async def destroy_session(self, request: Request) -> Response:
        await self.runtime.destroy(request.path_params["session_id"], self._tenant(request))
        return Response(status_code=204)

    async def execute(self, request: Request) -> Response:
        tenant = self._tenant(request)
        session_id = request.path_params["session_id"]
        self.runtime.get(session_id, tenant)  # 404 before reading a large body
        req = schemas.parse_exec(await json_body(request))
        timeout = min(
            req.timeout or self.settings.exec_timeout_default, self.settings.exec_timeout_max
        )
        tool_use_id = req.tool_use_id or f"srvtoolu_{secrets.token_hex(12)}"
        if "text/event-stream" in request.headers.get("accept", ""):
            interrupt = request.query_params.get("on_disconnect") == "interrupt"
            events = self._stream(session_id, tenant, req, timeout, tool_use_id, interrupt)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        result = await self.runtime.execute(session_id, tenant, req.call, timeout)
        return JSONResponse(exec_response(req.tool, tool_use_id, result))

    async def _stream(
        self,
        session_id: str,
        tenant: str,
        req: schemas.ExecRequest,
        timeout: float,
        tool_use_id: str,
        interrupt_on_disconnect: bool,
    ) -> AsyncIterator[bytes]:
        """A streamed Execute: output and displays as they come, then the plain call's result.

        The call runs on its own: a client that goes away interrupts nothing, unless it asked
        for that with `?on_disconnect=interrupt`.
        """
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        call = asyncio.ensure_future(
            self.runtime.execute(
                session_id, tenant, req.call, timeout, lambda k, d: queue.put_nowait((k, d))
            )
        )
        call.add_done_callback(lambda _: queue.put_nowait(("done", None)))
        try:
            while (item := await queue.get())[0] != "done":
                kind, data = item
                yield sse(kind, {"text": data} if isinstance(data, str) else data)
            yield sse("result", exec_response(req.tool, tool_use_id, call.result()))
        finally:
            if interrupt_on_disconnect and not call.done():
                call.cancel()  # the runtime interrupts the code and keeps the session in step

    async def list_files(self, request: Request) -> Response:
        session = self._session(request)
        path = request.query_params.get("path", ".")
        entries, truncated = await transfers.list_files(session, path, self.settings.list_files_max)
        files: list[dict[str, Any]] = []
        for e in entries:
            item: dict[str, Any] = {
                "path": e.path,
                "size_bytes": e.size_bytes,
                "mime_type": e.mime_type,
                "modified_at": e.modified_at,
            }
            if e.is_dir:
                item["is_dir"] = True
            files.append(item)
        body: dict[str, Any] = {"files": files, "truncated": truncated}
        return JSONResponse(body)

    async def get_file(self, request: Request) -> Response:
        session = self._session(request)
        path = request.query_params.get("path")
        if not path:
            raise BadRequest("the query parameter `path` is required")
        download = await transfers.open_download(session, path)
        # Chunked, at most the size at open: a file changing while it is sent keeps the
        # response's framing valid.
        return StreamingResponse(
            download.chunks,
            media_type=media_type(download.name),
            headers=untrusted_file_headers(download.name),
        )

    async def put_file(self, request: Request) -> Response:
        session = self._session(request)
        cap = self.settings.put_file_max_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap + 64 * 1024:
            raise PayloadTooLarge(f"the file is larger than the cap of {cap} bytes")
        content_type = request.headers.get("content-type")
        if not is_multipart(content_type):
            raise UnsupportedMediaType("PutFile takes multipart/form-data with a `file` part")
        form = FormStream(content_type, request.stream())
        parts = ((p.name, p.filename, chunks) async for p, chunks in form.parts())
        path, size = await transfers.put_file(session, parts, cap)
        return JSONResponse({"path": path, "size_bytes": size}, status_code=201)

    async def health(self, request: Request) -> Response:
        if not self.runtime.healthy():
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok", "pool_ready": self.runtime.pool.ready})


def session_handle(session: ExecSession) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "idle_timeout_seconds": session.idle_timeout,
        "max_lifetime_seconds": session.max_lifetime,
        "created_at": session.created_at,
        "last_activity_at": session.last_activity_at,
        "network": network_in_force(session),
    }


def network_in_force(session: ExecSession) -> str | dict[str, list[str]]:
    """The session's network policy, in the form of CreateSession's hint (an addition)."""
    return "none" if session.network.is_none else {"allow": session.network.entries()}


def exec_response(tool: str, tool_use_id: str, result: ExecResult) -> dict[str, Any]:
    return {
        "tool_use_id": tool_use_id,
        "execution_time_ms": result.duration_ms,
        "result_block": {
            "type": schemas.RESULT_TYPES[tool],
            "tool_use_id": tool_use_id,
            "content": {
                "type": "code_execution_result",
                "stdout": result.stdout,
                "stderr": result.stderr,
                "return_code": result.return_code,
                "content": [
                    {"type": "code_execution_output", "file_id": f, "filename": f}
                    for f in result.files
                ],
                **({"display_outputs": result.displays} if result.displays else {}),
            },
        },
    }


async def json_body(request: Request, optional: bool = False) -> Any:
    """The request's JSON body, refusing other media types (a CSRF and confusion guard)."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_JSON_BODY:
            raise PayloadTooLarge(f"the request body is larger than {MAX_JSON_BODY} bytes")
    if not raw.strip():
        if optional:
            return None
        raise Unprocessable("a JSON request body is required")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise UnsupportedMediaType("request bodies must be JSON (Content-Type: application/json)")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise Unprocessable(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise Unprocessable("the request body is nested too deeply") from None
