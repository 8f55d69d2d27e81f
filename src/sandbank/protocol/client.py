"""A client of the code-execution protocol, over any transport: one per server it calls.

Used by `sandbank exec`, by the remote sandboxes (`SANDBANK_SANDBOX_URL`) over httpx, and by a
fleet front over its lean keep-alive client to each node. Answers are translated into the error
tree: 404 `SessionNotFound`, 503 `AtCapacity`, 413 `PayloadTooLarge`, anything else unexpected
`SandboxError`; a reply outside the protocol is a `ProtocolError`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import httpx

from ..egress.credentials import Credential, CredentialInfo
from ..errors import (
    AtCapacity,
    PayloadTooLarge,
    SandbankError,
    SandboxError,
    SessionNotFound,
    error_classes,
)
from ..protocol.calls import Display, Done, Event, ExecResult, Output, ToolCall
from . import additions, codec
from .filesystem import FsChange, FsEntry
from .http1 import Reply, TransportFailed
from .processes import ContextInfo, ProcessEvent, ProcessInfo, ProcessSpec, Signal
from .sessions import Download, FileEntry, FormPart, SessionInfo, SessionSpec

Body = bytes | AsyncIterator[bytes] | None
JSON = "application/json"
# The errors a Sandbank server names by code, that a client raises as they are (not the
# config's, the agent's or the internal root, which say nothing of the operation asked for).
KNOWN: dict[str, type[SandbankError]] = {
    cls.code: cls
    for cls in error_classes()
    if 400 <= cls.status < 500 and cls.__init__ is SandbankError.__init__
}


class Transport(Protocol):
    """One server's HTTP: `TransportFailed` when no answer could be had."""

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: Body = None,
        stream: bool = False,
    ) -> Reply: ...


class HttpxTransport:
    """A transport over httpx (https, proxies, any server): for remote backends and the CLI."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        connect_timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
        )

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: Body = None,
        stream: bool = False,
    ) -> Reply:
        # A kept-alive connection the server closed just as it was reused ends without a reply:
        # a request without a body that is safe to repeat is sent once more on a fresh one.
        tries = 2 if body is None and method in ("GET", "HEAD", "DELETE") else 1
        for attempt in range(tries):
            try:
                request = self.client.build_request(method, target, headers=headers, content=body)
                response = await self.client.send(request, stream=True)
                break
            except httpx.RemoteProtocolError as e:
                if attempt + 1 < tries:
                    continue
                raise TransportFailed(e.__class__.__name__) from e
            except httpx.HTTPError as e:
                raise TransportFailed(e.__class__.__name__) from e
        replied = {k.lower(): v for k, v in response.headers.items()}
        if stream:
            return Reply(response.status_code, replied, stream=_chunks(response))
        try:
            content = await response.aread()
        except httpx.HTTPError as e:
            raise TransportFailed(e.__class__.__name__) from e
        finally:
            await response.aclose()
        return Reply(response.status_code, replied, body=content)

    async def close(self) -> None:
        await self.client.aclose()


async def _chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_bytes():
            yield chunk
    except httpx.HTTPError as e:
        raise TransportFailed(e.__class__.__name__) from e
    finally:
        await response.aclose()


class ExecClient:
    """The protocol's operations on one server; `authorization` is sent with each request."""

    def __init__(self, transport: Transport, authorization: str | None = None) -> None:
        self.transport = transport
        self.headers = {"authorization": authorization} if authorization else {}

    async def _send(
        self,
        method: str,
        target: str,
        body: Body = None,
        content_type: str | None = None,
        stream: bool = False,
        accept: str | None = None,
    ) -> Reply:
        headers = dict(self.headers)
        if content_type is not None:
            headers["content-type"] = content_type
        if accept is not None:
            headers["accept"] = accept
        reply = await self.transport.request(method, target, headers, body, stream)
        if reply.status >= 400:
            if reply.stream is not None:
                reply.body = b"".join([chunk async for chunk in reply.stream])
            raise error_of(reply)
        return reply

    async def create(self, spec: SessionSpec | None = None) -> SessionInfo:
        body = json.dumps(codec.encode_create(spec or SessionSpec())).encode()
        reply = await self._send("POST", "/sessions", body, JSON)
        return codec.decode_handle(_json(reply, "CreateSession"))

    async def execute(self, session_id: str, call: ToolCall, timeout_s: float | None) -> ExecResult:
        started = time.monotonic()
        body = json.dumps(codec.encode_call(call, timeout_s)).encode()
        reply = await self._send("POST", f"/sessions/{quote(session_id)}/exec", body, JSON)
        elapsed = round((time.monotonic() - started) * 1000)
        return codec.decode_result(_json(reply, "Execute"), elapsed)

    async def stream(
        self, session_id: str, call: ToolCall, timeout_s: float, interrupt: bool = False
    ) -> AsyncIterator[Event]:
        """A streamed Execute (Server-Sent Events): output and displays, then `Done`."""
        body = json.dumps(codec.encode_call(call, timeout_s)).encode()
        target = f"/sessions/{quote(session_id)}/exec"
        if interrupt:
            target += "?on_disconnect=interrupt"
        reply = await self._send(
            "POST", target, body, JSON, stream=True, accept="text/event-stream"
        )
        assert reply.stream is not None
        async for kind, data in _events(reply.stream):
            with codec.malformed("streamed Execute"):
                if kind in ("stdout", "stderr"):
                    yield Output(kind, codec.text(data["text"]))  # type: ignore[arg-type]
                elif kind == "display":
                    yield Display(codec.decode_bundle(data))
                elif kind == "result":
                    yield Done(codec.decode_result(data))
                    return

    async def destroy(self, session_id: str) -> None:
        with contextlib.suppress(SessionNotFound):  # already gone: the desired state
            await self._send("DELETE", f"/sessions/{quote(session_id)}")

    async def list_files(self, session_id: str, path: str = ".") -> tuple[list[FileEntry], bool]:
        target = f"/sessions/{quote(session_id)}/files/list?{urlencode({'path': path})}"
        return codec.decode_listing(_json(await self._send("GET", target), "ListFiles"))

    async def read_file(self, session_id: str, path: str) -> Download:
        target = f"/sessions/{quote(session_id)}/files?{urlencode({'path': path})}"
        reply = await self._send("GET", target, stream=True)
        assert reply.stream is not None
        size = reply.headers.get("content-length", "")
        name = path.rstrip("/").rsplit("/", 1)[-1]
        return Download(name, int(size) if size.isdigit() else -1, reply.stream)

    async def upload(self, session_id: str, form: AsyncIterator[FormPart]) -> FileEntry:
        boundary = "sandbank-" + secrets.token_hex(16)
        reply = await self._send(
            "POST",
            f"/sessions/{quote(session_id)}/files",
            _multipart(form, boundary),
            f"multipart/form-data; boundary={boundary}",
        )
        return codec.decode_file(_json(reply, "PutFile"))

    async def write_file(
        self, session_id: str, path: str, chunks: AsyncIterator[bytes]
    ) -> FileEntry:
        return await self.upload(session_id, _form(path, chunks))

    # --- additions (a Sandbank server's): sessions, contexts, processes, the tree -------------
    def _on(self, session_id: str, rest: str = "") -> str:
        return f"/sessions/{quote(session_id, safe='')}{rest}"

    async def _json(
        self, method: str, target: str, body: Any = None, operation: str = "addition"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        reply = await self._send(method, target, data, JSON if data is not None else None)
        return _json(reply, operation) if reply.body else None

    async def list_sessions(self) -> list[SessionInfo]:
        found = await self._json("GET", "/sessions", operation="ListSessions")
        with codec.malformed("ListSessions"):
            return [codec.decode_handle(h) for h in found["sessions"]]

    async def get(self, session_id: str) -> SessionInfo:
        return codec.decode_handle(await self._json("GET", self._on(session_id)))

    async def pause(self, session_id: str) -> SessionInfo:
        return codec.decode_handle(await self._json("POST", self._on(session_id, "/pause")))

    async def resume(self, session_id: str) -> SessionInfo:
        return codec.decode_handle(await self._json("POST", self._on(session_id, "/resume")))

    async def set_lifetime(self, session_id: str, seconds: int) -> SessionInfo:
        body = {"seconds": seconds}
        return codec.decode_handle(
            await self._json("POST", self._on(session_id, "/lifetime"), body)
        )

    async def list_credentials(self, session_id: str) -> list[CredentialInfo]:
        found = await self._json("GET", self._on(session_id, "/credentials"))
        return codec.decode_credentials(found)

    async def remove_credential(self, session_id: str, credential_id: str) -> None:
        target = self._on(session_id, f"/credentials/{quote(credential_id, safe='')}")
        await self._json("DELETE", target)

    async def replace_credentials(
        self, session_id: str, credentials: Sequence[Credential]
    ) -> list[CredentialInfo]:
        body = {"credentials": [c.to_request() for c in credentials]}
        found = await self._json("PUT", self._on(session_id, "/credentials"), body)
        return codec.decode_credentials(found)

    async def store_credential(self, credential: Credential) -> CredentialInfo:
        body = credential.to_request()
        del body["id"]  # the storing server names it
        return CredentialInfo.from_json(await self._json("POST", "/credentials", body))

    async def list_stored_credentials(self) -> list[CredentialInfo]:
        return codec.decode_credentials(await self._json("GET", "/credentials"))

    async def delete_stored_credential(self, credential_id: str) -> None:
        await self._json("DELETE", f"/credentials/{quote(credential_id, safe='')}")

    async def create_context(self, session_id: str, cwd: str | None) -> ContextInfo:
        body = {} if cwd is None else {"cwd": cwd}
        found = await self._json("POST", self._on(session_id, "/contexts"), body)
        return additions.decode_context(found)

    async def list_contexts(self, session_id: str) -> list[ContextInfo]:
        found = await self._json("GET", self._on(session_id, "/contexts"))
        with codec.malformed("contexts"):
            return [additions.decode_context(c) for c in found["contexts"]]

    async def restart_context(self, session_id: str, context_id: str) -> None:
        await self._send(
            "POST", self._on(session_id, f"/contexts/{quote(context_id, safe='')}/restart")
        )

    async def remove_context(self, session_id: str, context_id: str) -> None:
        await self._send("DELETE", self._on(session_id, f"/contexts/{quote(context_id, safe='')}"))

    async def start_process(
        self, session_id: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        body = json.dumps(additions.encode_spec(spec)).encode()
        reply = await self._send(
            "POST", self._on(session_id, "/processes"), body, JSON, stream=True
        )
        return _process_events(reply)

    async def connect_process(self, session_id: str, pid: int) -> AsyncIterator[ProcessEvent]:
        reply = await self._send(
            "GET", self._on(session_id, f"/processes/{pid}/events"), stream=True
        )
        return _process_events(reply)

    async def list_processes(self, session_id: str) -> list[ProcessInfo]:
        found = await self._json("GET", self._on(session_id, "/processes"))
        with codec.malformed("processes"):
            return [additions.decode_info(p) for p in found["processes"]]

    async def send_stdin(self, session_id: str, pid: int, data: bytes) -> None:
        target = self._on(session_id, f"/processes/{pid}/stdin")
        await self._send("POST", target, data, "application/octet-stream")

    async def close_stdin(self, session_id: str, pid: int) -> None:
        await self._send("POST", self._on(session_id, f"/processes/{pid}/stdin/close"))

    async def signal_process(self, session_id: str, pid: int, sig: Signal) -> None:
        await self._json("POST", self._on(session_id, f"/processes/{pid}/signal"), {"signal": sig})

    async def stat(self, session_id: str, path: str) -> FsEntry:
        target = self._on(session_id, f"/tree/stat?{urlencode({'path': path})}")
        return additions.decode_entry(await self._json("GET", target))

    async def list_tree(self, session_id: str, path: str, depth: int) -> list[FsEntry]:
        target = self._on(session_id, f"/tree?{urlencode({'path': path, 'depth': depth})}")
        found = await self._json("GET", target)
        with codec.malformed("tree"):
            return [additions.decode_entry(e) for e in found["entries"]]

    async def make_dir(self, session_id: str, path: str) -> FsEntry:
        made = await self._json("POST", self._on(session_id, "/tree/dirs"), {"path": path})
        return additions.decode_entry(made)

    async def move(self, session_id: str, source: str, destination: str) -> FsEntry:
        body = {"source": source, "destination": destination}
        return additions.decode_entry(
            await self._json("POST", self._on(session_id, "/tree/move"), body)
        )

    async def remove(self, session_id: str, path: str) -> None:
        await self._send("DELETE", self._on(session_id, f"/tree?{urlencode({'path': path})}"))

    async def watch(self, session_id: str, path: str, recursive: bool) -> AsyncIterator[FsChange]:
        query = urlencode({"path": path, "recursive": "true" if recursive else "false"})
        reply = await self._send("GET", self._on(session_id, f"/watch?{query}"), stream=True)
        return _changes(reply)

    async def create_watcher(self, session_id: str, path: str, recursive: bool) -> str:
        body = {"path": path, "recursive": recursive}
        made = await self._json("POST", self._on(session_id, "/watchers"), body)
        with codec.malformed("watchers"):
            return str(made["watcher_id"])

    async def watcher_changes(self, session_id: str, watcher_id: str) -> list[FsChange]:
        target = self._on(session_id, f"/watchers/{quote(watcher_id, safe='')}/changes")
        found = await self._json("GET", target)
        with codec.malformed("watchers"):
            return [additions.decode_change(c) for c in found["changes"]]

    async def remove_watcher(self, session_id: str, watcher_id: str) -> None:
        await self._send("DELETE", self._on(session_id, f"/watchers/{quote(watcher_id, safe='')}"))


async def _lines(reply: Reply) -> AsyncIterator[Any]:
    """A newline-delimited JSON answer's objects; its `error` line raised as our error."""
    assert reply.stream is not None
    buffer = b""
    try:
        async for chunk in reply.stream:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not line.strip():
                    continue
                with codec.malformed("stream"):
                    item = json.loads(line)
                    failed = item.get("error")
                if isinstance(failed, dict):
                    raise error_of(
                        Reply(
                            int(failed.get("status") or 500), {}, body=json.dumps(failed).encode()
                        )
                    )
                yield item
    finally:
        closer = getattr(reply.stream, "aclose", None)
        if closer is not None:
            await closer()


async def _process_events(reply: Reply) -> AsyncIterator[ProcessEvent]:
    async for line in _lines(reply):
        yield additions.decode_event(line)


async def _changes(reply: Reply) -> AsyncIterator[FsChange]:
    async for line in _lines(reply):
        yield additions.decode_change(line)


async def _form(path: str, chunks: AsyncIterator[bytes]) -> AsyncIterator[FormPart]:
    yield "path", None, _once(path.encode())
    yield "file", path.rsplit("/", 1)[-1], chunks


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _multipart(form: AsyncIterator[FormPart], boundary: str) -> AsyncIterator[bytes]:
    async for name, filename, chunks in form:
        disposition = f'form-data; name="{_quoted(name)}"'
        if filename is not None:
            disposition += f'; filename="{_quoted(filename)}"'
        head = f"--{boundary}\r\ncontent-disposition: {disposition}\r\n"
        if filename is not None:
            head += "content-type: application/octet-stream\r\n"
        yield (head + "\r\n").encode()
        async for chunk in chunks:
            yield chunk
        yield b"\r\n"
    yield f"--{boundary}--\r\n".encode()


def _quoted(value: str) -> str:
    """A name in a Content-Disposition parameter: quotes and line breaks cannot break out."""
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


async def _events(stream: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, Any]]:
    """Server-Sent Events as (event, JSON data)."""
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            kind, data = "message", []
            for line in block.decode("utf-8", "replace").split("\n"):
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
            if data:
                with codec.malformed("streamed Execute"):
                    yield kind, json.loads("\n".join(data))


def _json(reply: Reply, operation: str) -> Any:
    with codec.malformed(operation):
        return reply.json()


def error_of(reply: Reply) -> Exception:
    """A protocol error answer as an error of our tree (by its `code`, a Sandbank server's
    addition, or by its status)."""
    code = None
    try:
        body = json.loads(reply.body)
        detail = str(body.get("detail") or reply.body[:500].decode())
        code = body.get("code")
    except (ValueError, AttributeError):
        detail = reply.body[:500].decode("utf-8", "replace")
    kind = KNOWN.get(code) if isinstance(code, str) else None
    if kind is not None and kind.status == reply.status and kind is not AtCapacity:
        return kind(detail)
    if reply.status == 404:
        return SessionNotFound(detail)
    if reply.status == 503:
        retry = reply.headers.get("retry-after", "5")
        return AtCapacity(detail, retry_after=int(retry) if retry.isdigit() else 5)
    if reply.status == 413:
        return PayloadTooLarge(detail)
    return SandboxError(f"the sandbox backend answered {reply.status}: {detail}")
