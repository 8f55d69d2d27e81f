"""Moving files in and out of a local session's workspace: listings, downloads, uploads, writes.

Every open file is registered with its session, which closes it when destroyed: a client that
stops reading can never keep a destroyed session's disk busy. No write blocks the event loop;
every write lands under a hidden name first and is moved in place once whole, so a refused or
broken upload leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import unicodedata
from collections.abc import AsyncIterator

from ..errors import BadRequest, PayloadTooLarge, Unprocessable
from ..protocol.sessions import Download, FileEntry, FormPart
from ..streams import gather
from .host.workspace import OpenFile, TransferAborted, Workspace, translate_oserror
from .sessions import ExecSession

CHUNK = 256 * 1024
MAX_FIELD = 4096
_UNSAFE = re.compile(r"[^\w.\- ()+,=@]", re.UNICODE)
# The workspace root of an interpreter session belongs to root with the sandbox's group allowed
# to write and the sticky bit set: the sandbox creates files there but cannot rename or delete
# root's read-only uploads.
SHARED_ROOT_MODE = 0o1770
READ_ONLY_MODE = 0o444


def sanitize_name(raw: str) -> str:
    """A plain file name from an uploaded name: no directories, controls or leading dots."""
    name = unicodedata.normalize("NFC", raw.replace("\\", "/").rsplit("/", 1)[-1])
    name = _UNSAFE.sub("_", name).strip(" .")
    return name[:200] or "upload"


def workspace_of(session: ExecSession, as_owner: bool = False) -> Workspace:
    """The session's workspace; `as_owner`: what is written belongs to the sandbox's uid."""
    sandbox = session.sandbox
    return Workspace(sandbox.workspace, sandbox.uid if as_owner else None)


async def list_files(session: ExecSession, path: str, limit: int) -> tuple[list[FileEntry], bool]:
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


async def upload(session: ExecSession, form: AsyncIterator[FormPart], cap: int) -> FileEntry:
    """Write the form's `file` part into the workspace at its `path` field (or its own name)."""
    ws = workspace_of(session, as_owner=True)
    fields: dict[str, str] = {}
    staged: str | None = None
    filename: str | None = None
    size = 0
    try:
        async for name, part_filename, chunks in form:
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
        return FileEntry(final, size, 0.0)
    finally:
        if staged is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ws.discard, staged)


async def write_file(
    session: ExecSession, path: str, chunks: AsyncIterator[bytes], read_only: bool
) -> FileEntry:
    """Place a file at `path`. `read_only`: owned by the server and mode 0444, so the session's
    code may read it but not change, replace or delete it (with the root's sticky bit)."""
    ws = workspace_of(session, as_owner=not read_only)
    staged, fd = await asyncio.to_thread(ws.stage)
    try:
        # The session's own files always fit: caps only guard against sandboxed code.
        size = await _write(session, OpenFile(fd), chunks, cap=None)
        final = await asyncio.to_thread(ws.commit, staged, path)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(ws.discard, staged)
        raise
    if read_only:
        await asyncio.to_thread(_make_read_only, ws, final)
    return FileEntry(final, size, 0.0)


def _make_read_only(ws: Workspace, path: str) -> None:
    fd, _ = ws.open_file(path)
    try:
        os.fchmod(fd, READ_ONLY_MODE)
    finally:
        os.close(fd)


async def _field(name: str, chunks: AsyncIterator[bytes]) -> str:
    def refused() -> BadRequest:
        return BadRequest(f"form field {name!r} is too long")

    return (await gather(chunks, MAX_FIELD, refused)).decode("utf-8", "replace")


async def _write(
    session: ExecSession, handle: OpenFile, chunks: AsyncIterator[bytes], cap: int | None
) -> int:
    session.open_files.add(handle)
    size = 0
    try:
        async for chunk in chunks:
            size += len(chunk)
            if cap is not None and size > cap:
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
