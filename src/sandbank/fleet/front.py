"""The front role: the code-execution protocol at the root, each call proxied to its node.

Stateless: a session id names its node (signed, see `ids`), so any replica routes any call.
Bodies stream through in both directions; a node that is gone answers a clear 404 at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..config import Settings
from ..errors import (
    AtCapacity,
    PayloadTooLarge,
    SandbankError,
    SandboxError,
    SessionNotFound,
)
from .ids import SessionIds
from .membership import Member, Membership
from .placement import choose

log = logging.getLogger(__name__)
HTTP_SLACK_S = 15.0  # a node answers a call by its deadline + 5 s; this covers the trip too
CREATE_BODY_MAX = 64 * 1024
PLACEMENT_TRIES = 3
# What passes from a client to a node, and back.
REQUEST_HEADERS = ("content-type", "content-length", "accept")
RESPONSE_HEADERS = (
    "content-type",
    "content-length",
    "content-disposition",
    "content-security-policy",
    "x-content-type-options",
    "cache-control",
    "retry-after",
)


class NodeGone(Exception):
    """The transport to a node failed: it crashed, restarted or is cut off."""


class Fleet:
    """A front's view of the fleet: the membership, the HTTP client to nodes, the id signer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # httpx logs every request at INFO: one line per proxied call is noise, not news.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.token = settings.fleet_token.get_secret_value()
        if not self.token:
            raise SandbankError("a front needs SANDBANK_FLEET_TOKEN (the same on fronts and nodes)")
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                settings.exec_timeout_max + HTTP_SLACK_S,
                connect=settings.fleet_connect_timeout_seconds,
            ),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
        )
        self.membership = Membership(settings, self.client)
        self.ids = SessionIds(self.token)
        self.rng = random.Random()  # noqa: S311 - spreading load, not a secret
        self.terminating = False

    async def start(self) -> None:
        await self.membership.start()

    async def close(self) -> None:
        await self.membership.close()
        await self.client.aclose()

    async def send(self, member: Member, request: httpx.Request, stream: bool) -> httpx.Response:
        """Send to a node; `NodeGone` as soon as the transport fails or the node is declared out."""
        if not member.up:
            raise NodeGone
        request.headers["authorization"] = f"Bearer {self.token}"
        lost = member.lost
        call = asyncio.ensure_future(self.client.send(request, stream=stream))
        try:
            await asyncio.wait((call, lost), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            raise
        if not call.done():
            call.cancel()
            raise NodeGone
        try:
            return call.result()
        except (httpx.TransportError, httpx.PoolTimeout) as e:
            if isinstance(e, httpx.ReadTimeout):
                raise SandboxError(f"fleet node {member.name} did not answer in time") from None
            self.membership.suspect(member, e.__class__.__name__)
            raise NodeGone from None


def gone(public_id: str, node: str) -> SessionNotFound:
    return SessionNotFound(
        f"session {public_id!r} is gone: the machine holding it ({node}) is unreachable "
        "(crashed, restarted or cut off) and its state is lost; create a new session"
    )


class FrontApi:
    """The six operations of the protocol and /health, over the fleet. `tenant` authenticates."""

    def __init__(self, fleet: Fleet, tenant: Callable[[str | None], str]) -> None:
        self.fleet = fleet
        self.tenant = tenant

    def routes(self) -> list[Route]:
        return [
            Route("/sessions", self.create_session, methods=["POST"]),
            Route("/sessions/{session_id}", self.destroy_session, methods=["DELETE"]),
            Route("/sessions/{session_id}/exec", self.execute, methods=["POST"]),
            Route("/sessions/{session_id}/files/list", self.forward, methods=["GET"]),
            Route("/sessions/{session_id}/files", self.get_file, methods=["GET"]),
            Route("/sessions/{session_id}/files", self.forward, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
        ]

    def _route(self, request: Request) -> tuple[str, Member, str]:
        """(public id, its node, the node's own id); 404 for an id the fleet did not sign."""
        public = request.path_params["session_id"]
        name, local = self.fleet.ids.verify(
            self.tenant(request.headers.get("authorization")), public
        )
        member = self.fleet.membership.get(name)
        if member is None or not member.up:
            raise gone(public, name)
        return public, member, local

    def _upstream(
        self, request: Request, member: Member, path: str, content: Any = None
    ) -> httpx.Request:
        headers = {k: v for k in REQUEST_HEADERS if (v := request.headers.get(k)) is not None}
        return self.fleet.client.build_request(
            request.method,
            member.url + path,
            params=request.url.query,
            headers=headers,
            content=content,
        )

    async def create_session(self, request: Request) -> Response:
        tenant = self.tenant(request.headers.get("authorization"))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > CREATE_BODY_MAX:
                raise PayloadTooLarge("the request body is too large")
        tried: set[str] = set()
        fleet = self.fleet
        for _ in range(PLACEMENT_TRIES):
            member = choose(fleet.membership.up(), fleet.settings.fleet_sample, fleet.rng, tried)
            if member is None:
                break
            tried.add(member.name)
            upstream = self._upstream(request, member, "/sessions", bytes(body))
            try:
                r = await fleet.send(member, upstream, stream=False)
            except NodeGone:
                continue
            if r.status_code == 503:
                continue  # full or draining since its last report: another node may take it
            if r.status_code != 201:
                return _copy(r)
            handle = r.json()
            handle["session_id"] = fleet.ids.sign(tenant, member.name, handle["session_id"])
            member.placed += 1
            return JSONResponse(handle, status_code=201)
        raise AtCapacity("every sandbox node is full or draining; retry shortly", retry_after=5)

    async def destroy_session(self, request: Request) -> Response:
        try:
            _, member, local = self._route(request)
            await self.fleet.send(
                member, self._upstream(request, member, f"/sessions/{local}"), False
            )
        except (SessionNotFound, NodeGone):
            pass  # already gone: the desired state
        return Response(status_code=204)

    async def execute(self, request: Request) -> Response:
        return await self.forward(request, suffix="/exec")

    async def forward(self, request: Request, suffix: str | None = None) -> Response:
        """A call whose answer is small: sent on, read whole, passed back."""
        public, member, local = self._route(request)
        if suffix is None:
            suffix = request.url.path.removeprefix("/sessions/").partition("/")[2]
            suffix = "/" + suffix
        body = request.stream() if request.method == "POST" else None
        upstream = self._upstream(request, member, f"/sessions/{local}{suffix}", body)
        try:
            r = await self.fleet.send(member, upstream, stream=False)
        except NodeGone:
            raise gone(public, member.name) from None
        return _copy(r)

    async def get_file(self, request: Request) -> Response:
        """A file's bytes stream from the node to the client, never held whole."""
        public, member, local = self._route(request)
        upstream = self._upstream(request, member, f"/sessions/{local}/files")
        try:
            r = await self.fleet.send(member, upstream, stream=True)
        except NodeGone:
            raise gone(public, member.name) from None
        return StreamingResponse(
            r.aiter_raw(),
            status_code=r.status_code,
            headers=_headers(r),
            background=BackgroundTask(r.aclose),
        )

    async def health(self, request: Request) -> Response:
        if self.fleet.terminating:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        up = self.fleet.membership.up()
        return JSONResponse(
            {"status": "ok", "nodes_up": len(up), "nodes_accepting": sum(m.accepting() for m in up)}
        )


def _headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k in RESPONSE_HEADERS if (v := r.headers.get(k)) is not None}


def _copy(r: httpx.Response) -> Response:
    return Response(r.content, status_code=r.status_code, headers=_headers(r))
