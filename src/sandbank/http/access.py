"""Per request: a request id on every log line, one access line, and the HTTP metrics."""

from __future__ import annotations

import logging
import random
import re
import time

from prometheus_client import Counter, Histogram
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


Children = tuple[Histogram, Counter, Counter, Counter]


class AccessMiddleware:
    """Gives each request an id, logs one access line and counts it.

    On every request's path, so it costs a few microseconds: one lookup finds the request's
    metric children (by route, method and status), and the access line's fields are built
    only when it is logged.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # (route, method, status) -> its children: seconds, requests, bytes in, bytes out
        self._children: dict[tuple[str, str, int], Children] = {}
        self._ids = random.Random()  # noqa: S311 - a request id correlates lines; no secret

    def _metrics(self, route: str, method: str, status: int) -> Children:
        key = (route, method, status)
        found = self._children.get(key)
        if found is None:
            m = self.metrics
            found = self._children[key] = (
                m.child(m.http_seconds, route),
                m.child(m.http_requests, route, method, str(status)),
                m.child(m.http_bytes, route, "in"),
                m.child(m.http_bytes, route, "out"),
            )
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = ""
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                given = value.decode("latin-1")
        rid = given if CLIENT_ID.fullmatch(given) else f"{self._ids.getrandbits(64):016x}"
        token = request_id.set(rid)
        path = str(scope["path"])
        named = SESSION_PATH.match(path)
        session_token = session_id.set(named.group(1) if named else "-")
        root = str(scope.get("root_path", ""))
        started = time.monotonic()
        status = 500  # if nothing was sent, the server failed
        method = str(scope["method"])
        children: Children | None = None  # known once the response starts
        received = sent = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, sent, children
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            elif message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [h for h in message.get("headers", ()) if h[0].lower() != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message["headers"] = headers
                children = self._metrics(route_of(scope, root), method, status)
                children[0].observe(time.monotonic() - started)
            await send(message)

        try:
            await self.app(scope, counting_receive, send_with_id)
        finally:
            if children is None:
                children = self._metrics(route_of(scope, root), method, status)
            _, requests, bytes_in, bytes_out = children
            requests.inc()
            if received:
                bytes_in.inc(received)
            if sent:
                bytes_out.inc(sent)
            if log.isEnabledFor(logging.INFO):
                # The path without its query: presigned URLs carry signatures there. The path
                # is the client's: text logs escape its control characters, JSON logs have it
                # as a field of its own (logs.py).
                ms = (time.monotonic() - started) * 1000
                fields = {
                    "method": method,
                    "path": path,
                    "status": status,
                    "duration_ms": round(ms, 1),
                }
                log.info("%s %s %d %.1f ms", method, path, status, ms, extra={"fields": fields})
            session_id.reset(session_token)
            request_id.reset(token)
