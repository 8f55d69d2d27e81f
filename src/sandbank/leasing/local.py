"""Sandboxes from this server's own runtime, in-process; read-only uploads enforced by ownership."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import anyio.to_thread

from sandbank.config import Settings
from sandbank.errors import NotFound, PathEscape, PayloadTooLarge, SessionNotFound
from sandbank.leasing.base import MAX_WALK_ENTRIES, FileEntry, visible
from sandbank.sandbox.base import ExecResult, ToolCall
from sandbank.sandbox.managed import restore_root
from sandbank.sandbox.sessions import Runtime
from sandbank.sandbox.workspace import Workspace

CHUNK = 256 * 1024
# The workspace root belongs to root with the sandbox's group allowed to write and the sticky
# bit set: the sandbox creates files there but cannot rename or delete root's read-only uploads.
SHARED_ROOT_MODE = 0o1770
READ_ONLY_MODE = 0o444


class LocalSandboxes:
    """Sandboxes from this server's own runtime, in-process."""

    def __init__(self, runtime: Runtime, settings: Settings) -> None:
        self.runtime = runtime
        self.settings = settings

    async def start(self) -> None:
        pass  # the runtime is started by the app itself

    async def close(self) -> None:
        pass

    def _workspace(self, sandbox_id: str, owner: str, as_sandbox: bool) -> Workspace:
        session = self.runtime.get(sandbox_id, owner)
        sandbox = session.sandbox
        return Workspace(sandbox.workspace, sandbox.uid if as_sandbox else None)

    async def create(self, owner: str) -> str:
        session = await self.runtime.create(owner)
        sandbox = session.sandbox
        # The unisolated development mode runs code as the server's own user: nothing to arrange.
        if sandbox.root_policy is not None:
            sandbox.root_policy = (0, sandbox.uid, SHARED_ROOT_MODE)
            await anyio.to_thread.run_sync(restore_root, sandbox.workspace, *sandbox.root_policy)
        return session.id

    async def exists(self, sandbox_id: str, owner: str) -> bool:
        try:
            self.runtime.get(sandbox_id, owner)
        except SessionNotFound:
            return False
        return True

    async def execute(
        self, sandbox_id: str, owner: str, call: ToolCall, timeout_s: float
    ) -> ExecResult:
        return await self.runtime.execute(sandbox_id, owner, call, timeout_s)

    async def destroy(self, sandbox_id: str, owner: str) -> None:
        await self.runtime.destroy(sandbox_id, owner)

    async def list_files(self, sandbox_id: str, owner: str) -> list[FileEntry]:
        ws = self._workspace(sandbox_id, owner, as_sandbox=False)
        return await anyio.to_thread.run_sync(lambda: list(_walk(ws)))

    async def read_file(
        self, sandbox_id: str, owner: str, path: str, dest: BinaryIO, max_bytes: int
    ) -> int:
        ws = self._workspace(sandbox_id, owner, as_sandbox=False)

        def copy() -> int:
            fd, st = ws.open_file(path)
            with os.fdopen(fd, "rb") as src:
                if st.st_size > max_bytes:
                    raise PayloadTooLarge(f"{path!r} is larger than {max_bytes} bytes")
                size = 0
                while chunk := src.read(CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise PayloadTooLarge(f"{path!r} is larger than {max_bytes} bytes")
                    dest.write(chunk)
                return size

        return await anyio.to_thread.run_sync(copy)

    async def put_file(
        self, sandbox_id: str, owner: str, path: str, source: Path, read_only: bool
    ) -> None:
        ws = self._workspace(sandbox_id, owner, as_sandbox=not read_only)

        def place() -> None:
            # The session's own files always fit: the caps only guard against sandboxed code.
            cap = max(self.settings.put_file_max_bytes, source.stat().st_size)
            with source.open("rb") as src:
                ws.write_file(path, iter(lambda: src.read(CHUNK), b""), cap)
            if read_only:
                fd, _ = ws.open_file(path)
                try:
                    os.fchmod(fd, READ_ONLY_MODE)
                finally:
                    os.close(fd)

        await anyio.to_thread.run_sync(place)


def _walk(ws: Workspace) -> Iterator[FileEntry]:
    pending = [""]
    seen = 0
    while pending:
        directory = pending.pop()
        try:
            entries, _ = ws.list(directory, MAX_WALK_ENTRIES)
        except (NotFound, PathEscape):
            continue  # changed under us, or a symlink planted by the sandbox
        for entry in entries:
            if not visible(entry.path):
                continue
            seen += 1
            if seen > MAX_WALK_ENTRIES:
                return
            if entry.is_dir:
                pending.append(entry.path)
            else:
                yield FileEntry(entry.path, entry.size_bytes, entry.modified_at)
