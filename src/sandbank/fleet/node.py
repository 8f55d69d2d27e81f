"""The node role: the local sandboxes' code-execution API for the fronts alone, capacity, drain."""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..config import Settings
from ..errors import AtCapacity, BadRequest, SandbankError, SessionNotFound, Unauthorized
from ..files import ObjectStore
from ..http.errors import error_response
from ..sandbox.local import LocalSandboxes
from .moves import MovedSnapshots

log = logging.getLogger(__name__)
OPEN_PATHS = {"/health"}  # kubelet probes carry no secret; it tells nothing but "alive"
INSTANCE_HEADER = b"x-sandbank-node-instance"
INSTANCE_LENGTH = 8


def node_settings(settings: Settings) -> Settings:
    """A node serves the code-execution API only; the fleet token, not the Host, guards it."""
    if not settings.fleet_token.get_secret_value():
        raise SandbankError("a node needs SANDBANK_FLEET_TOKEN (the same on fronts and nodes)")
    return settings.model_copy(
        update={"interpreter_api": "off", "web_ui": "off", "exec_api": "on", "allowed_hosts": "*"}
    )


def node_name(settings: Settings) -> str:
    return settings.fleet_node_name or socket.gethostname().split(".")[0].lower()


def memory_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class NodeControl:
    """Capacity reports for the fronts, the drain (SIGTERM or `POST /fleet/drain`), and the
    adoption of sessions moved from a drained node (`POST /fleet/adopt`)."""

    def __init__(
        self,
        settings: Settings,
        local: LocalSandboxes,
        objects: ObjectStore | None = None,
        counted: Callable[[str], None] = lambda direction: None,
    ) -> None:
        self.settings = settings
        self.local = local
        self.name = node_name(settings)
        # This process's incarnation: a session id names it, so a call on a session of a node
        # that restarted under the same name is told the machine holding it is gone.
        self.instance = secrets.token_hex(INSTANCE_LENGTH // 2)
        self.draining = False
        self.closed = False  # drained: every session is about to end (or move)
        self.moving = False  # its sessions are being paused and exported
        self._drained: asyncio.Task[None] | None = None
        # With snapshots kept at a stop, a drain moves the sessions (moves.py) instead of
        # ending them: through the deployment's object store, signed with the fleet's key.
        self.moves: MovedSnapshots | None = None
        if objects is not None and settings.pause_on_shutdown:
            token = settings.fleet_token.get_secret_value()
            self.moves = MovedSnapshots(
                token, local, objects, self.name, self.instance, counted=counted
            )
            if settings.checkpoint_after_idle_seconds:
                # Checkpoints off the machine: a lost node's sessions continue from them.
                local.on_checkpoint = self.moves.export
                local.on_ended = self.moves.ended

    def routes(self) -> list[Route]:
        return [
            Route("/fleet/capacity", self.capacity, methods=["GET"]),
            Route("/fleet/drain", self.drain_route, methods=["POST"]),
            Route("/fleet/adopt", self.adopt_route, methods=["POST"]),
        ]

    def report(self) -> dict[str, object]:
        sessions = self.local.sessions()
        return {
            "name": self.name,
            "instance": self.instance,
            "version": __version__,
            "sessions": len(sessions),
            "max_sessions": self.settings.max_sessions,
            "idle": sum(1 for s in sessions if s.inflight == 0),
            "inflight": sum(s.inflight for s in sessions),
            "memory_available_bytes": memory_available(),
            "memory_per_session_bytes": self.settings.memory_limit_mb * 1024 * 1024,
            "draining": self.draining,
            "isolations": list(self.local.backends),
            "moving": self.moving,
            "adopts": self.moves is not None and self.moves.possible,
        }

    async def capacity(self, request: Request) -> Response:
        return JSONResponse(self.report())

    async def drain_route(self, request: Request) -> Response:
        """The drain command: as on SIGTERM, then the sessions end; the node stays up, empty."""
        if self._drained is None:
            task = self.drain()
            task.add_done_callback(lambda _: self._end_sessions())
        return JSONResponse(self.report(), status_code=202)

    async def adopt_route(self, request: Request) -> Response:
        """A front asks for a moved session: {key, claim, lost}; its local id here, or 404."""
        try:
            body = await request.json()
            key, claim = str(body["key"]), bool(body["claim"])
            lost = bool(body.get("lost", False))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise BadRequest("expected {key, claim, lost}") from None
        if len(key) != 64 or not set(key) <= set("0123456789abcdef"):
            raise BadRequest("not a moved session's key")
        if claim and self.draining:
            raise AtCapacity("this node is draining", retry_after=1)
        local = None if self.moves is None else await self.moves.adopt(key, claim, lost)
        if local is None:
            raise SessionNotFound("no moved session by that key here")
        return JSONResponse({"session_id": local, "instance": self.instance})

    def _end_sessions(self) -> None:
        for session in self.local.sessions():
            asyncio.get_running_loop().create_task(self.local.destroy(session.id, session.tenant))

    def drain(self) -> asyncio.Task[None]:
        """Take no new sessions; done when no call runs or the grace period is over."""
        if self._drained is None:
            self.draining = True
            log.info("draining: no new sessions; waiting for running calls")
            self._drained = asyncio.get_running_loop().create_task(self._drain())
        return self._drained

    async def _drain(self) -> None:
        self.moving = self.moves is not None and self.moves.possible
        try:
            await self._wait_calls()
            if self.moving and self.moves is not None:
                await self.moves.move_out()
        except Exception:
            log.exception("moving the sessions out failed: those left end with the drain")
        finally:
            self.moving = False

    async def _wait_calls(self) -> None:
        deadline = time.monotonic() + self.settings.fleet_drain_grace_seconds
        try:
            while time.monotonic() < deadline:
                if not any(s.inflight for s in self.local.sessions()):
                    return
                await asyncio.sleep(0.05)
            log.warning("drain grace over with calls still running: they end with a result")
        finally:
            # From here on the sessions are ending: a call arriving now must not start.
            self.closed = True


class FleetGate:
    """Every request but /health must carry the fleet token; a draining node takes no session."""

    def __init__(
        self, app: ASGIApp, token: str, control: NodeControl, metrics_open: bool = False
    ) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.control = control
        # With SANDBANK_METRICS_TOKEN, /metrics checks that token itself (a scraper's).
        self.open_paths = OPEN_PATHS | ({"/metrics"} if metrics_open else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                given = value
        refusal: SandbankError | None = None
        if not hmac.compare_digest(given, self.expected):
            refusal = Unauthorized("this is a fleet node: only the fleet's fronts may call it")
        elif self.control.moving and self.control.closed and scope["path"].startswith("/sessions/"):
            refusal = AtCapacity(
                "this node is draining: the session is moving to another node; retry shortly",
                retry_after=1,
            )
        elif self.control.closed and scope["path"].startswith("/sessions/"):
            refusal = SessionNotFound(
                "this node has drained and is shutting down: its sessions are gone"
            )
        elif self.control.draining and scope["path"] == "/sessions" and scope["method"] == "POST":
            refusal = AtCapacity("this node is draining", retry_after=1)
        if refusal is not None:
            retry = getattr(refusal, "retry_after", None)
            headers = {"Retry-After": str(retry)} if retry is not None else None
            response = error_response(Request(scope), refusal, headers)
        elif scope["path"] == "/sessions" and scope["method"] == "POST":
            await self.app(scope, receive, self._with_instance(send))
            return
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _with_instance(self, send: Send) -> Send:
        instance = self.control.instance.encode()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (INSTANCE_HEADER, instance)]}
            await send(message)

        return sending
