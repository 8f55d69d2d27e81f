"""Per request: a request id on every log line, one access line, and the HTTP metrics."""

from __future__ import annotations

import logging
import re
import secrets
import time

from starlette.datastructures import MutableHeaders
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..logs import request_id, session_id
from ..metrics import Metrics

log = logging.getLogger("sandbank.access")
# A client's own id is kept when it is short and plain; anything else is replaced.
CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Both APIs name the session in the path: /sessions/{id}/... and /api/sessions/{id}/...
SESSION_PATH = re.compile(r"^(?:/api)?/sessions/([A-Za-z0-9_-]{1,64})(?:/|$)")


def route_of(scope: Scope, root: str) -> str:
    """The matched route's template (`/api/sessions/{session_id}`), never the concrete path."""
    route = scope.get("route")
    if route is None:
        return "unmatched"
    prefix = str(scope.get("root_path", root))[len(root) :]
    if isinstance(route, Mount):
        return f"{prefix}/{{path}}"
    return prefix + str(getattr(route, "path", ""))


class AccessMiddleware:
    """Gives each request an id, logs one access line and counts it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if CLIENT_ID.fullmatch(given) else secrets.token_hex(8)
        token = request_id.set(rid)
        named = SESSION_PATH.match(str(scope["path"]))
        session_token = session_id.set(named.group(1) if named else "-")
        root = str(scope.get("root_path", ""))
        m = self.metrics
        started = time.monotonic()
        status = 500  # if nothing was sent, the server failed

        received = sent = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            if message["type"] == "http.response.start":
                status = int(message["status"])
                MutableHeaders(scope=message)["X-Request-ID"] = rid
                route = route_of(scope, root)
                m.child(m.http_seconds, route).observe(time.monotonic() - started)
            await send(message)

        try:
            await self.app(scope, counting_receive, send_with_id)
        finally:
            route = route_of(scope, root)
            method = str(scope["method"])
            m.child(m.http_requests, route, method, str(status)).inc()
            m.child(m.http_bytes, route, "in").inc(received)
            m.child(m.http_bytes, route, "out").inc(sent)
            # The path without its query: presigned URLs carry signatures there. The path is
            # the client's: text logs escape its control characters, JSON logs have it as a
            # field of its own (logs.py).
            path = str(scope["path"])
            ms = (time.monotonic() - started) * 1000
            fields = {"method": method, "path": path, "status": status, "duration_ms": round(ms, 1)}
            log.info("%s %s %d %.1f ms", method, path, status, ms, extra={"fields": fields})
            session_id.reset(session_token)
            request_id.reset(token)
