"""The web UI's routes: the page at `/`, the API reference at `/docs`, files under `/ui/`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbank.config import Settings
from sandbank.http.proxies import is_trusted, parse_networks

STATIC = Path(__file__).parent / "static"


def origin_of(url: str) -> str | None:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def csp(settings: Settings) -> str:
    """Only the page's own scripts and styles; images from here or blobs it made; no forms."""
    stores = [settings.s3_endpoint_url, *settings.web_storage_origins.split(",")]
    extra = sorted({o for o in map(origin_of, stores) if o})
    connect = " ".join(["'self'", *extra])
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
        f"connect-src {connect}; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    )


def security_headers(policy: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        # Revalidate each time (ETag): a new server version's files are picked up at once.
        "Cache-Control": "no-cache",
    }


class SecurityHeaders:
    """Adds the page's security headers to every response of the wrapped app."""

    def __init__(self, app: ASGIApp, headers: dict[str, str]) -> None:
        self.app = app
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def site(settings: Settings) -> list[BaseRoute]:
    """`/` and `/ui/...` only: a catch-all mount would shadow the APIs' 405s with 404s."""
    headers = security_headers(csp(settings))

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=headers)

    proxies = parse_networks(settings.trusted_proxies)
    # The OpenAPI documents served on this listener, for the reference page.
    documents = ["openapi.json"] if settings.exec_api == "on" else []
    documents.append("api/openapi.json")
    header = settings.trusted_user_header.strip()

    async def config(request: Request) -> Response:
        """What the page needs before its first API call: whether to ask for a key (so it never
        provokes a 403 to find out), and the sessions' time to live (creation = ttl - it)."""
        client = request.client.host if request.client else None
        proxied = bool(header and request.headers.get(header) and is_trusted(client, proxies))
        body = {
            "sign_in": not proxied,
            "session_ttl_seconds": settings.session_ttl_seconds,
            "documents": documents,
        }
        return JSONResponse(body, headers=headers)

    async def reference(request: Request) -> Response:
        return FileResponse(STATIC / "reference.html", headers=headers)

    files = SecurityHeaders(StaticFiles(directory=STATIC), headers)
    return [
        Route("/", page, methods=["GET", "HEAD"]),
        Route("/ui/config.json", config, methods=["GET"]),
        Route("/docs", reference, methods=["GET", "HEAD"]),
        Mount("/ui", app=files, name="web"),
    ]
