"""The sandbox port over a fleet: sessions placed on nodes, each call routed by its signed id.

What the interpreter (and any other door but the code-execution API's own byte proxy) uses on a
front. A lost node answers `SessionNotFound` like an unknown session, with a message that says
the machine is gone, so a chat's next turn leases a new sandbox and tells the agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from ..egress.credentials import Credential, CredentialInfo
from ..errors import Conflict, SandbankError, SessionNotFound
from ..protocol import codec
from ..protocol.calls import Event, ExecResult, ToolCall
from ..protocol.client import JSON, Body, ExecClient, error_of
from ..protocol.filesystem import FsChange, FsEntry
from ..protocol.http1 import Reply
from ..protocol.processes import ContextInfo, ProcessEvent, ProcessInfo, ProcessSpec, Signal
from ..protocol.sessions import (
    SESSION_NAME_HEADER,
    Download,
    FileEntry,
    FormPart,
    SessionInfo,
    SessionSpec,
)
from .front import Fleet, NodeGone, gone
from .membership import Member

T = TypeVar("T")
# Nodes know no tenants (the fronts' ids do): a session's tenant is kept with it as this label,
# so that a front can list a tenant's sessions.
TENANT_LABEL = "sandbank.fleet.tenant"
STORED_ON_NODES = (
    "a fleet's front stores no credentials: store them on each node (POST /credentials there), "
    "or give a session its own at CreateSession"
)


class MemberTransport:
    """Requests to one node through the front's connections (`NodeGone` when it is lost)."""

    def __init__(self, fleet: Fleet, member: Member) -> None:
        self.fleet = fleet
        self.member = member

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: Body = None,
        stream: bool = False,
    ) -> Reply:
        return await self.fleet.send(self.member, method, target, dict(headers), body, stream)


class FleetSandboxes:
    """Sessions on the fleet's nodes."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    async def start(self) -> None:
        pass  # the front starts the fleet; nodes are Sandbank nodes, serving every operation

    async def close(self) -> None:
        pass

    def status(self) -> dict[str, int]:
        return {"nodes_up": len(self.fleet.membership.up())}

    def healthy(self) -> bool:
        return not self.fleet.terminating

    def _client(self, member: Member) -> ExecClient:
        return ExecClient(MemberTransport(self.fleet, member))

    async def _on(
        self, session_id: str, tenant: str, call: Callable[[ExecClient, str], Awaitable[T]]
    ) -> T:
        member, local = await self.fleet.route(tenant, session_id)
        try:
            return await call(self._client(member), local)
        except NodeGone:
            raise gone(session_id, member.name) from None

    async def create(self, tenant: str, spec: SessionSpec | None = None) -> SessionInfo:
        spec = spec or SessionSpec()
        spec = dataclasses.replace(
            spec,
            labels={**spec.labels, TENANT_LABEL: tenant},
            isolation=self.fleet.isolation_for(tenant, spec.isolation),
        )
        body = json.dumps(codec.encode_create(spec)).encode()
        headers = {"content-type": JSON}
        prefer = None
        if spec.name is not None:
            # Named for the tenant on the node (which sees no tenants), and always asked of the
            # same node while it takes sessions: every front finds it there again.
            name = hashlib.sha256(f"{tenant}\0{spec.name}".encode()).hexdigest()
            headers[SESSION_NAME_HEADER] = name
            prefer = name

        def create(member: Member) -> Awaitable[Reply]:
            return self.fleet.send(member, "POST", "/sessions", dict(headers), body)

        reply, handle = await self.fleet.place(tenant, create, prefer, spec.isolation)
        if reply.status != 201:
            raise error_of(reply)
        return _public(codec.decode_handle(handle), handle["session_id"])

    async def get(self, session_id: str, tenant: str) -> SessionInfo:
        info = await self._on(session_id, tenant, lambda c, local: c.get(local))
        return _public(info, session_id)

    async def list_sessions(self, tenant: str) -> list[SessionInfo]:
        """Every node's sessions of the tenant (a node that does not answer lists none)."""
        members = self.fleet.membership.up()

        async def listing(member: Member) -> list[SessionInfo]:
            try:
                return await self._client(member).list_sessions()
            except (NodeGone, SandbankError):
                return []

        found: list[SessionInfo] = []
        for member, listed in zip(
            members, await asyncio.gather(*map(listing, members)), strict=True
        ):
            for info in listed:
                if info.labels.get(TENANT_LABEL) == tenant and member.instance:
                    local = member.instance + info.id
                    found.append(_public(info, self.fleet.ids.sign(tenant, member.name, local)))
        return sorted(found, key=lambda i: i.created_at)

    async def pause(self, session_id: str, tenant: str) -> SessionInfo:
        info = await self._on(session_id, tenant, lambda c, local: c.pause(local))
        return _public(info, session_id)

    async def resume(self, session_id: str, tenant: str) -> SessionInfo:
        info = await self._on(session_id, tenant, lambda c, local: c.resume(local))
        return _public(info, session_id)

    async def set_lifetime(self, session_id: str, tenant: str, seconds: int) -> SessionInfo:
        info = await self._on(session_id, tenant, lambda c, local: c.set_lifetime(local, seconds))
        return _public(info, session_id)

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

    # A tenant's stored credentials live on each node (its data directory, its key): a front
    # does not keep them. A session's own credentials (CreateSession) go to its node.
    async def store_credential(self, tenant: str, credential: Credential) -> CredentialInfo:
        raise Conflict(STORED_ON_NODES)

    async def list_stored_credentials(self, tenant: str) -> list[CredentialInfo]:
        raise Conflict(STORED_ON_NODES)

    async def delete_stored_credential(self, tenant: str, credential_id: str) -> None:
        raise Conflict(STORED_ON_NODES)

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

    async def start_process(
        self, session_id: str, tenant: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        member, local = await self.fleet.route(tenant, session_id)
        try:
            async for event in await self._client(member).start_process(local, spec):
                yield event
        except NodeGone:
            raise gone(session_id, member.name) from None

    async def connect_process(
        self, session_id: str, tenant: str, pid: int
    ) -> AsyncIterator[ProcessEvent]:
        member, local = await self.fleet.route(tenant, session_id)
        try:
            async for event in await self._client(member).connect_process(local, pid):
                yield event
        except NodeGone:
            raise gone(session_id, member.name) from None

    async def list_processes(self, session_id: str, tenant: str) -> list[ProcessInfo]:
        return await self._on(session_id, tenant, lambda c, local: c.list_processes(local))

    async def send_stdin(self, session_id: str, tenant: str, pid: int, data: bytes) -> None:
        await self._on(session_id, tenant, lambda c, local: c.send_stdin(local, pid, data))

    async def close_stdin(self, session_id: str, tenant: str, pid: int) -> None:
        await self._on(session_id, tenant, lambda c, local: c.close_stdin(local, pid))

    async def signal_process(self, session_id: str, tenant: str, pid: int, sig: Signal) -> None:
        await self._on(session_id, tenant, lambda c, local: c.signal_process(local, pid, sig))

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

    async def execute(
        self, session_id: str, tenant: str, call: ToolCall, timeout: float
    ) -> ExecResult:
        return await self._on(session_id, tenant, lambda c, local: c.execute(local, call, timeout))

    async def stream(
        self,
        session_id: str,
        tenant: str,
        call: ToolCall,
        timeout: float,
        *,
        cancel_on_close: bool = False,
    ) -> AsyncIterator[Event]:
        member, local = await self.fleet.route(tenant, session_id)
        try:
            async for event in self._client(member).stream(local, call, timeout, cancel_on_close):
                yield event
        except NodeGone:
            raise gone(session_id, member.name) from None

    async def destroy(self, session_id: str, tenant: str) -> None:
        try:
            member, local = await self.fleet.route(tenant, session_id)
            await self._client(member).destroy(local)
            member.released()
        except (SessionNotFound, NodeGone):
            pass  # already gone: the desired state

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
        # Nodes are Sandbank servers, but the protocol carries no modes: as for any remote
        # backend, a read-only file is made so by its mode (the store keeps the original).
        entry = await self._on(
            session_id, tenant, lambda c, local: c.write_file(local, path, chunks)
        )
        if read_only:
            chmod = codec.tool_call("bash_code_execution", {"command": f"chmod 0444 '{_q(path)}'"})
            await self.execute(session_id, tenant, chmod, 30)
        return entry


def _public(info: SessionInfo, public_id: str) -> SessionInfo:
    """A node's handle as the front shows it: the fleet's id, without the fleet's own label."""
    labels = {k: v for k, v in info.labels.items() if k != TENANT_LABEL}
    return dataclasses.replace(info, id=public_id, labels=labels)


def _q(path: str) -> str:
    return path.replace("'", "'\\''")
