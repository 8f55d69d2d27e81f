"""Routes of the additions beside calls and files (what a fleet's fronts ask of their nodes for
the E2B door): sessions listed and extended, Python contexts, background processes, the
workspace tree and its watches. Parse, one call on the sandbox port, serialize."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import BadRequest, PayloadTooLarge, SandbankError, Unprocessable
from ..http.auth import TokenAuth
from ..http.bodies import json_body
from ..http.routing import Endpoint
from ..protocol import additions, codec
from ..protocol.processes import ProcessEvent
from ..sandbox.port import Sandboxes

NDJSON = "application/x-ndjson"
MAX_STDIN = 16 * 1024 * 1024


class BesideApi:
    """The additions' routes over the port."""

    def __init__(self, sandboxes: Sandboxes, auth: TokenAuth) -> None:
        self.sandboxes = sandboxes
        self.auth = auth

    def table(self) -> list[tuple[str, str, Endpoint]]:
        on = "/sessions/{session_id}"
        return [
            ("/sessions", "GET", self.list_sessions),
            (on, "GET", self.get_session),
            (f"{on}/lifetime", "POST", self.set_lifetime),
            (f"{on}/pause", "POST", self.pause),
            (f"{on}/resume", "POST", self.resume),
            (f"{on}/credentials", "GET", self.list_session_credentials),
            (f"{on}/credentials", "PUT", self.replace_session_credentials),
            (f"{on}/credentials/{{credential_id}}", "DELETE", self.remove_session_credential),
            ("/credentials", "GET", self.list_stored_credentials),
            ("/credentials", "POST", self.store_credential),
            ("/credentials/{credential_id}", "DELETE", self.delete_stored_credential),
            (f"{on}/contexts", "POST", self.create_context),
            (f"{on}/contexts", "GET", self.list_contexts),
            (f"{on}/contexts/{{context_id}}", "DELETE", self.remove_context),
            (f"{on}/contexts/{{context_id}}/restart", "POST", self.restart_context),
            (f"{on}/processes", "POST", self.start_process),
            (f"{on}/processes", "GET", self.list_processes),
            (f"{on}/processes/{{pid}}/events", "GET", self.connect_process),
            (f"{on}/processes/{{pid}}/stdin", "POST", self.send_stdin),
            (f"{on}/processes/{{pid}}/stdin/close", "POST", self.close_stdin),
            (f"{on}/processes/{{pid}}/signal", "POST", self.signal_process),
            (f"{on}/tree", "GET", self.list_tree),
            (f"{on}/tree", "DELETE", self.remove),
            (f"{on}/tree/stat", "GET", self.stat),
            (f"{on}/tree/dirs", "POST", self.make_dir),
            (f"{on}/tree/move", "POST", self.move),
            (f"{on}/watch", "GET", self.watch),
            (f"{on}/watchers", "POST", self.create_watcher),
            (f"{on}/watchers/{{watcher_id}}/changes", "GET", self.watcher_changes),
            (f"{on}/watchers/{{watcher_id}}", "DELETE", self.remove_watcher),
        ]

    def _caller(self, request: Request) -> tuple[str, str]:
        tenant = self.auth.tenant(request.headers.get("authorization"))
        return request.path_params["session_id"], tenant

    @staticmethod
    def _path(request: Request) -> str:
        path = request.query_params.get("path")
        if not path:
            raise BadRequest("the query parameter `path` is required")
        return path

    # --- sessions ----------------------------------------------------------------------------
    async def list_sessions(self, request: Request) -> Response:
        tenant = self.auth.tenant(request.headers.get("authorization"))
        found = await self.sandboxes.list_sessions(tenant)
        return JSONResponse({"sessions": [codec.encode_handle(i) for i in found]})

    async def get_session(self, request: Request) -> Response:
        return JSONResponse(codec.encode_handle(await self.sandboxes.get(*self._caller(request))))

    async def pause(self, request: Request) -> Response:
        return JSONResponse(codec.encode_handle(await self.sandboxes.pause(*self._caller(request))))

    async def resume(self, request: Request) -> Response:
        info = await self.sandboxes.resume(*self._caller(request))
        return JSONResponse(codec.encode_handle(info))

    async def set_lifetime(self, request: Request) -> Response:
        body = additions.body_of(await json_body(request))
        seconds = additions.positive(body.get("seconds"), "seconds")
        info = await self.sandboxes.set_lifetime(*self._caller(request), seconds)
        return JSONResponse(codec.encode_handle(info))

    # --- credentials (their values go to the egress proxy; only their listings come back) ------
    async def list_session_credentials(self, request: Request) -> Response:
        found = await self.sandboxes.list_credentials(*self._caller(request))
        return JSONResponse(codec.encode_credentials(found))

    async def replace_session_credentials(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        await self.sandboxes.get(session_id, tenant)  # 404 before reading the body
        credentials = codec.parse_credential_list(await json_body(request))
        found = await self.sandboxes.replace_credentials(session_id, tenant, credentials)
        return JSONResponse(codec.encode_credentials(found))

    async def remove_session_credential(self, request: Request) -> Response:
        credential_id = request.path_params["credential_id"]
        await self.sandboxes.remove_credential(*self._caller(request), credential_id)
        return Response(status_code=204)

    async def list_stored_credentials(self, request: Request) -> Response:
        tenant = self.auth.tenant(request.headers.get("authorization"))
        found = await self.sandboxes.list_stored_credentials(tenant)
        return JSONResponse(codec.encode_credentials(found))

    async def store_credential(self, request: Request) -> Response:
        tenant = self.auth.tenant(request.headers.get("authorization"))
        credential = codec.parse_credential_body(await json_body(request))
        stored = await self.sandboxes.store_credential(tenant, credential)
        return JSONResponse(stored.to_json(), status_code=201)

    async def delete_stored_credential(self, request: Request) -> Response:
        tenant = self.auth.tenant(request.headers.get("authorization"))
        credential_id = request.path_params["credential_id"]
        await self.sandboxes.delete_stored_credential(tenant, credential_id)
        return Response(status_code=204)

    # --- contexts ------------------------------------------------------------------------------
    async def create_context(self, request: Request) -> Response:
        body = additions.body_of(await json_body(request, optional=True) or {})
        cwd = additions.text_of(body, "cwd", required=False)
        made = await self.sandboxes.create_context(*self._caller(request), cwd)
        return JSONResponse(additions.encode_context(made), status_code=201)

    async def list_contexts(self, request: Request) -> Response:
        found = await self.sandboxes.list_contexts(*self._caller(request))
        return JSONResponse({"contexts": [additions.encode_context(c) for c in found]})

    async def remove_context(self, request: Request) -> Response:
        context = request.path_params["context_id"]
        await self.sandboxes.remove_context(*self._caller(request), context)
        return Response(status_code=204)

    async def restart_context(self, request: Request) -> Response:
        context = request.path_params["context_id"]
        await self.sandboxes.restart_context(*self._caller(request), context)
        return Response(status_code=204)

    # --- processes -------------------------------------------------------------------------------
    async def start_process(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        await self.sandboxes.get(session_id, tenant)  # 404 before reading the body
        spec = additions.parse_spec(await json_body(request))
        return await _stream(self.sandboxes.start_process(session_id, tenant, spec))

    async def connect_process(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        pid = _pid(request)
        return await _stream(self.sandboxes.connect_process(session_id, tenant, pid))

    async def list_processes(self, request: Request) -> Response:
        found = await self.sandboxes.list_processes(*self._caller(request))
        return JSONResponse({"processes": [additions.encode_info(p) for p in found]})

    async def send_stdin(self, request: Request) -> Response:
        session_id, tenant = self._caller(request)
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_STDIN:
                raise PayloadTooLarge(f"stdin is written {MAX_STDIN} bytes at a time at most")
        await self.sandboxes.send_stdin(session_id, tenant, _pid(request), bytes(data))
        return Response(status_code=204)

    async def close_stdin(self, request: Request) -> Response:
        await self.sandboxes.close_stdin(*self._caller(request), _pid(request))
        return Response(status_code=204)

    async def signal_process(self, request: Request) -> Response:
        sig = additions.parse_signal(await json_body(request))
        pid = _pid(request)
        await self.sandboxes.signal_process(*self._caller(request), pid, sig)
        return Response(status_code=204)

    # --- the tree --------------------------------------------------------------------------------
    async def stat(self, request: Request) -> Response:
        entry = await self.sandboxes.stat(*self._caller(request), self._path(request))
        return JSONResponse(additions.encode_entry(entry))

    async def list_tree(self, request: Request) -> Response:
        raw = request.query_params.get("depth", "1")
        if not raw.isdigit():
            raise Unprocessable("depth must be a whole number")
        path = request.query_params.get("path", ".")
        found = await self.sandboxes.list_tree(*self._caller(request), path, int(raw))
        return JSONResponse({"entries": [additions.encode_entry(e) for e in found]})

    async def make_dir(self, request: Request) -> Response:
        path = additions.text_of(additions.body_of(await json_body(request)), "path")
        made = await self.sandboxes.make_dir(*self._caller(request), str(path))
        return JSONResponse(additions.encode_entry(made), status_code=201)

    async def move(self, request: Request) -> Response:
        body = additions.body_of(await json_body(request))
        source = str(additions.text_of(body, "source"))
        destination = str(additions.text_of(body, "destination"))
        moved = await self.sandboxes.move(*self._caller(request), source, destination)
        return JSONResponse(additions.encode_entry(moved))

    async def remove(self, request: Request) -> Response:
        await self.sandboxes.remove(*self._caller(request), self._path(request))
        return Response(status_code=204)

    async def watch(self, request: Request) -> Response:
        recursive = request.query_params.get("recursive") == "true"
        changes = await self.sandboxes.watch(*self._caller(request), self._path(request), recursive)

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for change in changes:
                    yield _line(additions.encode_change(change))
            except SandbankError as e:
                yield additions.error_line(e.status, e.code, e.message)
            finally:
                await changes.aclose()  # type: ignore[attr-defined]

        return StreamingResponse(lines(), media_type=NDJSON)

    async def create_watcher(self, request: Request) -> Response:
        body = additions.body_of(await json_body(request))
        path = str(additions.text_of(body, "path"))
        made = await self.sandboxes.create_watcher(
            *self._caller(request), path, bool(body.get("recursive"))
        )
        return JSONResponse({"watcher_id": made}, status_code=201)

    async def watcher_changes(self, request: Request) -> Response:
        watcher = request.path_params["watcher_id"]
        found = await self.sandboxes.watcher_changes(*self._caller(request), watcher)
        return JSONResponse({"changes": [additions.encode_change(c) for c in found]})

    async def remove_watcher(self, request: Request) -> Response:
        watcher = request.path_params["watcher_id"]
        await self.sandboxes.remove_watcher(*self._caller(request), watcher)
        return Response(status_code=204)


def _pid(request: Request) -> int:
    raw = request.path_params["pid"]
    if not raw.isdigit() or len(raw) > 10:
        raise Unprocessable("pid must be a process id (a whole number)")
    return int(raw)


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


async def _stream(events: AsyncIterator[ProcessEvent]) -> Response:
    """A process's events as lines; the first awaited first, so a failure to start is an
    error answer, not a stream."""
    try:
        first = await anext(events)
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield additions.encode_event(first)
            async for event in events:
                yield additions.encode_event(event)
        except SandbankError as e:
            yield additions.error_line(e.status, e.code, e.message)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(lines(), media_type=NDJSON)
