"""HTTP routes of the interpreter API under `/api`: parse, make one service call, serialize."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sandbank.errors import BadRequest
from sandbank.files import content_type
from sandbank.http.bodies import capped, check_declared, read_body
from sandbank.http.multipart import FormStream, is_multipart
from sandbank.http.responses import SSE_HEADERS, untrusted_file_headers
from sandbank.http.routing import grouped_routes
from sandbank.interpreter import openapi, schemas
from sandbank.interpreter.identity import Identity
from sandbank.interpreter.service import InterpreterService
from sandbank.store import User

MAX_MESSAGE_BODY_SLACK = 4096  # JSON syntax and a `role` beside the content
MAX_CREDENTIAL_BODY = 64 * 1024
INCLUDE_MESSAGES = "include_messages_from"  # GetSession's addition, read by the spec's web client


class InterpreterApi:
    """The interpreter API's routes over its service; `identity` says who calls."""

    def __init__(
        self, service: InterpreterService, identity: Identity, max_message_chars: int
    ) -> None:
        self.service = service
        self.identity = identity
        self.max_message_chars = max_message_chars

    def routes(self) -> list[Route]:
        r: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
            ("/sessions", self.create_session, "POST"),
            ("/sessions", self.list_sessions, "GET"),
            ("/sessions/{session_id}", self.get_session, "GET"),
            ("/sessions/{session_id}", self.delete_session, "DELETE"),
            ("/sessions/{session_id}", self.rename_session, "PATCH"),
            ("/sessions/{session_id}/cancel", self.cancel, "POST"),
            ("/sessions/{session_id}/retry", self.ask_again, "POST"),
            ("/sessions/{session_id}/messages", self.post_message, "POST"),
            ("/sessions/{session_id}/messages", self.list_messages, "GET"),
            ("/sessions/{session_id}/events", self.session_events, "GET"),
            ("/sessions/{session_id}/files", self.list_files, "GET"),
            ("/sessions/{session_id}/files", self.delete_file, "DELETE"),
            ("/sessions/{session_id}/files/upload", self.upload_form, "GET"),
            ("/sessions/{session_id}/files/download", self.download_url, "GET"),
            ("/uploads", self.receive_upload, "POST"),
            ("/downloads", self.serve_download, "GET"),
            ("/credentials", self.list_credentials, "GET"),
            ("/credentials", self.store_credential, "POST"),
            ("/credentials/{credential_id}", self.delete_credential, "DELETE"),
            ("/openapi.json", self.openapi, "GET"),
        ]
        return grouped_routes([(path, method, fn) for path, fn, method in r])

    async def _caller(self, request: Request) -> tuple[InterpreterService, User]:
        return self.service, await self.identity.user(request)

    async def _in_session(self, request: Request) -> tuple[InterpreterService, User, str]:
        service, user = await self._caller(request)
        return service, user, schemas.session_id(request.path_params["session_id"])

    async def _service(self) -> InterpreterService:
        return self.service

    # --- credentials (listed without their values) -----------------------------------------------
    async def list_credentials(self, request: Request) -> Response:
        service, user = await self._caller(request)
        found = await service.list_credentials(user)
        return JSONResponse({"credentials": [c.to_json() for c in found]})

    async def store_credential(self, request: Request) -> Response:
        service, user = await self._caller(request)
        raw = await read_body(request, MAX_CREDENTIAL_BODY, BadRequest)
        try:
            body = json.loads(raw)
        except ValueError:
            raise BadRequest("the request body must be a JSON object (a credential)") from None
        return JSONResponse((await service.store_credential(user, body)).to_json())

    async def delete_credential(self, request: Request) -> Response:
        service, user = await self._caller(request)
        await service.delete_credential(user, request.path_params["credential_id"])
        return JSONResponse({})

    # --- sessions ------------------------------------------------------------------------------
    async def create_session(self, request: Request) -> Response:
        service, user = await self._caller(request)
        # A new session has no sandbox yet: its first question starts one.
        return JSONResponse(schemas.session_out(await service.create_session(user), "none"))

    async def list_sessions(self, request: Request) -> Response:
        service, user = await self._caller(request)
        sessions = await service.list_sessions(user)
        return JSONResponse([schemas.session_out(*s) for s in sessions])

    async def get_session(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        after = schemas.after(request.query_params.get(INCLUDE_MESSAGES), INCLUDE_MESSAGES)
        if after is None:
            return JSONResponse(schemas.session_out(*await service.get_session(user, sid)))
        (session, sandbox), messages = await service.session_with_messages(user, sid, after)
        return JSONResponse(schemas.session_with_messages_out(session, sandbox, messages))

    async def delete_session(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        await service.delete_session(user, sid)
        return JSONResponse({})

    async def rename_session(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        raw = await read_body(request, MAX_MESSAGE_BODY_SLACK, BadRequest)
        title = schemas.session_title(raw, request.headers.get("content-type", ""))
        return JSONResponse(schemas.session_out(*await service.rename(user, sid, title)))

    async def cancel(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        return JSONResponse(schemas.session_out(*await service.cancel(user, sid)))

    # --- messages ------------------------------------------------------------------------------
    async def post_message(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        raw = await read_body(
            request, self.max_message_chars * 4 + MAX_MESSAGE_BODY_SLACK, BadRequest
        )
        content = schemas.message_content(
            raw, request.headers.get("content-type", ""), self.max_message_chars
        )
        message = await service.post_message(user, sid, content)
        return JSONResponse(schemas.message_out(message))

    async def ask_again(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        return JSONResponse(schemas.message_out(await service.ask_again(user, sid)))

    async def list_messages(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        after = schemas.after(request.query_params.get("from"))
        messages = await service.messages(user, sid, after)
        return JSONResponse([schemas.message_out(m) for m in messages])

    async def session_events(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        raw = request.query_params.get("from", request.headers.get("last-event-id"))
        events, release = await service.events(user, sid, schemas.after(raw))
        return ReleasingStream(
            (schemas.event_out(e) async for e in events),
            release,
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    # --- files ---------------------------------------------------------------------------------
    async def list_files(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        return JSONResponse([schemas.file_out(f) for f in await service.list_files(user, sid)])

    async def delete_file(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        filename = schemas.stored_name(request.query_params.get("filename"))
        await service.delete_file(user, sid, filename)
        return JSONResponse({})

    async def upload_form(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        filename = schemas.upload_name(request.query_params.get("filename"))
        form = await service.upload_form(user, sid, filename)
        return JSONResponse({"url": form.url, "fields": form.fields})

    async def download_url(self, request: Request) -> Response:
        service, user, sid = await self._in_session(request)
        filename = schemas.stored_name(request.query_params.get("filename"))
        return JSONResponse({"url": await service.download_url(user, sid, filename)})

    async def receive_upload(self, request: Request) -> Response:
        """The presigned form's target (local store): its signed URL is the credential,
        checked before a byte of the body is read; the body is capped by what it allows."""
        files = (await self._service()).files
        grant = files.authorize_upload(request.query_params)
        cap = files.upload_body_cap(grant)
        check_declared(request, cap, "the upload")
        content_type = request.headers.get("content-type")
        if not is_multipart(content_type):
            raise BadRequest("uploads are multipart/form-data: the form's fields, then `file`")
        form = FormStream(content_type, capped(request.stream(), cap, "the upload"))
        parts = ((p.name, p.filename, chunks) async for p, chunks in form.parts())
        declared = request.headers.get("content-length", "")
        await files.receive(grant, parts, int(declared) if declared.isdigit() else None)
        return Response(status_code=204)

    async def serve_download(self, request: Request) -> Response:
        """A presigned download URL (local store): its signature is the credential."""
        download = await (await self._service()).files.download(request.query_params)
        return StreamingResponse(
            download.chunks,
            media_type=content_type(download.filename),
            headers=untrusted_file_headers(download.filename),
        )

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi.document())


class ReleasingStream(StreamingResponse):
    """A streamed response that gives back what it holds once sent, or abandoned before a
    byte of it was (a client gone before its stream started)."""

    def __init__(self, content: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
