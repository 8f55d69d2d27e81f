"""Which nodes a front knows: a static list or a DNS name, refreshed, each health-checked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..config import Settings
from ..errors import SandbankError

log = logging.getLogger(__name__)
CAPACITY_PATH = "/fleet/capacity"
MISSES_TO_LOSE = 2
START_TRIES = 3  # capacity rounds a starting front gives a node before it serves without it


@dataclass(frozen=True)
class Report:
    """A node's answer on its capacity endpoint."""

    name: str
    instance: str
    version: str
    sessions: int
    max_sessions: int
    idle: int
    inflight: int
    memory_available_bytes: int
    draining: bool
    isolations: tuple[str, ...] = ()  # what it offers, its default first (older nodes: unsaid)
    adopts: bool = True  # keeps snapshots, so it can take a moved session (fleet/moves.py)

    @classmethod
    def parse(cls, body: Any) -> Report:
        return cls(
            name=str(body["name"]),
            instance=str(body.get("instance", "")),
            version=str(body["version"]),
            sessions=int(body["sessions"]),
            max_sessions=max(1, int(body["max_sessions"])),
            idle=int(body["idle"]),
            inflight=int(body["inflight"]),
            memory_available_bytes=int(body["memory_available_bytes"]),
            draining=bool(body["draining"]),
            isolations=tuple(str(x) for x in body.get("isolations") or ()),
            adopts=bool(body.get("adopts", True)),
        )


@dataclass
class Member:
    name: str
    url: str
    up: bool = False
    report: Report | None = None
    placed: int = 0  # sessions this front placed here since the last report, less those it ended
    # Calls in flight to it, cancelled (and answered "gone") the moment it is declared out.
    calls: set[asyncio.Task[Any]] = field(default_factory=set)
    lost_calls: set[asyncio.Task[Any]] = field(default_factory=set)
    checked_at: float = 0.0
    missed: int = 0  # health checks missed in a row
    instance: str = ""  # the node process's incarnation, from its reports and CreateSession
    ever_up: bool = False  # answered this front once: until then, silence is no loss

    @property
    def lost(self) -> bool:
        """Known to be out: it answered this front before and does no longer."""
        return self.ever_up and not self.up

    def used(self) -> int:
        return (self.report.sessions if self.report else 0) + self.placed

    def released(self) -> None:
        """A session here was ended through this front: out of the count until the next report.

        Without it, sessions ended just after a report still fill the node in this front's
        view, and a client creating again at once is told every node is full.
        """
        self.placed = max(-(self.report.sessions if self.report else 0), self.placed - 1)

    def offers(self, isolation: str | None) -> bool:
        """Whether a session asking for `isolation` may go there (None: any; a node that does
        not say what it offers is asked, and answers 422 if it does not)."""
        r = self.report
        return isolation is None or r is None or not r.isolations or isolation in r.isolations

    def may_take(self) -> bool:
        """Up and not draining: it may take a session even when its last report says full."""
        r = self.report
        return self.up and r is not None and not r.draining

    def accepting(self) -> bool:
        r = self.report
        if not self.up or self.missed or r is None or r.draining:
            return False
        return self.used() < r.max_sessions or r.idle > self.placed


def parse_static(spec: str) -> list[tuple[str, str]]:
    nodes = []
    for item in spec.split(","):
        if not item.strip():
            continue
        name, sep, url = item.strip().partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise SandbankError(f"SANDBANK_FLEET_NODES: expected name=url, got {item!r}")
        nodes.append((name.strip(), url.strip().rstrip("/")))
    return nodes


class Membership:
    """The nodes a front knows, their last reports and health, refreshed periodically."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self.static = parse_static(settings.fleet_nodes)
        if settings.fleet_dns:
            host, _, port = settings.fleet_dns.rpartition(":")
            if not host or not port.isdigit():
                raise SandbankError("SANDBANK_FLEET_DNS: expected host:port")
            self.dns: tuple[str, int] | None = (host, int(port))
        else:
            self.dns = None
        if not self.static and self.dns is None:
            raise SandbankError("a front needs SANDBANK_FLEET_NODES or SANDBANK_FLEET_DNS")
        self.members: dict[str, Member] = {}
        self._headers = {"Authorization": f"Bearer {settings.fleet_token.get_secret_value()}"}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self) -> None:
        """Learn the nodes before serving; a node silent for `START_TRIES` rounds is out.

        A front that has just started knows no node's history: one slow capacity report (a
        loaded machine, a node busy starting sandboxes) would put that node out at once, and
        every session on it would be answered "gone" through this front while it is alive.
        """
        for attempt in range(START_TRIES):
            if attempt:
                await asyncio.sleep(self.settings.fleet_refresh_seconds)
            await self.refresh()
            if self.members and all(m.up for m in self.members.values()):
                break
        self._task = asyncio.create_task(self._forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def up(self) -> list[Member]:
        return [m for m in self.members.values() if m.up]

    def suspect(self, member: Member, reason: str) -> None:
        """A call to it failed at the transport: out at once, re-checked at the next refresh."""
        member.ever_up = True  # heard from or not, it is known to be out now
        self._down(member, reason)
        self._wake.set()

    def _down(self, member: Member, reason: str) -> None:
        if member.up:
            log.warning("fleet node %s (%s) is out: %s", member.name, member.url, reason)
        member.up = False
        for task in member.calls:
            member.lost_calls.add(task)
            task.cancel()

    def _missed(self, member: Member) -> None:
        """One missed check: no new sessions there; two in a row: out (a slow answer under
        load is not a lost machine, but a cut-off one is out within two checks)."""
        member.missed += 1
        if member.missed >= MISSES_TO_LOSE or not member.up:
            self._down(member, f"{member.missed} capacity reports missed")

    async def _forever(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.fleet_refresh_seconds)
            self._wake.clear()
            try:
                await self.refresh()
            except Exception:
                log.exception("refreshing the fleet's members failed")

    async def _targets(self) -> list[tuple[str | None, str]]:
        targets: list[tuple[str | None, str]] = [(n, u) for n, u in self.static]
        if self.dns is not None:
            host, port = self.dns
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
                )
            except OSError as e:
                log.warning("resolving the fleet's DNS name %s failed: %s", host, e)
                # Keep what was known: a DNS hiccup must not empty the fleet.
                return targets + [(m.name, m.url) for m in self.members.values()]
            for addr in sorted({info[4][0] for info in infos}):
                targets.append((None, f"http://{addr}:{port}"))
        return targets

    async def refresh(self) -> None:
        targets = await self._targets()
        results = await asyncio.gather(*(self._probe(url) for _, url in targets))
        seen: set[str] = set()
        for (name, url), report in zip(targets, results, strict=True):
            if name is None:
                if report is None:
                    # A DNS record that does not answer: whichever member had that address.
                    for m in self.members.values():
                        if m.url == url and m.name not in seen:
                            self._missed(m)
                            seen.add(m.name)
                    continue
                name = report.name
            if name in seen:
                continue
            seen.add(name)
            member = self.members.get(name)
            if member is None:
                member = self.members[name] = Member(name, url)
            member.url = url
            if report is None:
                self._missed(member)
                continue
            if not member.up:
                log.info("fleet node %s (%s) is in", name, url)
            member.up, member.report, member.placed, member.missed = True, report, 0, 0
            member.ever_up = True
            member.instance = report.instance
            member.checked_at = time.monotonic()
        for name in list(self.members):
            if name not in seen:
                self._down(self.members.pop(name), "no longer listed")

    async def _probe(self, url: str) -> Report | None:
        timeout = self.settings.fleet_connect_timeout_seconds
        try:
            r = await self.client.get(
                url + CAPACITY_PATH, headers=self._headers, timeout=httpx.Timeout(timeout)
            )
            if r.status_code != 200:
                return None
            return Report.parse(r.json())
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
