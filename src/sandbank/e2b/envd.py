"""envd, the in-sandbox daemon of E2B (its port 49983): processes and files over Connect, and
its plain HTTP `/files` and `/health`, each a call on the sandbox port."""

from __future__ import annotations

import contextlib
import posixpath
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import BadRequest, IsADirectory, NotFound, PayloadTooLarge, SandbankError
from ..http.multipart import FormStream, is_multipart
from ..protocol.filesystem import FsChange
from ..protocol.processes import ProcessSpec, Signal
from ..sandbox.port import Sandboxes
from . import connect
from . import messages as m
from .connect import Call, ConnectError, Message

GUNZIP_CHUNK = 1024 * 1024
SIZED_UP_TO = 8 * 1024 * 1024  # a download of unknown size is read this far to size it


@dataclass(frozen=True)
class Target:
    """The sandbox a request is for: its public id, its tenant, its session."""

    public: str
    tenant: str
    session: str


Handler = Callable[[Target, Any, Call], Any]


class Envd:
    """envd's services for one request's sandbox, over the port."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes
        self.methods: dict[str, tuple[str, Handler]] = {
            "/process.Process/Start": ("server", self.start),
            "/process.Process/Connect": ("server", self.connect),
            "/process.Process/List": ("unary", self.list_processes),
            "/process.Process/SendInput": ("unary", self.send_input),
            "/process.Process/StreamInput": ("client", self.stream_input),
            "/process.Process/SendSignal": ("unary", self.send_signal),
            "/process.Process/CloseStdin": ("unary", self.close_stdin),
            "/process.Process/Update": ("unary", self.update),
            "/filesystem.Filesystem/Stat": ("unary", self.stat),
            "/filesystem.Filesystem/MakeDir": ("unary", self.make_dir),
            "/filesystem.Filesystem/Move": ("unary", self.move),
            "/filesystem.Filesystem/ListDir": ("unary", self.list_dir),
            "/filesystem.Filesystem/Remove": ("unary", self.remove),
            "/filesystem.Filesystem/WatchDir": ("server", self.watch_dir),
            "/filesystem.Filesystem/CreateWatcher": ("unary", self.create_watcher),
            "/filesystem.Filesystem/GetWatcherEvents": ("unary", self.watcher_events),
            "/filesystem.Filesystem/RemoveWatcher": ("unary", self.remove_watcher),
        }

    async def rpc(self, t: Target, request: Request) -> Response:
        found = self.methods.get(request.url.path)
        if found is None or request.method != "POST":
            return connect.error_response(
                ConnectError("unimplemented", f"{request.url.path} is not served here")
            )
        kind, handler = found
        if kind == "unary":
            return await connect.unary(request, lambda msg, call: handler(t, msg, call))
        if kind == "server":
            return await connect.server_stream(request, lambda msg, call: handler(t, msg, call))
        return await connect.client_stream(request, lambda msgs, call: handler(t, msgs, call))

    # --- process.Process ---------------------------------------------------------------------
    async def start(self, t: Target, msg: Message, call: Call) -> AsyncIterator[Message]:
        if m.field(msg, "pty") is not None:
            raise ConnectError("unimplemented", "pseudo-terminals (PTY) are not supported")
        process = m.obj(msg, "process")
        cmd = m.text(process, "cmd")
        args = m.field(process, "args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConnectError("invalid_argument", "args must be a list of strings")
        cwd = m.sandbox_cwd(m.text(process, "cwd") or None)
        envs = {"HOME": m.HOME, "USER": "user", "PWD": cwd, **m.strings(process, "envs")}
        # Absent (SDKs before stdin control): open, as envd keeps it.
        stdin = m.flag(msg, "stdin") if m.field(msg, "stdin") is not None else True
        spec = ProcessSpec(
            cmd, tuple(args), envs, cwd, stdin, m.text(msg, "tag") or None, call.timeout
        )
        events = self.sandboxes.start_process(t.session, t.tenant, spec)
        async for message in connect.with_keepalive(
            _events(events), call.keepalive, {"event": {"keepalive": {}}}
        ):
            yield message

    async def connect(self, t: Target, msg: Message, call: Call) -> AsyncIterator[Message]:
        pid = await self._pid(t, m.obj(msg, "process"))
        events = self.sandboxes.connect_process(t.session, t.tenant, pid)
        async for message in connect.with_keepalive(
            _events(events), call.keepalive, {"event": {"keepalive": {}}}
        ):
            yield message

    async def _pid(self, t: Target, selector: Message) -> int:
        chosen = m.pid_of(selector)
        if isinstance(chosen, int):
            return chosen
        for info in await self.sandboxes.list_processes(t.session, t.tenant):
            if info.spec.tag == chosen:
                return info.pid
        raise NotFound(f"process with tag {chosen!r} not found")

    async def list_processes(self, t: Target, msg: Message, call: Call) -> Message:
        found = await self.sandboxes.list_processes(t.session, t.tenant)
        return {"processes": [m.process_info(info) for info in found]}

    async def _stdin(self, t: Target, process: Message, given: Message) -> None:
        if "pty" in given:
            raise ConnectError("unimplemented", "pseudo-terminals (PTY) are not supported")
        pid = await self._pid(t, process)
        await self.sandboxes.send_stdin(t.session, t.tenant, pid, m.data(given, "stdin"))

    async def send_input(self, t: Target, msg: Message, call: Call) -> Message:
        await self._stdin(t, m.obj(msg, "process"), m.obj(msg, "input"))
        return {}

    async def stream_input(self, t: Target, msgs: list[Message], call: Call) -> Message:
        process: Message | None = None
        for msg in msgs:
            if "start" in msg:
                process = m.obj(m.obj(msg, "start"), "process")
            elif "data" in msg:
                if process is None:
                    raise ConnectError("invalid_argument", "a stream of input starts with start")
                await self._stdin(t, process, m.obj(m.obj(msg, "data"), "input"))
        return {}

    async def send_signal(self, t: Target, msg: Message, call: Call) -> Message:
        pid = await self._pid(t, m.obj(msg, "process"))
        sig: Signal = m.signal_of(msg)  # type: ignore[assignment]
        await self.sandboxes.signal_process(t.session, t.tenant, pid, sig)
        return {}

    async def close_stdin(self, t: Target, msg: Message, call: Call) -> Message:
        pid = await self._pid(t, m.obj(msg, "process"))
        await self.sandboxes.close_stdin(t.session, t.tenant, pid)
        return {}

    async def update(self, t: Target, msg: Message, call: Call) -> Message:
        raise ConnectError("unimplemented", "pseudo-terminals (PTY) are not supported")

    # --- filesystem.Filesystem ---------------------------------------------------------------
    async def stat(self, t: Target, msg: Message, call: Call) -> Message:
        path = m.workspace_path(m.text(msg, "path"))
        return {"entry": m.entry(await self.sandboxes.stat(t.session, t.tenant, path))}

    async def make_dir(self, t: Target, msg: Message, call: Call) -> Message:
        path = m.workspace_path(m.text(msg, "path"))
        if path == ".":
            raise ConnectError("already_exists", f"directory already exists: {m.HOME}")
        return {"entry": m.entry(await self.sandboxes.make_dir(t.session, t.tenant, path))}

    async def move(self, t: Target, msg: Message, call: Call) -> Message:
        source = m.workspace_path(m.text(msg, "source"))
        destination = m.workspace_path(m.text(msg, "destination"))
        moved = await self.sandboxes.move(t.session, t.tenant, source, destination)
        return {"entry": m.entry(moved)}

    async def list_dir(self, t: Target, msg: Message, call: Call) -> Message:
        path = m.workspace_path(m.text(msg, "path"))
        depth = max(1, m.integer(msg, "depth"))
        top = await self.sandboxes.stat(t.session, t.tenant, path)
        if top.kind != "dir":
            raise ConnectError(
                "invalid_argument", f"path is not a directory: {m.text(msg, 'path')}"
            )
        found = await self.sandboxes.list_tree(t.session, t.tenant, path, depth)
        return {"entries": [m.entry(e) for e in found]}

    async def remove(self, t: Target, msg: Message, call: Call) -> Message:
        path = m.workspace_path(m.text(msg, "path"))
        if path == ".":
            raise ConnectError("permission_denied", f"{m.HOME} itself cannot be removed")
        await self.sandboxes.remove(t.session, t.tenant, path)
        return {}

    async def _changed(self, t: Target, base: str, c: FsChange, entry: bool) -> Message:
        event = m.change(c)
        if entry:
            rel = posixpath.normpath(posixpath.join(base, c.path))
            with contextlib.suppress(SandbankError):  # gone already (a removal): no entry
                event["entry"] = m.entry(await self.sandboxes.stat(t.session, t.tenant, rel))
        return event

    async def watch_dir(self, t: Target, msg: Message, call: Call) -> AsyncIterator[Message]:
        path = m.workspace_path(m.text(msg, "path"))
        recursive = m.flag(msg, "recursive")
        with_entry = m.flag(msg, "includeEntry", "include_entry")
        changes = await self.sandboxes.watch(t.session, t.tenant, path, recursive)
        yield {"start": {}}

        async def events() -> AsyncIterator[Message]:
            async for c in changes:
                yield {"filesystem": await self._changed(t, path, c, with_entry)}

        async for message in connect.with_keepalive(events(), call.keepalive, {"keepalive": {}}):
            yield message

    async def create_watcher(self, t: Target, msg: Message, call: Call) -> Message:
        path = m.workspace_path(m.text(msg, "path"))
        recursive = m.flag(msg, "recursive")
        with_entry = m.flag(msg, "includeEntry", "include_entry")
        wid = await self.sandboxes.create_watcher(t.session, t.tenant, path, recursive)
        # What the door needs again on each poll travels in the id: any front may serve it.
        return {"watcherId": f"{int(with_entry)}{path}\0{wid}".encode().hex()}

    def _watcher(self, msg: Message) -> tuple[bool, str, str]:
        raw = m.text(msg, "watcherId", "watcher_id")
        try:
            decoded = bytes.fromhex(raw).decode()
        except ValueError:
            raise NotFound(f"watcher {raw!r} not found") from None
        path, _, wid = decoded[1:].partition("\0")
        if not wid:
            raise NotFound(f"watcher {raw!r} not found")
        return decoded[0] == "1", path, wid

    async def watcher_events(self, t: Target, msg: Message, call: Call) -> Message:
        with_entry, path, wid = self._watcher(msg)
        changes = await self.sandboxes.watcher_changes(t.session, t.tenant, wid)
        return {"events": [await self._changed(t, path, c, with_entry) for c in changes]}

    async def remove_watcher(self, t: Target, msg: Message, call: Call) -> Message:
        _, _, wid = self._watcher(msg)
        await self.sandboxes.remove_watcher(t.session, t.tenant, wid)
        return {}

    # --- plain HTTP: /files, /health -----------------------------------------------------------
    async def download(self, t: Target, request: Request) -> Response:
        raw = request.query_params.get("path", "")
        path = m.workspace_path(raw)
        try:
            download = await self.sandboxes.read_file(t.session, t.tenant, path)
        except NotFound:
            return envd_error(404, f"path '{raw}' does not exist")
        except IsADirectory:
            return envd_error(400, f"path '{raw}' is a directory")
        name = download.name.replace('"', "").replace("\r", "").replace("\n", "")
        headers = {
            "Content-Disposition": f'inline; filename="{name}"',
            "X-Content-Type-Options": "nosniff",
        }
        chunks = download.chunks
        if download.size >= 0:
            headers["Content-Length"] = str(download.size)
        else:  # its size is unknown (a fleet node's stream): small files are sized, as JS wants
            head = bytearray()
            async for chunk in chunks:
                head += chunk
                if len(head) > SIZED_UP_TO:
                    break
            else:
                headers["Content-Length"] = str(len(head))
            chunks = _then(bytes(head), chunks)
        return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)

    async def upload(self, t: Target, request: Request) -> Response:
        target = request.query_params.get("path")
        content_type = request.headers.get("content-type")
        written: list[Message] = []
        if is_multipart(content_type):
            seen: set[str] = set()
            async for part, chunks in FormStream(content_type, request.stream()).parts():
                if part.name != "file":
                    continue
                given = target or part.filename
                if not given:
                    raise BadRequest("a file part names no path (and the request none)")
                path = m.workspace_path(given)
                if path in seen:
                    raise BadRequest(f"two files for one path: {given}")
                seen.add(path)
                written.append(await self._write(t, path, chunks))
        elif (content_type or "").split(";")[0].strip() == "application/octet-stream":
            if not target:
                raise BadRequest("an octet-stream upload needs the path query parameter")
            body: AsyncIterator[bytes] = request.stream()
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding == "gzip":  # the SDKs' `gzip=True`
                body = _gunzipped(body)
            elif encoding != "identity":
                return envd_error(400, f"unsupported content encoding {encoding!r}")
            written.append(await self._write(t, m.workspace_path(target), body))
        else:
            return envd_error(400, "expected multipart/form-data or application/octet-stream")
        return JSONResponse(written)

    async def _write(self, t: Target, path: str, chunks: AsyncIterator[bytes]) -> Message:
        entry = await self.sandboxes.write_file(t.session, t.tenant, path, chunks)
        return {
            "name": posixpath.basename(entry.path),
            "type": "file",
            "path": m.sandbox_path(entry.path),
        }

    async def files(self, t: Target, request: Request) -> Response:
        try:
            if request.method == "GET":
                return await self.download(t, request)
            if request.method == "POST":
                return await self.upload(t, request)
        except ConnectError as e:
            return envd_error(connect.HTTP_OF.get(e.code, 400), e.message)
        except PayloadTooLarge as e:
            return envd_error(507, e.message)
        except SandbankError as e:
            return envd_error(e.status, e.message)
        return envd_error(405, "method not allowed")


def envd_error(status: int, message: str) -> Response:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def _gunzipped(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A gzip body, decompressed as it comes, at most CHUNK bytes at a time (the workspace's
    disk bounds the whole)."""
    inflate = zlib.decompressobj(wbits=31)
    try:
        async for chunk in chunks:
            data = inflate.decompress(chunk, GUNZIP_CHUNK)
            while data:
                yield data
                data = inflate.decompress(inflate.unconsumed_tail, GUNZIP_CHUNK)
        if not inflate.eof:
            raise BadRequest("the gzip body is truncated")
    except zlib.error:
        raise BadRequest("the body is not valid gzip") from None


async def _then(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if head:
        yield head
    async for chunk in rest:
        yield chunk


async def _events(events: AsyncIterator[Any]) -> AsyncIterator[Message]:
    async for event in events:
        yield {"event": m.process_event(event)}
