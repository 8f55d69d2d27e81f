"""Network policies: allow-lists of names and addresses with ports, matching and clamping.

An entry is `NAME:PORT`, `*.SUFFIX:PORT`, `ADDRESS:PORT` or `CIDR:PORT` (IPv6 in brackets),
where PORT is a number or `*`. A policy with no entries is `none`: no network at all.
Addresses outside the public internet (loopback, private, link-local, unique-local, multicast,
cloud metadata, ...) are never reached unless an operator lists them explicitly.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
# Public-looking addresses that reach a cloud's metadata or control plane.
METADATA = tuple(
    ipaddress.ip_network(n)
    for n in ("169.254.169.254/32", "fd00:ec2::254/128", "100.100.100.200/32", "168.63.129.16/32")
)
# IPv6 prefixes that carry an IPv4 address onward (NAT64, 6to4, Teredo).
TUNNELS = tuple(
    ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32")
)


class PolicyError(ValueError):
    """An allow-list entry that does not parse."""


def normalize_name(host: str) -> str | None:
    """A host name in canonical form (lower case, no trailing dot), or None if it is not one.

    Anything an IPv4 parser would take as an address (`127.1`, `0x7f.1`, `2130706433`) is not
    a name, so a direct-IP request cannot pass as one.
    """
    name = host.lower().removesuffix(".")
    if not 0 < len(name) <= 253 or not name.isascii():
        return None
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels):
        return None
    try:
        socket.inet_aton(name)
        return None
    except OSError:
        pass
    if labels[-1].isdigit():
        return None
    return name


def parse_address(host: str) -> IPAddress | None:
    """An IP literal (`1.2.3.4`, `[::1]`, `::1`), or None."""
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def is_public(ip: IPAddress) -> bool:
    """Whether an address is on the public internet and no metadata endpoint."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return is_public(ip.ipv4_mapped)
        if any(ip in net for net in TUNNELS):
            return False
    if any(ip in net for net in METADATA):
        return False
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


@dataclass(frozen=True)
class Ports:
    """One port, or every port (`*`)."""

    port: int | None  # None: any

    @classmethod
    def parse(cls, text: str, entry: str) -> Ports:
        if text == "*":
            return cls(None)
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise PolicyError(f"{entry!r}: the port must be 1-65535 or *")
        return cls(int(text))

    def allows(self, port: int) -> bool:
        return self.port is None or self.port == port

    def covers(self, other: Ports) -> bool:
        return self.port is None or self.port == other.port

    def __str__(self) -> str:
        return "*" if self.port is None else str(self.port)


@dataclass(frozen=True)
class NameRule:
    name: str  # exact name, or the suffix of a `*.` pattern
    wildcard: bool
    ports: Ports

    def matches(self, name: str) -> bool:
        if self.wildcard:
            return name.endswith("." + self.name)
        return name == self.name

    def allows(self, name: str, port: int) -> bool:
        return self.ports.allows(port) and self.matches(name)

    def covers(self, other: NameRule) -> bool:
        if not self.ports.covers(other.ports):
            return False
        if other.wildcard:
            return self.wildcard and (other.name == self.name or self.matches(other.name))
        return self.matches(other.name)

    def __str__(self) -> str:
        return f"{'*.' if self.wildcard else ''}{self.name}:{self.ports}"


@dataclass(frozen=True)
class AddressRule:
    network: IPNetwork
    ports: Ports

    def allows(self, ip: IPAddress, port: int) -> bool:
        return self.ports.allows(port) and ip in self.network

    def covers(self, other: AddressRule) -> bool:
        return (
            self.ports.covers(other.ports)
            and self.network.version == other.network.version
            and other.network.subnet_of(self.network)  # type: ignore[arg-type]
        )

    def __str__(self) -> str:
        net = self.network
        host = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
        return f"[{host}]:{self.ports}" if net.version == 6 else f"{host}:{self.ports}"


Rule = NameRule | AddressRule


def parse_rule(entry: str) -> Rule:
    text = entry.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise PolicyError(f"{entry!r}: expected HOST:PORT (PORT a number or *)")
    ports = Ports.parse(port, entry)
    if host.startswith("["):
        if not host.endswith("]"):
            raise PolicyError(f"{entry!r}: unbalanced brackets")
        host = host[1:-1]
    if "/" in host or parse_address(host) is not None:
        try:
            net = ipaddress.ip_network(host, strict=True)
        except ValueError as e:
            raise PolicyError(f"{entry!r}: {e}") from None
        return AddressRule(net, ports)
    wildcard = host.startswith("*.")
    name = normalize_name(host[2:] if wildcard else host)
    if name is None:
        raise PolicyError(f"{entry!r}: not a host name, `*.suffix` pattern, address or CIDR")
    return NameRule(name, wildcard, ports)


@dataclass(frozen=True)
class NetworkPolicy:
    """What one session may reach. The empty policy is `none`."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> NetworkPolicy:
        rules: list[Rule] = []
        for entry in entries:
            if entry.strip():
                rule = parse_rule(entry)
                if rule not in rules:
                    rules.append(rule)
        return cls(tuple(rules))

    @classmethod
    def from_setting(cls, text: str) -> NetworkPolicy:
        """A comma-separated setting; `none` or empty is no network."""
        if text.strip().lower() in ("", "none"):
            return cls()
        return cls.parse(text.split(","))

    @property
    def is_none(self) -> bool:
        return not self.rules

    def allows_name(self, name: str, port: int) -> bool:
        return any(isinstance(r, NameRule) and r.allows(name, port) for r in self.rules)

    def allows_address(self, ip: IPAddress, port: int) -> bool:
        """Whether the address is listed explicitly (direct IP, or a non-public destination)."""
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(isinstance(r, AddressRule) and r.allows(ip, port) for r in self.rules)

    def clamp(self, ceiling: NetworkPolicy) -> NetworkPolicy:
        """The entries of this (requested) policy that `ceiling` covers: never wider than it."""
        kept = [r for r in self.rules if any(_covers(c, r) for c in ceiling.rules)]
        return NetworkPolicy(tuple(kept))

    def union(self, other: NetworkPolicy) -> NetworkPolicy:
        return NetworkPolicy(self.rules + tuple(r for r in other.rules if r not in self.rules))

    def entries(self) -> list[str]:
        return [str(r) for r in self.rules]

    def __str__(self) -> str:
        return ", ".join(self.entries()) if self.rules else "none"


def _covers(ceiling: Rule, rule: Rule) -> bool:
    if isinstance(ceiling, NameRule) and isinstance(rule, NameRule):
        return ceiling.covers(rule)
    if isinstance(ceiling, AddressRule) and isinstance(rule, AddressRule):
        return ceiling.covers(rule)
    return False
