"""Trusted proxies: which peers' headers (an authenticated user, say) the server believes."""

from __future__ import annotations

import ipaddress

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
