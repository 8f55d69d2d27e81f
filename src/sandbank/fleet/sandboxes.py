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
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from ..egress.credentials import Credential, CredentialInfo
from ..errors import Conflict, SandbankError, SessionNotFound
from ..protocol import codec
from ..protocol.client import JSON, Body, ExecClient, error_of
from ..protocol.http1 import Reply
from ..protocol.sessions import (
    SESSION_NAME_HEADER,
    SessionInfo,
    SessionSpec,
)
from ..sandbox.forwarding import Events, ForwardingSandboxes, On
from .front import Fleet, NodeGone, reaching
from .membership import Member

T = TypeVar("T")
E = TypeVar("E")
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


class FleetSandboxes(ForwardingSandboxes):
    """Sessions on the fleet's nodes; a session's operations forwarded to its node."""

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

    async def _on(self, session_id: str, tenant: str, call: On[T]) -> T:
        member, local = await self.fleet.route(tenant, session_id)
        with reaching(session_id, member):
            return await call(self._client(member), local)

    async def _events(self, session_id: str, tenant: str, events: Events[E]) -> AsyncIterator[E]:
        member, local = await self.fleet.route(tenant, session_id)
        with reaching(session_id, member):
            async for event in events(self._client(member), local):
                yield event

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

    # A tenant's stored credentials live on each node (its data directory, its key): a front
    # does not keep them. A session's own credentials (CreateSession) go to its node.
    async def store_credential(self, tenant: str, credential: Credential) -> CredentialInfo:
        raise Conflict(STORED_ON_NODES)

    async def list_stored_credentials(self, tenant: str) -> list[CredentialInfo]:
        raise Conflict(STORED_ON_NODES)

    async def delete_stored_credential(self, tenant: str, credential_id: str) -> None:
        raise Conflict(STORED_ON_NODES)

    async def destroy(self, session_id: str, tenant: str) -> None:
        try:
            member, local = await self.fleet.route(tenant, session_id)
            await self._client(member).destroy(local)
            member.released()
        except (SessionNotFound, NodeGone):
            pass  # already gone: the desired state


def _public(info: SessionInfo, public_id: str) -> SessionInfo:
    """A node's handle as the front shows it: the fleet's id, without the fleet's own label."""
    labels = {k: v for k, v in info.labels.items() if k != TENANT_LABEL}
    return dataclasses.replace(info, id=public_id, labels=labels)
