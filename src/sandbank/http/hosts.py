"""The Host allow-list: requests naming another host are refused (a DNS-rebinding guard)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import Misdirected
from .errors import error_response


class HostAllowList:
    """Refuses requests whose Host is not ours, so DNS rebinding cannot reach a local server."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = {h.strip().lower() for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.any:
            host = ""
            for key, value in scope["headers"]:
                if key == b"host":
                    host = value.decode("latin-1").lower()
            name = host if host.endswith("]") else host.rsplit(":", 1)[0]
            if host not in self.allowed and name not in self.allowed:
                request = Request(scope)
                response = error_response(
                    request,
                    Misdirected(
                        f"Host {host!r} is not served here; add it to SANDBANK_ALLOWED_HOSTS"
                    ),
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
