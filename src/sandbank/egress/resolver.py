"""Name resolution for the proxy: the system's, or fixed answers that tests point at loopback."""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

from .policy import IPAddress, PolicyError, normalize_name, parse_address

RESOLVE_TIMEOUT = 5.0


class Resolver(Protocol):
    """Turns a host name into addresses (the proxy resolves; sandboxes never do)."""

    async def resolve(self, name: str, port: int) -> list[IPAddress]:
        """The addresses of `name` (possibly empty); OSError when the lookup fails."""
        ...


class SystemResolver:
    """The machine's own resolver (getaddrinfo in a thread)."""

    async def resolve(self, name: str, port: int) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(RESOLVE_TIMEOUT):
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        found: list[IPAddress] = []
        for *_, sockaddr in infos:
            ip = parse_address(str(sockaddr[0]).split("%", 1)[0])
            if ip is not None and ip not in found:
                found.append(ip)
        return found


class FixedResolver:
    """Answers from a table (`name=address` pairs): names not in it do not resolve.

    For tests only: it lets a test point a listed name at a loopback upstream without DNS.
    """

    def __init__(self, table: dict[str, list[IPAddress]]) -> None:
        self.table = table

    @classmethod
    def parse(cls, text: str) -> FixedResolver:
        table: dict[str, list[IPAddress]] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            name, _, addr = item.partition("=")
            norm, ip = normalize_name(name.strip()), parse_address(addr.strip())
            if norm is None or ip is None:
                raise PolicyError(f"{item!r}: expected NAME=ADDRESS")
            table.setdefault(norm, []).append(ip)
        return cls(table)

    async def resolve(self, name: str, port: int) -> list[IPAddress]:
        if name not in self.table:
            raise OSError(f"{name} does not resolve")
        return list(self.table[name])
