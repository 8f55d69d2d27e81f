"""Routes grouped by path, so a 405 (and OPTIONS) names every method of the path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

Endpoint = Callable[[Request], Awaitable[Response]]


def grouped_routes(table: list[tuple[str, str, Endpoint]]) -> list[Route]:
    """One route per path serving all its methods: a 405 (or OPTIONS) names every one of them."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    for path, method, endpoint in table:
        by_path.setdefault(path, {})[method] = endpoint
    return [Route(path, _dispatch(methods), methods=[*methods, "OPTIONS"])
            for path, methods in by_path.items()]  # fmt: skip


def _dispatch(methods: dict[str, Endpoint]) -> Endpoint:
    allow = ", ".join(sorted({*methods, "OPTIONS", *(["HEAD"] if "GET" in methods else [])}))

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        if method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": allow})
        return await methods[method](request)

    return endpoint
