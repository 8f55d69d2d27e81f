"""Driving the MCP door with the official client: over HTTP (an ASGI app or a real server) or
stdio, in either protocol era."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ImageContent, Implementation, ResourceLink, TextContent

from tests.support import SANDBANK

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
# mode of `Client` -> the version it ends up speaking
ERAS = {"auto": MODERN, "legacy": LEGACY}


@contextlib.asynccontextmanager
async def http_client(
    url: str,
    token: str | None = None,
    *,
    mode: str = "auto",
    name: str = "sandbank-tests",
    app: Any = None,
    **client: Any,
) -> AsyncIterator[Client]:
    """An MCP client over streamable HTTP, with a bearer token when given; `app` drives an ASGI
    app in this process instead of the network."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx2.ASGITransport(app=app) if app is not None else None
    http = httpx2.AsyncClient(
        headers=headers, transport=transport, timeout=httpx2.Timeout(30, read=120)
    )
    async with http:  # the SDK never closes a client it did not make
        mcp = Client(
            streamable_http_client(url, http_client=http),
            mode=mode,
            client_info=Implementation(name=name, version="1.0"),
            **client,
        )
        async with mcp:
            yield mcp


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def images(result: CallToolResult) -> list[ImageContent]:
    return [c for c in result.content if isinstance(c, ImageContent)]


def links(result: CallToolResult) -> list[ResourceLink]:
    return [c for c in result.content if isinstance(c, ResourceLink)]


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: a refused connect arrives as one."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


@contextlib.asynccontextmanager
async def stdio(
    args: list[str], env: dict[str, str], mode: str, log: Path
) -> AsyncIterator[Client]:
    """`sandbank ARGS` as an MCP server on stdio, its log appended to `log`."""
    params = StdioServerParameters(command=SANDBANK, args=args, env=env)
    with log.open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
            yield client
