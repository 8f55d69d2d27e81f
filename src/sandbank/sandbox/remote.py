"""The sandbox port over any code-execution API at `sandbox_url` (this server's included).

The token is the tenant there: `tenant` is not sent. Sessions of this provider belong to one
tenant, so an id of another caller is the remote server's business, not ours.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

import httpx

from ..config import Settings
from ..egress.credentials import Credential, CredentialInfo
from ..errors import SandboxError
from ..protocol.calls import BashCall, Event, ExecResult, ToolCall
from ..protocol.client import ExecClient, HttpxTransport
from ..protocol.filesystem import FsChange, FsEntry
from ..protocol.http1 import TransportFailed
from ..protocol.processes import ContextInfo, ProcessEvent, ProcessInfo, ProcessSpec, Signal
from ..protocol.sessions import Download, FileEntry, FormPart, SessionInfo, SessionSpec

log = logging.getLogger(__name__)
T = TypeVar("T")
# The backend answers a call at its deadline; this much more covers the trip and its restart.
HTTP_SLACK_S = 15.0
CONNECT_TIMEOUT_S = 10.0


class RemoteSandboxes:
    """Sessions of a code-execution API server, through its protocol."""

    def __init__(
        self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.base_url = settings.sandbox_url.rstrip("/")
        token = settings.sandbox_token.get_secret_value()
        self.http = HttpxTransport(
            self.base_url,
            settings.exec_timeout_max + HTTP_SLACK_S,
            CONNECT_TIMEOUT_S,
            transport=transport,
        )
        self.client = ExecClient(self.http, f"Bearer {token}" if token else None)

    async def start(self) -> None:
        """Probe the optional file routes the interpreter needs, on a fresh session."""
        session = await self.create("")
        try:
            for route in (f"/sessions/{session.id}/files/list", f"/sessions/{session.id}/files"):
                reply = await self._guard(
                    self.http.request("GET", f"{route}?path=.", dict(self.client.headers))
                )
                # GetFile on the workspace directory answers 400 (a directory): served.
                if reply.status in (404, 405, 501):
                    raise SandboxError(
                        f"the sandbox backend at {self.base_url} does not serve {route} "
                        f"(HTTP {reply.status}); the interpreter needs its optional file "
                        "operations (ListFiles, GetFile, PutFile)"
                    )
        finally:
            await self.destroy(session.id, "")
        log.info("sandbox backend %s serves the file operations", self.base_url)

    async def close(self) -> None:
        await self.http.close()

    def status(self) -> dict[str, int]:
        return {}

    def healthy(self) -> bool:
        return True

    async def create(self, tenant: str, spec: SessionSpec | None = None) -> SessionInfo:
        return await self._guard(self.client.create(spec))

    async def get(self, session_id: str, tenant: str) -> SessionInfo:
        # The protocol has no GetSession: a listing answers 404 for a session that is gone.
        await self.list_files(session_id, tenant, ".", 1)
        return SessionInfo(session_id, 0, 0, 0.0, 0.0)

    async def execute(
        self, session_id: str, tenant: str, call: ToolCall, timeout: float
    ) -> ExecResult:
        return await self._guard(self.client.execute(session_id, call, timeout))

    async def stream(
        self,
        session_id: str,
        tenant: str,
        call: ToolCall,
        timeout: float,
        *,
        cancel_on_close: bool = False,
    ) -> AsyncIterator[Event]:
        try:
            async for event in self.client.stream(session_id, call, timeout, cancel_on_close):
                yield event
        except TransportFailed as e:
            raise self._failed(e) from e

    async def destroy(self, session_id: str, tenant: str) -> None:
        await self._guard(self.client.destroy(session_id))

    async def list_files(
        self, session_id: str, tenant: str, path: str, limit: int
    ) -> tuple[list[FileEntry], bool]:
        return await self._guard(self.client.list_files(session_id, path))

    async def read_file(self, session_id: str, tenant: str, path: str) -> Download:
        return await self._guard(self.client.read_file(session_id, path))

    async def upload(
        self, session_id: str, tenant: str, form: AsyncIterator[FormPart], cap: int
    ) -> FileEntry:
        return await self._guard(self.client.upload(session_id, form))

    async def write_file(
        self,
        session_id: str,
        tenant: str,
        path: str,
        chunks: AsyncIterator[bytes],
        *,
        read_only: bool = False,
    ) -> FileEntry:
        entry = await self._guard(self.client.write_file(session_id, path, chunks))
        if read_only:
            # The protocol has no modes: the best a remote backend allows. The store keeps the
            # user's upload whatever the code does, since run outputs never replace uploads.
            await self.execute(session_id, tenant, BashCall(f"chmod 0444 {shlex.quote(path)}"), 30)
        return entry

    # --- additions: a Sandbank server serves them (other backends answer 404) ---------------
    async def list_sessions(self, tenant: str) -> list[SessionInfo]:
        return await self._guard(self.client.list_sessions())

    async def pause(self, session_id: str, tenant: str) -> SessionInfo:
        return await self._guard(self.client.pause(session_id))

    async def resume(self, session_id: str, tenant: str) -> SessionInfo:
        return await self._guard(self.client.resume(session_id))

    async def set_lifetime(self, session_id: str, tenant: str, seconds: int) -> SessionInfo:
        return await self._guard(self.client.set_lifetime(session_id, seconds))

    async def list_credentials(self, session_id: str, tenant: str) -> list[CredentialInfo]:
        return await self._guard(self.client.list_credentials(session_id))

    async def remove_credential(self, session_id: str, tenant: str, credential_id: str) -> None:
        await self._guard(self.client.remove_credential(session_id, credential_id))

    async def replace_credentials(
        self, session_id: str, tenant: str, credentials: Sequence[Credential]
    ) -> list[CredentialInfo]:
        return await self._guard(self.client.replace_credentials(session_id, credentials))

    async def store_credential(self, tenant: str, credential: Credential) -> CredentialInfo:
        return await self._guard(self.client.store_credential(credential))

    async def list_stored_credentials(self, tenant: str) -> list[CredentialInfo]:
        return await self._guard(self.client.list_stored_credentials())

    async def delete_stored_credential(self, tenant: str, credential_id: str) -> None:
        await self._guard(self.client.delete_stored_credential(credential_id))

    async def create_context(
        self, session_id: str, tenant: str, cwd: str | None = None
    ) -> ContextInfo:
        return await self._guard(self.client.create_context(session_id, cwd))

    async def list_contexts(self, session_id: str, tenant: str) -> list[ContextInfo]:
        return await self._guard(self.client.list_contexts(session_id))

    async def restart_context(self, session_id: str, tenant: str, context_id: str) -> None:
        await self._guard(self.client.restart_context(session_id, context_id))

    async def remove_context(self, session_id: str, tenant: str, context_id: str) -> None:
        await self._guard(self.client.remove_context(session_id, context_id))

    async def start_process(
        self, session_id: str, tenant: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        events = await self._guard(self.client.start_process(session_id, spec))
        async for event in self._streamed(events):
            yield event

    async def connect_process(
        self, session_id: str, tenant: str, pid: int
    ) -> AsyncIterator[ProcessEvent]:
        events = await self._guard(self.client.connect_process(session_id, pid))
        async for event in self._streamed(events):
            yield event

    async def _streamed(self, events: AsyncIterator[ProcessEvent]) -> AsyncIterator[ProcessEvent]:
        try:
            async for event in events:
                yield event
        except TransportFailed as e:
            raise self._failed(e) from e

    async def list_processes(self, session_id: str, tenant: str) -> list[ProcessInfo]:
        return await self._guard(self.client.list_processes(session_id))

    async def send_stdin(self, session_id: str, tenant: str, pid: int, data: bytes) -> None:
        await self._guard(self.client.send_stdin(session_id, pid, data))

    async def close_stdin(self, session_id: str, tenant: str, pid: int) -> None:
        await self._guard(self.client.close_stdin(session_id, pid))

    async def signal_process(self, session_id: str, tenant: str, pid: int, sig: Signal) -> None:
        await self._guard(self.client.signal_process(session_id, pid, sig))

    async def stat(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await self._guard(self.client.stat(session_id, path))

    async def list_tree(self, session_id: str, tenant: str, path: str, depth: int) -> list[FsEntry]:
        return await self._guard(self.client.list_tree(session_id, path, depth))

    async def make_dir(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await self._guard(self.client.make_dir(session_id, path))

    async def move(self, session_id: str, tenant: str, source: str, destination: str) -> FsEntry:
        return await self._guard(self.client.move(session_id, source, destination))

    async def remove(self, session_id: str, tenant: str, path: str) -> None:
        await self._guard(self.client.remove(session_id, path))

    async def watch(
        self, session_id: str, tenant: str, path: str, recursive: bool
    ) -> AsyncIterator[FsChange]:
        return await self._guard(self.client.watch(session_id, path, recursive))

    async def create_watcher(self, session_id: str, tenant: str, path: str, recursive: bool) -> str:
        return await self._guard(self.client.create_watcher(session_id, path, recursive))

    async def watcher_changes(
        self, session_id: str, tenant: str, watcher_id: str
    ) -> list[FsChange]:
        return await self._guard(self.client.watcher_changes(session_id, watcher_id))

    async def remove_watcher(self, session_id: str, tenant: str, watcher_id: str) -> None:
        await self._guard(self.client.remove_watcher(session_id, watcher_id))

    async def _guard(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except TransportFailed as e:
            raise self._failed(e) from e

    def _failed(self, e: TransportFailed) -> SandboxError:
        return SandboxError(f"the sandbox backend at {self.base_url} failed: {e}")
