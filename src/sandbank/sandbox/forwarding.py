"""The sandbox port over the protocol's client: each session's operation asked of a server.

Shared by `remote.RemoteSandboxes` (one code-execution API) and `fleet.sandboxes.FleetSandboxes`
(the node holding the session): they differ only in which client serves a session, under what
id, and how a failed transport is told; the operations forward the same way.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from ..egress.credentials import Credential, CredentialInfo
from ..protocol.calls import BashCall, Event, ExecResult, ToolCall
from ..protocol.client import ExecClient
from ..protocol.filesystem import FsChange, FsEntry
from ..protocol.processes import ContextInfo, ProcessEvent, ProcessInfo, ProcessSpec, Signal
from ..protocol.sessions import Download, FileEntry, FormPart

T = TypeVar("T")
E = TypeVar("E")
# An operation of a session: given the client that serves it and the session's id there.
On = Callable[[ExecClient, str], Awaitable[T]]
Events = Callable[[ExecClient, str], AsyncIterator[E]]
CHMOD_TIMEOUT_S = 30


class ForwardingSandboxes(ABC):
    """The operations a server answers for a session as they are, over `_on` and `_events`."""

    @abstractmethod
    async def _on(self, session_id: str, tenant: str, call: On[T]) -> T:
        """`call` on the client serving the session; a failed transport as the provider says."""

    @abstractmethod
    def _events(self, session_id: str, tenant: str, events: Events[E]) -> AsyncIterator[E]:
        """`events` from the client serving the session, a failed transport told as by `_on`."""

    async def execute(
        self, session_id: str, tenant: str, call: ToolCall, timeout: float
    ) -> ExecResult:
        return await self._on(session_id, tenant, lambda c, local: c.execute(local, call, timeout))

    def stream(
        self,
        session_id: str,
        tenant: str,
        call: ToolCall,
        timeout: float,
        *,
        cancel_on_close: bool = False,
    ) -> AsyncIterator[Event]:
        return self._events(
            session_id, tenant, lambda c, local: c.stream(local, call, timeout, cancel_on_close)
        )

    async def list_files(
        self, session_id: str, tenant: str, path: str, limit: int
    ) -> tuple[list[FileEntry], bool]:
        return await self._on(session_id, tenant, lambda c, local: c.list_files(local, path))

    async def read_file(self, session_id: str, tenant: str, path: str) -> Download:
        return await self._on(session_id, tenant, lambda c, local: c.read_file(local, path))

    async def upload(
        self, session_id: str, tenant: str, form: AsyncIterator[FormPart], cap: int
    ) -> FileEntry:
        return await self._on(session_id, tenant, lambda c, local: c.upload(local, form))

    async def write_file(
        self,
        session_id: str,
        tenant: str,
        path: str,
        chunks: AsyncIterator[bytes],
        *,
        read_only: bool = False,
    ) -> FileEntry:
        entry = await self._on(
            session_id, tenant, lambda c, local: c.write_file(local, path, chunks)
        )
        if read_only:
            # The protocol carries no modes (a fleet's nodes' neither): the best it allows. The
            # store keeps the user's upload whatever the code does (run outputs never replace it).
            chmod = BashCall(f"chmod 0444 {shlex.quote(path)}")
            await self.execute(session_id, tenant, chmod, CHMOD_TIMEOUT_S)
        return entry

    # --- the session's own credentials ---------------------------------------------------------
    async def list_credentials(self, session_id: str, tenant: str) -> list[CredentialInfo]:
        return await self._on(session_id, tenant, lambda c, local: c.list_credentials(local))

    async def remove_credential(self, session_id: str, tenant: str, credential_id: str) -> None:
        await self._on(
            session_id, tenant, lambda c, local: c.remove_credential(local, credential_id)
        )

    async def replace_credentials(
        self, session_id: str, tenant: str, credentials: Sequence[Credential]
    ) -> list[CredentialInfo]:
        return await self._on(
            session_id, tenant, lambda c, local: c.replace_credentials(local, credentials)
        )

    # --- Python contexts -----------------------------------------------------------------------
    async def create_context(
        self, session_id: str, tenant: str, cwd: str | None = None
    ) -> ContextInfo:
        return await self._on(session_id, tenant, lambda c, local: c.create_context(local, cwd))

    async def list_contexts(self, session_id: str, tenant: str) -> list[ContextInfo]:
        return await self._on(session_id, tenant, lambda c, local: c.list_contexts(local))

    async def restart_context(self, session_id: str, tenant: str, context_id: str) -> None:
        await self._on(session_id, tenant, lambda c, local: c.restart_context(local, context_id))

    async def remove_context(self, session_id: str, tenant: str, context_id: str) -> None:
        await self._on(session_id, tenant, lambda c, local: c.remove_context(local, context_id))

    # --- background processes ------------------------------------------------------------------
    def start_process(
        self, session_id: str, tenant: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        return self._events(
            session_id, tenant, lambda c, local: _awaited(c.start_process(local, spec))
        )

    def connect_process(
        self, session_id: str, tenant: str, pid: int
    ) -> AsyncIterator[ProcessEvent]:
        return self._events(
            session_id, tenant, lambda c, local: _awaited(c.connect_process(local, pid))
        )

    async def list_processes(self, session_id: str, tenant: str) -> list[ProcessInfo]:
        return await self._on(session_id, tenant, lambda c, local: c.list_processes(local))

    async def send_stdin(self, session_id: str, tenant: str, pid: int, data: bytes) -> None:
        await self._on(session_id, tenant, lambda c, local: c.send_stdin(local, pid, data))

    async def close_stdin(self, session_id: str, tenant: str, pid: int) -> None:
        await self._on(session_id, tenant, lambda c, local: c.close_stdin(local, pid))

    async def signal_process(self, session_id: str, tenant: str, pid: int, sig: Signal) -> None:
        await self._on(session_id, tenant, lambda c, local: c.signal_process(local, pid, sig))

    # --- the workspace's tree ------------------------------------------------------------------
    async def stat(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await self._on(session_id, tenant, lambda c, local: c.stat(local, path))

    async def list_tree(self, session_id: str, tenant: str, path: str, depth: int) -> list[FsEntry]:
        return await self._on(session_id, tenant, lambda c, local: c.list_tree(local, path, depth))

    async def make_dir(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await self._on(session_id, tenant, lambda c, local: c.make_dir(local, path))

    async def move(self, session_id: str, tenant: str, source: str, destination: str) -> FsEntry:
        return await self._on(
            session_id, tenant, lambda c, local: c.move(local, source, destination)
        )

    async def remove(self, session_id: str, tenant: str, path: str) -> None:
        await self._on(session_id, tenant, lambda c, local: c.remove(local, path))

    async def watch(
        self, session_id: str, tenant: str, path: str, recursive: bool
    ) -> AsyncIterator[FsChange]:
        return await self._on(session_id, tenant, lambda c, local: c.watch(local, path, recursive))

    async def create_watcher(self, session_id: str, tenant: str, path: str, recursive: bool) -> str:
        return await self._on(
            session_id, tenant, lambda c, local: c.create_watcher(local, path, recursive)
        )

    async def watcher_changes(
        self, session_id: str, tenant: str, watcher_id: str
    ) -> list[FsChange]:
        return await self._on(
            session_id, tenant, lambda c, local: c.watcher_changes(local, watcher_id)
        )

    async def remove_watcher(self, session_id: str, tenant: str, watcher_id: str) -> None:
        await self._on(session_id, tenant, lambda c, local: c.remove_watcher(local, watcher_id))


async def _awaited(events: Awaitable[AsyncIterator[E]]) -> AsyncIterator[E]:
    """The events of an operation that answers before it streams (a process's start)."""
    async for event in await events:
        yield event
