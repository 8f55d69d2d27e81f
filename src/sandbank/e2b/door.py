"""The E2B door: one listener for both of the SDKs' URLs (`E2B_API_URL`, `E2B_SANDBOX_URL`).

A request naming a sandbox in `E2b-Sandbox-Id` is in-sandbox traffic, sent to the port it names
in `E2b-Sandbox-Port` (49983 envd, 49999 the code interpreter); a request on `/sandboxes` or
`/v2/sandboxes` is the control plane; anything else goes on to the rest of the server.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Router
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import Settings
from ..errors import SandbankError, SessionNotFound
from ..http.auth import TokenAuth
from ..sandbox.port import Sandboxes
from .control import ControlPlane
from .envd import Envd, Target, envd_error
from .ids import SandboxIds
from .interpreter import CodeInterpreter

ENVD_PORT, INTERPRETER_PORT = "49983", "49999"
CONTROL = re.compile(r"^/(v2/)?sandboxes(/|$)")
CONTEXT_PATH = re.compile(r"^/contexts/([^/]{1,200})(/restart)?$")
SANDBOX_ID = b"e2b-sandbox-id"


class Named:
    """What the access log and the metrics name a route by (`scope["route"].path`)."""

    def __init__(self, path: str) -> None:
        self.path = path


class E2bDoor:
    """The door's parts over one port; `app(next_app)` is its ASGI entry."""

    def __init__(
        self, sandboxes: Sandboxes, auth: TokenAuth, settings: Settings, secret: str = ""
    ) -> None:
        self.sandboxes = sandboxes
        self.ids = SandboxIds(auth.enabled, secret)
        self.control = Router(routes=ControlPlane(sandboxes, auth, self.ids, settings).routes())
        self.envd = Envd(sandboxes)
        self.interpreter = CodeInterpreter(sandboxes, settings)

    async def sandbox_traffic(self, request: Request) -> Response:
        public = request.headers.get("e2b-sandbox-id", "")
        port = request.headers.get("e2b-sandbox-port", ENVD_PORT)
        request.scope["route"] = Named(f"/e2b/{port}{self._template(port, request.url.path)}")
        try:
            tenant, session = self.ids.parse(public)
            t = Target(public, tenant, session)
            if port == INTERPRETER_PORT:
                return await self._interpreter(t, request)
            if port == ENVD_PORT:
                return await self._envd(t, request)
            await self.sandboxes.get(session, tenant)
            return _proxy_error(public, "The sandbox is running but port is not open")
        except SessionNotFound:
            # What E2B's own proxy answers: the SDKs read "was not found" as a dead sandbox.
            return _proxy_error(public, "The sandbox was not found")

    async def _envd(self, t: Target, request: Request) -> Response:
        path, method = request.url.path, request.method
        if path == "/health" and method == "GET":
            await self.sandboxes.get(t.session, t.tenant)
            return Response(status_code=204)
        token_ok = self.ids.token_ok(t.public, request.headers.get("x-access-token"))
        if path == "/files":
            if not token_ok and not self._signed(t, request):
                return envd_error(401, "unauthorized access, please provide a valid access token")
            return await self.envd.files(t, request)
        if not token_ok:
            if path.startswith(("/process.", "/filesystem.")):
                body = {"code": "unauthenticated", "message": "invalid access token"}
                return JSONResponse(body, 401)
            return envd_error(401, "unauthorized access, please provide a valid access token")
        if path.startswith(("/process.Process/", "/filesystem.Filesystem/")):
            return await self.envd.rpc(t, request)
        return envd_error(404, f"{path} is not served here")

    def _template(self, port: str, path: str) -> str:
        """A path as a route's name, from a fixed set (the metrics' labels stay few)."""
        if path.startswith("/contexts/"):
            return "/contexts/{id}" + ("/restart" if path.endswith("/restart") else "")
        known = ("/health", "/files", "/execute", "/contexts")
        return path if path in known or path in self.envd.methods else "/other"

    def _signed(self, t: Target, request: Request) -> bool:
        query = request.query_params
        signature = query.get("signature")
        if not signature:
            return False
        op = "read" if request.method == "GET" else "write"
        return self.ids.signature_ok(
            t.public,
            query.get("path", ""),
            op,
            query.get("username", ""),
            signature,
            query.get("signature_expiration"),
        )

    async def _interpreter(self, t: Target, request: Request) -> Response:
        path, method = request.url.path, request.method
        try:
            if path == "/health" and method == "GET":
                await self.sandboxes.get(t.session, t.tenant)
                return JSONResponse("OK")
            if path == "/execute" and method == "POST":
                # The SDKs send the access token here (and none on /contexts).
                if not self.ids.token_ok(t.public, request.headers.get("x-access-token")):
                    return PlainTextResponse("unauthorized: a valid X-Access-Token is needed", 401)
                return await self.interpreter.execute(t, request)
            if path == "/contexts" and method in ("GET", "POST"):
                return await self.interpreter.contexts(t, request)
            found = CONTEXT_PATH.match(path)
            if found and method == "DELETE" and not found.group(2):
                return await self.interpreter.context(t, request, found.group(1), "remove")
            if found and method == "POST" and found.group(2):
                return await self.interpreter.context(t, request, found.group(1), "restart")
        except SessionNotFound:
            raise
        except SandbankError as e:
            return PlainTextResponse(e.message, e.status)
        return PlainTextResponse("Not Found", 404)


def _proxy_error(public: str, message: str) -> Response:
    return JSONResponse({"sandboxId": public, "message": message, "code": 502}, 502)


class E2bRouting:
    """The door in front of the server's other routes (a middleware)."""

    def __init__(self, app: ASGIApp, door: E2bDoor) -> None:
        self.app = app
        self.door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if any(key == SANDBOX_ID for key, _ in scope["headers"]):
                response = await self.door.sandbox_traffic(Request(scope, receive))
                await response(scope, receive, send)
                return
            if CONTROL.match(scope["path"]):
                await self.door.control(scope, receive, send)
                return
        await self.app(scope, receive, send)
