"""Moving files in and out of a session's workspace for clients: listings, downloads, uploads.

Every open file is registered with its session, which closes it when destroyed: a client that
stops reading can never keep a destroyed session's disk busy. No write blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import unicodedata
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..errors import BadRequest, PayloadTooLarge, Unprocessable
from .sessions import ExecSession
from .workspace import Entry, OpenFile, TransferAborted, Workspace, translate_oserror

CHUNK = 256 * 1024
MAX_FIELD = 4096
_UNSAFE = re.compile(r"[^\w.\- ()+,=@]", re.UNICODE)


def sanitize_name(raw: str) -> str:
    """A plain file name from an uploaded name: no directories, controls or leading dots."""
    name = unicodedata.normalize("NFC", raw.replace("\\", "/").rsplit("/", 1)[-1])
    name = _UNSAFE.sub("_", name).strip(" .")
    return name[:200] or "upload"


@dataclass
class Download:
    """A file being sent: its name, the size announced, and its bytes (at most that size)."""

    name: str
    size: int
    chunks: AsyncIterator[bytes]


def workspace_of(session: ExecSession, as_owner: bool = False) -> Workspace:
    sandbox = session.sandbox
    return Workspace(sandbox.workspace, sandbox.uid if as_owner else None)


async def list_files(session: ExecSession, path: str, limit: int) -> tuple[list[Entry], bool]:
    return await asyncio.to_thread(workspace_of(session).list, path, limit)


async def open_download(session: ExecSession, path: str) -> Download:
    fd, st = await asyncio.to_thread(workspace_of(session).open_file, path)
    handle = OpenFile(fd)
    session.open_files.add(handle)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return Download(name, st.st_size, _read(session, handle, st.st_size))


async def _read(session: ExecSession, handle: OpenFile, size: int) -> AsyncIterator[bytes]:
    """At most `size` bytes: a file that grows while it is sent is cut at its announced size."""
    try:
        left = size
        while left > 0:
            chunk = await asyncio.to_thread(handle.read, min(CHUNK, left))
            if not chunk:
                return  # it shrank: the (chunked) response ends early, its framing intact
            left -= len(chunk)
            yield chunk
    except TransferAborted:
        return  # the session was destroyed: what was sent is all there is
    finally:
        session.open_files.discard(handle)
        handle.close()


FormParts = AsyncIterator[tuple[str, str | None, AsyncIterator[bytes]]]


async def put_file(session: ExecSession, parts: FormParts, cap: int) -> tuple[str, int]:
    """Write the form's `file` part into the workspace at its `path` field (or its own name).

    The bytes land under a hidden name first and are moved in place once whole: a refused or
    broken upload leaves nothing behind.
    """
    ws = workspace_of(session, as_owner=True)
    fields: dict[str, str] = {}
    staged: str | None = None
    filename: str | None = None
    size = 0
    try:
        async for name, part_filename, chunks in parts:
            if name != "file":
                fields[name] = await _field(name, chunks)
                continue
            if staged is not None:
                raise BadRequest("only one file part is accepted")
            filename = part_filename
            staged, fd = await asyncio.to_thread(ws.stage)
            size = await _write(session, OpenFile(fd), chunks, cap)
        if staged is None:
            raise Unprocessable("the form has no `file` part")
        path = fields.get("path") or sanitize_name(filename or "")
        final = await asyncio.to_thread(ws.commit, staged, path)
        staged = None
        return final, size
    finally:
        if staged is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ws.discard, staged)


async def _field(name: str, chunks: AsyncIterator[bytes]) -> str:
    value = bytearray()
    async for chunk in chunks:
        value += chunk
        if len(value) > MAX_FIELD:
            raise BadRequest(f"form field {name!r} is too long")
    return value.decode("utf-8", "replace")


async def _write(
    session: ExecSession, handle: OpenFile, chunks: AsyncIterator[bytes], cap: int
) -> int:
    session.open_files.add(handle)
    size = 0
    try:
        async for chunk in chunks:
            size += len(chunk)
            if size > cap:
                raise PayloadTooLarge(f"the file is larger than the cap of {cap} bytes")
            await asyncio.to_thread(_write_chunk, handle, chunk)
    finally:
        session.open_files.discard(handle)
        handle.close()
    return size


def _write_chunk(handle: OpenFile, chunk: bytes) -> None:
    try:
        handle.write(chunk)
    except TransferAborted:
        raise BadRequest("the session was destroyed during the upload") from None
    except OSError as e:
        raise translate_oserror(e, "the uploaded file") from None
