"""The sandbox port over a fleet: sessions placed on nodes, each call routed by its signed id.

What the interpreter (and any other door but the code-execution API's own byte proxy) uses on a
front. A lost node answers `SessionNotFound` like an unknown session, with a message that says
the machine is gone, so a chat's next turn leases a new sandbox and tells the agent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ..errors import SessionNotFound
from ..protocol import codec
from ..protocol.calls import Event, ExecResult, ToolCall
from ..protocol.client import JSON, Body, ExecClient, error_of
from ..protocol.http1 import Reply
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
        member, local = self.fleet.route(tenant, session_id)
        try:
            return await call(self._client(member), local)
        except NodeGone:
            raise gone(session_id, member.name) from None

    async def create(self, tenant: str, spec: SessionSpec | None = None) -> SessionInfo:
        spec = spec or SessionSpec()
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

        reply, handle = await self.fleet.place(tenant, create, prefer)
        if reply.status != 201:
            raise error_of(reply)
        return codec.decode_handle(handle)

    async def get(self, session_id: str, tenant: str) -> SessionInfo:
        # Nodes answer GetSession as a listing does: 404 once the session is gone.
        await self._on(session_id, tenant, lambda c, local: c.list_files(local, "."))
        return SessionInfo(session_id, 0, 0, 0.0, 0.0)

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
        member, local = self.fleet.route(tenant, session_id)
        try:
            async for event in self._client(member).stream(local, call, timeout, cancel_on_close):
                yield event
        except NodeGone:
            raise gone(session_id, member.name) from None

    async def destroy(self, session_id: str, tenant: str) -> None:
        try:
            member, local = self.fleet.route(tenant, session_id)
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


def _q(path: str) -> str:
    return path.replace("'", "'\\''")
