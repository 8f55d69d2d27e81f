"""GET /metrics: the Prometheus exposition, behind a scraper's token or the API's tokens."""

from __future__ import annotations

import hmac
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from ..errors import Unauthorized
from ..metrics import Metrics
from .auth import TokenAuth, bearer


def endpoint(metrics: Metrics, auth: TokenAuth, metrics_token: str = "") -> Any:
    """GET /metrics: with SANDBANK_METRICS_TOKEN, that token (a scraper's, which runs no code)
    or one of the code-execution API's tokens; without it, the API's tokens when there are any."""
    expected = metrics_token.encode()

    async def serve(request: Request) -> Response:
        given = bearer(request.headers.get("authorization"))
        if not (expected and given is not None and hmac.compare_digest(given.encode(), expected)):
            if expected and not auth.enabled:
                raise Unauthorized(
                    "a bearer token is required: Authorization: Bearer <SANDBANK_METRICS_TOKEN>"
                )
            auth.tenant(request.headers.get("authorization"))  # Unauthorized (401) without one
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return serve
