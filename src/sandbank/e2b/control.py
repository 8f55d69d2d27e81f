"""E2B's control plane (`E2B_API_URL`): sandboxes created, listed, inspected, extended, killed.

A sandbox is a session of the port; an API key (`X-API-Key`) is a code-execution tenant. What
E2B keeps of a sandbox (template, metadata) is kept with the session as labels, so any front
of a fleet answers for it. Every error is E2B's `{"code": status, "message"}`, so the SDKs
raise their own exceptions.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..config import Settings
from ..egress.policy import NetworkPolicy
from ..errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    SandbankError,
    SandboxUnavailable,
    SessionNotFound,
    Unauthorized,
)
from ..http.auth import TokenAuth
from ..protocol.sessions import SessionInfo, SessionSpec
from ..sandbox.port import Sandboxes
from ..streams import gather
from .ids import SandboxIds
from .messages import timestamp

ENVD_VERSION = "0.6.13"  # the envd whose API this door serves; the SDKs gate features on it
DEFAULT_TIMEOUT = 300  # seconds: what the SDKs' documentation promises when none is given
TEMPLATE = "e2b.template"
METADATA = "e2b.metadata"
MAX_BODY = 1024 * 1024
MAX_METADATA, MAX_KEY, MAX_VALUE = 64, 256, 4096
MAX_ENVS, MAX_ENV_VALUE = 256, 32 * 1024
MAX_PAGE = 100

Handler = Callable[[Request], Awaitable[Response]]


def api_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"code": status, "message": message}, status, headers=headers)


def e2b_errors(handler: Handler) -> Handler:
    """Our errors in E2B's shape (and with Retry-After when it is worth retrying)."""

    async def answering(request: Request) -> Response:
        try:
            return await handler(request)
        except SessionNotFound:
            sid = request.path_params.get("sandbox_id", "")
            return api_error(404, f"sandbox \"{sid}\" doesn't exist or you don't have access to it")
        except (AtCapacity, SandboxUnavailable) as e:
            return api_error(e.status, e.message, {"Retry-After": str(e.retry_after)})
        except SandbankError as e:
            return api_error(e.status, e.message)

    return answering


class ControlPlane:
    """The control plane's routes over the port."""

    def __init__(
        self, sandboxes: Sandboxes, auth: TokenAuth, ids: SandboxIds, settings: Settings
    ) -> None:
        self.sandboxes = sandboxes
        self.auth = auth
        self.ids = ids
        self.settings = settings

    def routes(self) -> list[Route]:
        table: list[tuple[str, str, Handler]] = [
            ("/v2/sandboxes", "POST", self.create),
            ("/sandboxes", "POST", self.create),
            ("/v2/sandboxes", "GET", self.list_v2),
            ("/sandboxes", "GET", self.list_v1),
            ("/sandboxes/{sandbox_id}", "GET", self.info),
            ("/sandboxes/{sandbox_id}", "DELETE", self.kill),
            ("/sandboxes/{sandbox_id}/timeout", "POST", self.set_timeout),
            ("/sandboxes/{sandbox_id}/pause", "POST", self.pause),
            ("/v2/sandboxes/{sandbox_id}/connect", "POST", self.connect),
            ("/sandboxes/{sandbox_id}/connect", "POST", self.connect),
            ("/sandboxes/{sandbox_id}/resume", "POST", self.connect),
            ("/sandboxes/{sandbox_id}/metrics", "GET", self.metrics),
        ]
        return [Route(path, e2b_errors(h), methods=[method]) for path, method, h in table]

    # --- who and which ---------------------------------------------------------------------
    def tenant(self, request: Request) -> str:
        key = request.headers.get("x-api-key")
        try:
            return self.auth.tenant(f"Bearer {key}" if key else None)
        except Unauthorized:
            raise Unauthorized("Invalid API key") from None

    def sandbox(self, request: Request) -> tuple[str, str, str]:
        """(public id, tenant, session id) of the path's sandbox, if it is the caller's."""
        tenant = self.tenant(request)
        public = request.path_params["sandbox_id"]
        owner, session = self.ids.parse(public)
        if owner != tenant:
            raise SessionNotFound(public)
        return public, tenant, session

    # --- bodies ------------------------------------------------------------------------------
    def created(self, tenant: str, info: SessionInfo) -> dict[str, Any]:
        public = self.ids.public(tenant, info.id)
        template = info.labels.get(TEMPLATE, "base")
        return {
            "templateID": template,
            "sandboxID": public,
            "alias": template,
            "clientID": "sandbank",
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.ids.token(public),
            "trafficAccessToken": None,
            "domain": None,
        }

    def listed(self, tenant: str, info: SessionInfo) -> dict[str, Any]:
        template = info.labels.get(TEMPLATE, "base")
        return {
            "templateID": template,
            "alias": template,
            "sandboxID": self.ids.public(tenant, info.id),
            "clientID": "sandbank",
            "startedAt": timestamp(info.created_at),
            "endAt": timestamp(info.expires_at),
            "cpuCount": max(1, round(self.settings.cpu_limit)),
            "memoryMB": self.settings.memory_limit_mb,
            "diskSizeMB": self.settings.disk_limit_mb,
            "metadata": metadata_of(info),
            "state": info.state,
            "envdVersion": ENVD_VERSION,
            "volumeMounts": [],
        }

    # --- routes --------------------------------------------------------------------------------
    async def create(self, request: Request) -> Response:
        tenant = self.tenant(request)
        body = await _json(request)
        template = body.get("templateID")
        if not isinstance(template, str) or not template or len(template) > MAX_KEY:
            raise BadRequest("templateID is required (any name: every sandbox runs one image)")
        timeout = _seconds(body.get("timeout"), DEFAULT_TIMEOUT)
        metadata = _strings(body.get("metadata"), "metadata", MAX_METADATA, MAX_VALUE)
        envs = _strings(body.get("envVars"), "envVars", MAX_ENVS, MAX_ENV_VALUE)
        network = NetworkPolicy() if body.get("allow_internet_access") is False else None
        spec = SessionSpec(
            idle_timeout=self.settings.idle_timeout_max,  # an E2B sandbox ends at its timeout
            max_lifetime=timeout,
            network=network,
            labels={TEMPLATE: template, METADATA: json.dumps(metadata)},
            envs=envs,
        )
        info = await self.sandboxes.create(tenant, spec)
        return JSONResponse(self.created(tenant, info), status_code=201)

    async def info(self, request: Request) -> Response:
        public, tenant, session = self.sandbox(request)
        info = await self.sandboxes.get(session, tenant)
        body = self.listed(tenant, info)
        body["envdAccessToken"] = self.ids.token(public)
        body["domain"] = None
        return JSONResponse(body)

    async def _listing(self, request: Request, tenant: str) -> list[SessionInfo]:
        query = request.query_params
        wanted = _metadata_filter(query.get("metadata"))
        states = [s for s in (query.get("state") or "").split(",") if s]
        if any(s not in ("running", "paused") for s in states):
            raise BadRequest(f"state must be running or paused, not {','.join(states)}")
        found = await self.sandboxes.list_sessions(tenant)
        return [
            i for i in found
            if (not states or i.state in states)
            and all(metadata_of(i).get(k) == v for k, v in wanted.items())
        ]  # fmt: skip

    async def list_v1(self, request: Request) -> Response:
        tenant = self.tenant(request)
        found = await self._listing(request, tenant)
        return JSONResponse([self.listed(tenant, i) for i in found])

    async def list_v2(self, request: Request) -> Response:
        tenant = self.tenant(request)
        query = request.query_params
        limit = _page_size(query.get("limit"))
        found = await self._listing(request, tenant)
        found.sort(key=lambda i: (i.created_at, i.id), reverse=query.get("order") != "asc")
        start = _cursor(query.get("nextToken"), found)
        page = found[start : start + limit]
        headers = {}
        if start + limit < len(found):
            # The id of the next page's first sandbox: later creations and kills move nothing.
            headers["X-Next-Token"] = _token(found[start + limit].id)
        return JSONResponse([self.listed(tenant, i) for i in page], headers=headers)

    async def kill(self, request: Request) -> Response:
        _, tenant, session = self.sandbox(request)
        await self.sandboxes.get(session, tenant)  # 404 when unknown: kill() is then False
        await self.sandboxes.destroy(session, tenant)
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        _, tenant, session = self.sandbox(request)
        body = await _json(request)
        await self.sandboxes.set_lifetime(session, tenant, _seconds(body.get("timeout"), None))
        return Response(status_code=204)

    async def pause(self, request: Request) -> Response:
        """A running sandbox is paused (204: its processes end, its state kept on disk); one
        already paused is E2B's 409."""
        _, tenant, session = self.sandbox(request)
        info = await self.sandboxes.get(session, tenant)
        if info.state == "paused":
            return api_error(409, f"sandbox {self.ids.public(tenant, session)} is already paused")
        try:
            await self.sandboxes.pause(session, tenant)
        except Conflict as e:  # this server's isolation cannot pause (E2B's 409 means "paused")
            return api_error(501, str(e))
        return Response(status_code=204)

    async def connect(self, request: Request) -> Response:
        """A running sandbox answers as created (200); a paused one is resumed first (201). Its
        timeout only grows."""
        _, tenant, session = self.sandbox(request)
        body = await _json(request)
        info = await self.sandboxes.get(session, tenant)
        status = 200
        if info.state == "paused":
            info = await self.sandboxes.resume(session, tenant)
            status = 201
        if body.get("timeout") is not None:
            seconds = _seconds(body.get("timeout"), None)
            if info.expires_at < _now() + seconds:
                info = await self.sandboxes.set_lifetime(session, tenant, seconds)
        return JSONResponse(self.created(tenant, info), status_code=status)

    async def metrics(self, request: Request) -> Response:
        _, tenant, session = self.sandbox(request)
        await self.sandboxes.get(session, tenant)
        now = _now()
        mib = 1024 * 1024
        sample = {
            "timestamp": timestamp(now),
            "timestampUnix": int(now),
            "cpuCount": max(1, round(self.settings.cpu_limit)),
            "cpuUsedPct": 0.0,
            "memUsed": 0,
            "memTotal": self.settings.memory_limit_mb * mib,
            "memCache": 0,
            "diskUsed": 0,
            "diskTotal": self.settings.disk_limit_mb * mib,
        }
        return JSONResponse([sample])


def metadata_of(info: SessionInfo) -> dict[str, str]:
    try:
        value = json.loads(info.labels.get(METADATA) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _now() -> float:
    import time

    return time.time()


async def _json(request: Request) -> dict[str, Any]:
    raw = await gather(
        request.stream(), MAX_BODY, lambda: BadRequest(f"the body is larger than {MAX_BODY} bytes")
    )
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _seconds(value: Any, default: int | None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BadRequest("timeout must be a number of seconds")
    return max(1, int(value))


def _strings(value: Any, name: str, most: int, longest: int) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"{name} must map strings to strings")
    if len(value) > most:
        raise BadRequest(f"{name} has more than {most} entries")
    if any(len(k) > MAX_KEY or len(v) > longest for k, v in value.items()):
        raise BadRequest(f"{name}: a key over {MAX_KEY} or a value over {longest} characters")
    return value


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDKs send `metadata=urlencode({quote(k): quote(v)})`: once the query is decoded,
    each key and value is still percent-encoded once."""
    if not raw:
        return {}
    return {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}


def _page_size(raw: str | None) -> int:
    if raw is None:
        return MAX_PAGE
    if not raw.isdigit() or int(raw) < 1:
        raise BadRequest("limit must be a positive integer")
    return min(MAX_PAGE, int(raw))


def _token(session_id: str) -> str:
    return base64.urlsafe_b64encode(session_id.encode()).decode()


def _cursor(raw: str | None, found: list[SessionInfo]) -> int:
    if not raw:
        return 0
    try:
        session_id = base64.urlsafe_b64decode(raw.encode()).decode()
    except ValueError:
        raise BadRequest("nextToken is not one this server gave") from None
    for at, info in enumerate(found):
        if info.id == session_id:
            return at
    return len(found)  # that sandbox is gone: nothing after it is known; the listing ends
