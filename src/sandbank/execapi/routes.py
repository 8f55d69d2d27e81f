"""HTTP routes of the code-execution API: parse, make one runtime call, serialize."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import BadRequest, PayloadTooLarge, Unprocessable, UnsupportedMediaType
from ..http import untrusted_file_headers
from ..sandbox.base import ExecResult
from ..sandbox.sessions import Runtime, Session
from ..sandbox.workspace import Workspace, media_type
from . import schemas
from .auth import TokenAuth
from .uploads import receive_upload

MAX_JSON_BODY = 16 * 1024 * 1024
CHUNK = 256 * 1024


class ExecApi:
    def __init__(self, runtime: Runtime, auth: TokenAuth) -> None:
        self.runtime = runtime
        self.auth = auth
        self.settings = runtime.settings

    def routes(self) -> list[Route]:
        return [
            Route("/sessions", self.create_session, methods=["POST"]),
            Route("/sessions/{session_id}", self.destroy_session, methods=["DELETE"]),
            Route("/sessions/{session_id}/exec", self.execute, methods=["POST"]),
            Route("/sessions/{session_id}/files/list", self.list_files, methods=["GET"]),
            Route("/sessions/{session_id}/files", self.get_file, methods=["GET"]),
            Route("/sessions/{session_id}/files", self.put_file, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
        ]

    def _tenant(self, request: Request) -> str:
        return self.auth.tenant(request.headers.get("authorization"))

    def _session(self, request: Request) -> Session:
        return self.runtime.get(request.path_params["session_id"], self._tenant(request))

    async def create_session(self, request: Request) -> Response:
        tenant = self._tenant(request)
        body = await json_body(request, optional=True)
        idle, lifetime = schemas.parse_create(body)
        network = schemas.parse_network(body)
        session = await self.runtime.create(tenant, idle, lifetime, network)
        return JSONResponse(handle(session), status_code=201)

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
        result = await self.runtime.execute(session_id, tenant, req.call, timeout)
        tool_use_id = req.tool_use_id or f"srvtoolu_{secrets.token_hex(12)}"
        return JSONResponse(exec_response(req.tool, tool_use_id, result))

    async def list_files(self, request: Request) -> Response:
        session = self._session(request)
        path = request.query_params.get("path", ".")
        ws = Workspace(session.sandbox.workspace, None)
        entries, truncated = await asyncio.to_thread(ws.list, path, self.settings.list_files_max)
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
        ws = Workspace(session.sandbox.workspace, None)
        fd, st = await asyncio.to_thread(ws.open_file, path)
        name = path.rstrip("/").rsplit("/", 1)[-1]
        return StreamingResponse(
            _stream(fd),
            media_type=media_type(name),
            headers=untrusted_file_headers(name, st.st_size),
        )

    async def put_file(self, request: Request) -> Response:
        session = self._session(request)
        ws = Workspace(session.sandbox.workspace, session.sandbox.uid)
        path, size = await receive_upload(request, ws, self.settings.put_file_max_bytes)
        return JSONResponse({"path": path, "size_bytes": size}, status_code=201)

    async def health(self, request: Request) -> Response:
        if not self.runtime.healthy():
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok", "pool_ready": self.runtime.pool.ready})


def handle(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "idle_timeout_seconds": session.idle_timeout,
        "max_lifetime_seconds": session.max_lifetime,
        "created_at": session.created_at,
        "last_activity_at": session.last_activity_at,
        "network": network_in_force(session),
    }


def network_in_force(session: Session) -> str | dict[str, list[str]]:
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
            },
        },
    }


async def _stream(fd: int) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(os.read, fd, CHUNK):
            yield chunk
    finally:
        os.close(fd)


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
