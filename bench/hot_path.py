"""What each request's path costs in its own parts, in this process; prints medians in us.

    .venv/bin/python bench/hot_path.py [--rounds 7] [--calls 20000]

- the access middleware (request id, metrics, the access line skipped at `warning`) around an
  app that answers at once, against that app alone;
- one access line written at `info` (the default level), formatted as `sandbank serve` does,
  into a file;
- finding a bearer token's tenant among 1, 1,000 and 10,000 configured tokens.
Each is timed in CPU time over `--calls` calls, `--rounds` times; the median round is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from starlette.routing import Route

from sandbank import logs
from sandbank.config import Settings
from sandbank.http.access import AccessMiddleware
from sandbank.http.auth import TokenAuth
from sandbank.metrics import Metrics

HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"2")]


def per_call_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    figures = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        figures.append((time.process_time() - t0) * 1e6 / calls)
    return statistics.median(figures)


def middleware(calls: int, rounds: int) -> tuple[float, float]:
    route = Route("/health", lambda request: None)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = route
        await send({"type": "http.response.start", "status": 200, "headers": list(HEADERS)})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        pass

    wrapped = AccessMiddleware(app, Metrics())

    def scope() -> dict[str, Any]:
        return {"type": "http", "path": "/health", "method": "GET", "root_path": "", "headers": []}

    async def timed(target: Any) -> float:
        figures = []
        for _ in range(rounds):
            t0 = time.process_time()
            for _ in range(calls):
                await target(scope(), receive, send)
            figures.append((time.process_time() - t0) * 1e6 / calls)
        return statistics.median(figures)

    async def both() -> tuple[float, float]:
        return await timed(wrapped), await timed(app)

    return asyncio.run(both())


def access_line(calls: int, rounds: int) -> float:
    saved = sys.stderr
    with tempfile.TemporaryFile("w") as sink:
        sys.stderr = sink
        try:
            logs.setup(Settings(log_level="info"))
            log = logging.getLogger("sandbank.access")
            # As the access middleware logs it: its fields beside the message.
            extra = {"fields": {"method": "POST", "path": "/sessions/x/exec", "status": 200}}

            def line() -> None:
                log.info("%s %s %d %.1f ms", "POST", "/sessions/x/exec", 200, 0.6, extra=extra)

            return per_call_us(line, calls, rounds)
        finally:
            sys.stderr = saved
            logging.getLogger().handlers.clear()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    with_mw, bare = middleware(args.calls, args.rounds)
    row("access middleware, per request", with_mw - bare)
    row("an access line at info, into a file", access_line(args.calls, args.rounds))
    for count in (1, 1000, 10000):
        tokens = [secrets.token_urlsafe(32) for _ in range(count)]
        find = functools.partial(TokenAuth(tokens).tenant, f"Bearer {tokens[count // 2]}")
        row(f"a token's tenant among {count:,} tokens", per_call_us(find, args.calls, args.rounds))


def row(label: str, us: float) -> None:
    print(f"{label:<44} {us:7.1f} us")


if __name__ == "__main__":
    main()
