"""Who is calling: an API key (`Authorization: Bearer`), or a trusted proxy's user header."""

from __future__ import annotations

import ipaddress

from starlette.requests import Request

from sandbank.config import Settings
from sandbank.errors import Forbidden
from sandbank.store import Store, User

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(spec: str) -> list[Network]:
    return [
        ipaddress.ip_network(part.strip(), strict=False) for part in spec.split(",") if part.strip()
    ]


def is_trusted(address: str | None, networks: list[Network]) -> bool:
    if not address or not networks:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # e.g. a unix socket peer
    return any(ip in net for net in networks)


class Identity:
    """Who is calling the interpreter API."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.header = settings.trusted_user_header.strip().lower()
        self.proxies = parse_networks(settings.trusted_proxies)

    async def user(self, request: Request) -> User:
        """The authenticated user; `Forbidden` (403, as the spec says) otherwise."""
        client = request.client.host if request.client else None
        if self.header and is_trusted(client, self.proxies):
            claimed = request.headers.get(self.header)
            if claimed:
                # Proxies usually know the user's name; the id is accepted too.
                user = await self.store.get_user(claimed) or await self.store.get_user_by_id(
                    claimed
                )
                if user is None:
                    raise Forbidden(f"the proxy's user {claimed!r} is not a user here")
                return user
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Forbidden("an API key is required: Authorization: Bearer <key>")
        user = await self.store.authenticate(secret.strip())
        if user is None:
            raise Forbidden("the API key was not accepted")
        return user
