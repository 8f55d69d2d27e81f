"""HTTP routes of the code-execution API: parse, make one call on the sandbox port, serialize."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..config import Settings
from ..errors import BadRequest, UnsupportedMediaType
from ..http.auth import TokenAuth
from ..http.bodies import capped, check_declared, json_body
from ..http.multipart import FormStream, is_multipart
from ..http.responses import SSE_HEADERS, sse, untrusted_file_headers
from ..http.routing import grouped_routes
from ..media import media_type
from ..protocol import codec
from ..protocol.calls import Display, Done, Event, Output
from ..protocol.sessions import SESSION_NAME_HEADER, FormPart
from ..sandbox.port import Sandboxes
from .beside import BesideApi

MULTIPART_SLACK = 64 * 1024  # boundaries and the `path` field beside the file


class ExecApi:
    """The code-execution API's routes over the sandbox port."""

    def __init__(self, sandboxes: Sandboxes, auth: TokenAuth, settings: Settings) -> None:
        self.sandboxes = sandboxes
        self.auth = auth
        self.settings = settings
        self.beside = BesideApi(sandboxes, auth)

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
                *self.beside.table(),
            ]
        )

    def _caller(self, request: Request) -> tuple[str, str]:
        """(session id, tenant) of a request on one session."""
        tenant = self.auth.tenant(request.headers.get("authorization"))
        return request.path_params["session_id"], tenant

    async def create_session(self, request: Request) -> Response:
        tenant = self.auth.tenant(request.headers.get("authorization"))
        spec = codec.parse_create(await json_body(request, optional=True))
        if self.settings.role == "node":  # only fronts reach a node; they never pass it on
            name = request.headers.get(SESSION_NAME_HEADER)
            spec = dataclasses.replace(spec, name=name[:128] if name else None)
        info = await self.sandboxes.create(tenant, spec)
        return JSONResponse(codec.encode_handle(info), status_code=201)

    async def destroy_session(self, request: Request) -> Response:
        await self.sandboxes.destroy(*self._caller(request))
        return Response(status_code=204)

    async def execute(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        await self.sandboxes.get(session_id, tenant)  # 404 before reading a large body
        req = codec.parse_exec(await json_body(request))
        s = self.settings
        timeout = min(req.timeout or s.exec_timeout_default, s.exec_timeout_max)
        tool_use_id = req.tool_use_id or f"srvtoolu_{secrets.token_hex(12)}"
        if "text/event-stream" in request.headers.get("accept", ""):
            # The call runs on its own: a client that goes away interrupts nothing, unless it
            # asked for that with `?on_disconnect=interrupt`.
            interrupt = request.query_params.get("on_disconnect") == "interrupt"
            events = self.sandboxes.stream(
                session_id, tenant, req.call, timeout, cancel_on_close=interrupt
            )
            return StreamingResponse(
                _sse(events, req.tool, tool_use_id),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        result = await self.sandboxes.execute(session_id, tenant, req.call, timeout)
        return JSONResponse(codec.encode_result(req.tool, tool_use_id, result))

    async def list_files(self, request: Request) -> Response:
        path = request.query_params.get("path", ".")
        entries, truncated = await self.sandboxes.list_files(
            *self._caller(request), path, self.settings.list_files_max
        )
        return JSONResponse(codec.encode_listing(entries, truncated))

    async def get_file(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        path = request.query_params.get("path")
        if not path:
            await self.sandboxes.get(session_id, tenant)  # an unknown session is a 404 first
            raise BadRequest("the query parameter `path` is required")
        download = await self.sandboxes.read_file(session_id, tenant, path)
        # Chunked, at most the size at open: a file changing while it is sent keeps the
        # response's framing valid.
        return StreamingResponse(
            download.chunks,
            media_type=media_type(download.name),
            headers=untrusted_file_headers(download.name),
        )

    async def put_file(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        await self.sandboxes.get(session_id, tenant)  # 404 before reading a large body
        cap = self.settings.put_file_max_bytes
        body_cap = cap + MULTIPART_SLACK
        check_declared(request, body_cap, "the file")
        content_type = request.headers.get("content-type")
        if not is_multipart(content_type):
            raise UnsupportedMediaType("PutFile takes multipart/form-data with a `file` part")
        form = FormStream(content_type, capped(request.stream(), body_cap, "the file"))
        entry = await self.sandboxes.upload(session_id, tenant, _parts(form), cap)
        return JSONResponse(codec.encode_file(entry), status_code=201)

    async def health(self, request: Request) -> Response:
        if not self.sandboxes.healthy():
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok", **self.sandboxes.status()})


async def _parts(form: FormStream) -> AsyncIterator[FormPart]:
    async for part, chunks in form.parts():
        yield part.name, part.filename, chunks


async def _sse(events: AsyncIterator[Event], tool: str, tool_use_id: str) -> AsyncIterator[bytes]:
    """A streamed Execute's events: `stdout`, `stderr`, `display`, then `result`."""
    async for event in events:
        if isinstance(event, Output):
            yield sse(event.stream, {"text": event.text})
        elif isinstance(event, Display):
            yield sse("display", event.bundle)
        elif isinstance(event, Done):
            yield sse("result", codec.encode_result(tool, tool_use_id, event.result))
