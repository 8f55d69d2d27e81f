"""The sandbox port over any code-execution API at `sandbox_url` (this server's included).

The token is the tenant there: `tenant` is not sent. Sessions of this provider belong to one
tenant, so an id of another caller is the remote server's business, not ours.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import httpx

from ..config import Settings
from ..egress.credentials import Credential, CredentialInfo
from ..errors import SandboxError
from ..protocol.client import ExecClient, HttpxTransport
from ..protocol.http1 import TransportFailed
from ..protocol.sessions import SessionInfo, SessionSpec
from .forwarding import Events, ForwardingSandboxes, On

log = logging.getLogger(__name__)
T = TypeVar("T")
E = TypeVar("E")
# The backend answers a call at its deadline; this much more covers the trip and its restart.
HTTP_SLACK_S = 15.0
CONNECT_TIMEOUT_S = 10.0


class RemoteSandboxes(ForwardingSandboxes):
    """Sessions of a code-execution API server, through its protocol (ids as the server's)."""

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

    async def destroy(self, session_id: str, tenant: str) -> None:
        await self._guard(self.client.destroy(session_id))

    # --- additions: a Sandbank server serves them (other backends answer 404) ---------------
    async def list_sessions(self, tenant: str) -> list[SessionInfo]:
        return await self._guard(self.client.list_sessions())

    async def pause(self, session_id: str, tenant: str) -> SessionInfo:
        return await self._guard(self.client.pause(session_id))

    async def resume(self, session_id: str, tenant: str) -> SessionInfo:
        return await self._guard(self.client.resume(session_id))

    async def set_lifetime(self, session_id: str, tenant: str, seconds: int) -> SessionInfo:
        return await self._guard(self.client.set_lifetime(session_id, seconds))

    async def store_credential(self, tenant: str, credential: Credential) -> CredentialInfo:
        return await self._guard(self.client.store_credential(credential))

    async def list_stored_credentials(self, tenant: str) -> list[CredentialInfo]:
        return await self._guard(self.client.list_stored_credentials())

    async def delete_stored_credential(self, tenant: str, credential_id: str) -> None:
        await self._guard(self.client.delete_stored_credential(credential_id))

    async def _on(self, session_id: str, tenant: str, call: On[T]) -> T:
        return await self._guard(call(self.client, session_id))

    async def _events(self, session_id: str, tenant: str, events: Events[E]) -> AsyncIterator[E]:
        try:
            async for event in events(self.client, session_id):
                yield event
        except TransportFailed as e:
            raise self._failed(e) from e

    async def _guard(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except TransportFailed as e:
            raise self._failed(e) from e

    def _failed(self, e: TransportFailed) -> SandboxError:
        return SandboxError(f"the sandbox backend at {self.base_url} failed: {e}")
