"""Streamable HTTP at `/mcp`: the MCP SDK's transport behind the code-execution API's tokens.

Both protocol eras share the route: a request naming 2026-07-28 is answered on its own (any
replica serves it), a handshake-era one joins its MCP session (`Mcp-Session-Id`), which the SDK
keeps in this process: such clients need sticky routing across replicas.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import Unauthorized
from ..http.auth import TokenAuth
from .door import TENANT_KEY, McpDoor

MAX_BODY = 16 * 1024 * 1024  # as an Execute's body; larger files go through PutFile
UNAUTHORIZED = -32001  # implementation-defined JSON-RPC code of a refused credential
LEGACY_IDLE_SECONDS = 30 * 60  # a handshake-era MCP session unused this long is closed


class BearerGuard:
    """The code-execution API's bearer tokens in front of the MCP transport (pure ASGI, so
    responses stream untouched). A refusal is a 401 whose body is the API's error and a
    JSON-RPC error at once, which MCP clients show as such."""

    def __init__(self, app: ASGIApp, auth: TokenAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value.decode("latin-1")
        try:
            tenant = self.auth.tenant(authorization)
        except Unauthorized as e:
            await _refuse(send, e.message)
            return
        scope[TENANT_KEY] = tenant
        if self.auth.enabled:
            # The SDK binds a handshake-era MCP session to the credential that opened it.
            scope["user"] = AuthenticatedUser(
                AccessToken(
                    token=hashlib.sha256(tenant.encode()).hexdigest(), client_id=tenant, scopes=[]
                )
            )
        await self.app(scope, receive, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps(
        {
            "detail": message,
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": UNAUTHORIZED, "message": f"Unauthorized: {message}"},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class McpHttp:
    """The `/mcp` route of one app and the transport's lifetime (entered in its lifespan)."""

    def __init__(self, door: McpDoor, auth: TokenAuth) -> None:
        self.door = door
        self.manager = StreamableHTTPSessionManager(
            app=door.server,
            json_response=True,  # one JSON answer per request: the cheapest, as the API's own
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            session_idle_timeout=LEGACY_IDLE_SECONDS,  # the app checks Host (HostAllowList)
            max_request_body_size=MAX_BODY,
        )
        self.endpoint = BearerGuard(StreamableHTTPASGIApp(self.manager), auth)

    def route(self) -> Route:
        # A Route, not a Mount: a Mount would redirect /mcp to /mcp/.
        return Route("/mcp", endpoint=self.endpoint, methods=["GET", "POST", "DELETE"])

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield
