"""The operator's endpoint: the code-execution sessions a server holds, behind an admin token.

Sessions live in the server's memory, one tenant per exec token, so only the running server can
list them. The listing names no capability: a session id is cut to a prefix (enough to tell
sessions apart, not to call one), a tenant is the short hash the server already keys it by.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..config import Settings
from ..errors import NotFound, Unauthorized
from ..http.auth import bearer
from ..sandbox.local import LocalSandboxes

ID_PREFIX = 14  # the server instance (6) and 8 random characters
TENANT_PREFIX = 8


def sessions_endpoint(local: LocalSandboxes, settings: Settings) -> Any:
    token = settings.admin_token.get_secret_value().encode()

    async def sessions(request: Request) -> Response:
        if not token:
            raise NotFound("the admin endpoints are off: set SANDBANK_ADMIN_TOKEN")
        given = bearer(request.headers.get("authorization")) or ""
        if not hmac.compare_digest(given.encode(), token):
            raise Unauthorized("the admin token is required: Authorization: Bearer <token>")
        now = time.time()
        listing = [
            {
                "session": s.id[:ID_PREFIX],
                "tenant": s.tenant[:TENANT_PREFIX] or "-",
                "created_at": s.created_at,
                "last_activity_at": s.last_activity_at,
                "state": "busy" if s.inflight else "idle",
                "idle_seconds": round(now - s.last_activity_at, 1),
                "idle_timeout_seconds": s.idle_timeout,
                "max_lifetime_seconds": s.max_lifetime,
            }
            for s in sorted(local.sessions(), key=lambda s: s.created_at, reverse=True)
        ]
        return JSONResponse({"sessions": listing, "pool_ready": local.status()["pool_ready"]})

    return sessions
