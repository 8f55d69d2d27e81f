"""create_app(settings): builds the parts, mounts both APIs and the web UI, runs the lifespan."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .config import Settings
from .errors import SandbankError
from .execapi import openapi
from .execapi.auth import TokenAuth, load_tokens
from .execapi.routes import ExecApi
from .http import EXCEPTION_HANDLERS, HostAllowList
from .sandbox.sessions import Runtime

log = logging.getLogger("sandbank")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, tokens: list[str]) -> None:
    """An unauthenticated code-execution API is remote code execution for anyone who reaches it."""
    if settings.exec_api == "on" and not tokens and not is_loopback(settings.host):
        raise SandbankError(
            f"refusing to serve the code-execution API on {settings.host} without tokens: "
            "anyone who reaches it could run code. Set SANDBANK_EXEC_TOKENS (or "
            "SANDBANK_EXEC_TOKENS_FILE), listen on 127.0.0.1, or set SANDBANK_EXEC_API=off"
        )


class Parts:
    """Everything the server is made of, built once per app (never at import time)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runtime = Runtime(settings)
        tokens = load_tokens(settings)
        check_exposure(settings, tokens)
        self.exec_api = ExecApi(self.runtime, TokenAuth(tokens))

    async def start(self) -> None:
        await self.runtime.start()

    async def stop(self) -> None:
        await self.runtime.shutdown()


def create_app(settings: Settings) -> Starlette:
    parts = Parts(settings)
    routes: list[BaseRoute] = []
    if settings.exec_api == "on":
        routes += parts.exec_api.routes()
        routes.append(Route("/openapi.json", _openapi, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await parts.start()
        try:
            yield
        finally:
            await parts.stop()

    app = Starlette(
        routes=routes,
        middleware=[Middleware(HostAllowList, allowed=settings.allowed_hosts.split(","))],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.state.parts = parts
    return app


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi.document())
