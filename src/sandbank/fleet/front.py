"""The front role: the code-execution protocol at the root, each call proxied to its node.

Stateless: a session id names its node (signed, see `ids`), so any replica routes any call.
Bodies stream through in both directions; a node that is gone answers a clear 404 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..config import Settings, forced_isolation, parse_tenant_isolation
from ..errors import (
    AtCapacity,
    ProtocolError,
    SandbankError,
    SandboxError,
    SessionNotFound,
    Unprocessable,
)
from ..http.bodies import read_body
from ..protocol.client import Body
from ..protocol.http1 import Http1Client, Reply, TransportFailed
from .ids import SessionIds
from .membership import Member, Membership
from .moves import move_key
from .node import INSTANCE_HEADER, INSTANCE_LENGTH
from .placement import choose

log = logging.getLogger(__name__)
HTTP_SLACK_S = 15.0  # a node answers a call by its deadline + 5 s; this covers the trip too
CREATE_BODY_MAX = 64 * 1024
MAX_EXEC_BODY = 16 * 1024 * 1024
PLACEMENT_TRIES = 3
MOVED_CACHE = 10_000  # where moved sessions were found last (any front finds them again)
# What passes from a client to a node, and back.
REQUEST_HEADERS = ("content-type", "content-length", "accept")
RESPONSE_HEADERS = (
    "content-type",
    "content-length",
    "content-disposition",
    "content-security-policy",
    "x-content-type-options",
    "cache-control",
    "retry-after",
)


class NodeGone(Exception):
    """The transport to a node failed: it crashed, restarted or is cut off."""


class Fleet:
    """A front's view of the fleet: the membership, connections to nodes, the id signer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # httpx logs every request at INFO: one line per health check is noise, not news.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.token = settings.fleet_token.get_secret_value()
        if not self.token:
            raise SandbankError("a front needs SANDBANK_FLEET_TOKEN (the same on fronts and nodes)")
        # Health checks and capacity reports (off the hot path), straight to the nodes as the
        # calls go: a proxy the environment names (for the model's API, say) is not the way.
        self.probes = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.fleet_connect_timeout_seconds), trust_env=False
        )
        self.membership = Membership(settings, self.probes)
        self.ids = SessionIds(self.token)
        self.tenant_isolation = parse_tenant_isolation(settings.tenant_isolation)
        self.rng = random.Random()  # noqa: S311 - spreading load, not a secret
        self.terminating = False
        self.call_timeout = settings.exec_timeout_max + HTTP_SLACK_S
        self._clients: dict[str, Http1Client] = {}
        self._auth = f"Bearer {self.token}"
        # A moved session's key -> (node, its instance, the node's id): a hint, checked on use.
        self._moved: dict[str, tuple[str, str, str]] = {}

    async def start(self) -> None:
        await self.membership.start()

    async def close(self) -> None:
        await self.membership.close()
        await self.probes.aclose()
        for client in self._clients.values():
            client.close()

    def _client(self, member: Member) -> Http1Client:
        client = self._clients.get(member.url)
        if client is None:
            client = Http1Client(member.url, self.settings.fleet_connect_timeout_seconds)
            self._clients[member.url] = client
        return client

    async def send(
        self,
        member: Member,
        method: str,
        target: str,
        headers: dict[str, str],
        body: Body = None,
        stream: bool = False,
    ) -> Reply:
        """Send to a node; `NodeGone` as soon as the transport fails or the node is declared out.

        A node this front has not heard from yet (it has just started, its first reports were
        slow) is tried: only the transport can say it is gone.
        """
        if member.lost:
            raise NodeGone
        headers["authorization"] = self._auth
        task = asyncio.current_task()
        assert task is not None
        member.calls.add(task)
        try:
            async with asyncio.timeout(self.call_timeout):
                return await self._client(member).request(method, target, headers, body, stream)
        except TimeoutError:
            raise SandboxError(f"fleet node {member.name} did not answer in time") from None
        except asyncio.CancelledError:
            if task in member.lost_calls:  # cancelled by the membership: the node is out
                member.lost_calls.discard(task)
                task.uncancel()
                raise NodeGone from None
            raise
        except TransportFailed as e:
            member.calls.discard(task)  # out of the calls the node's loss cancels
            self.membership.suspect(member, str(e))
            raise NodeGone from None
        finally:
            member.calls.discard(task)

    async def route(self, tenant: str, public: str) -> tuple[Member, str]:
        """(its node, the node's own id) of a session; 404 for an id the fleet did not sign.

        The node the id names holds it while that node is up, the same instance and not
        draining. Otherwise the session may have moved (moves.py): to the node a front found
        it on before (cached here), or one that adopts it now; else, while the named (or last)
        node still runs, there (a drain's grace); else a clear 404: its state is lost.
        """
        name, tagged = self.ids.verify(tenant, public)
        instance, local = tagged[:INSTANCE_LENGTH], tagged[INSTANCE_LENGTH:]
        member = self.membership.get(name)
        key = move_key(name, tagged)
        cached = self._moved.get(key) if self._moved else None
        if cached is None and _holds(member, instance):
            assert member is not None
            return member, local
        last: tuple[Member, str] | None = None
        if member is not None and _running(member, instance):
            last = (member, local)
        if cached is not None:
            # Found moved before (its node may have been cut off, and be back): it is there.
            holder = self.membership.get(cached[0])
            if _holds(holder, cached[1]):
                assert holder is not None
                return holder, cached[2]
            if holder is not None and _running(holder, cached[1]):
                last = (holder, cached[2])
        # A node back under its name (restarted) may find it in its own data directory; with no
        # holder running, a checkpoint it left may be taken.
        home = member if member is not None and member.accepting() else None
        found = await self._find_moved(key, home, lost=last is None)
        if found is not None:
            return found
        if last is not None:
            return last
        if member is not None and member.instance and instance != member.instance:
            raise gone(public, name, "restarted")
        raise gone(public, name)

    async def _find_moved(
        self, key: str, home: Member | None, lost: bool
    ) -> tuple[Member, str] | None:
        """Ask the node the key belongs to (rendezvous over the accepting nodes: the same on
        every front), then `home`, to adopt the moved session; failing that, whether another
        node has it. `AtCapacity` (retry) while another node is adopting it."""
        up = self.membership.up()
        owner = rendezvous([m for m in up if m.accepting() and _adopts(m)], key)
        claimers = [m for m in (owner, home) if m is not None]
        if len(claimers) == 2 and claimers[0] is claimers[1]:
            claimers.pop()
        found: tuple[Member, str, str] | bool | None = None
        for claimer in claimers:
            found = await self._adopt(claimer, key, claim=True, lost=lost)
            if found is not None:
                break
        if not isinstance(found, tuple):
            others = [m for m in up if all(m is not c for c in claimers)]
            asked = await asyncio.gather(*(self._adopt(m, key, False, lost) for m in others))
            found = next((f for f in asked if isinstance(f, tuple)), found)
        if found is True:
            raise AtCapacity("the session is moving to another node: retry shortly", retry_after=1)
        if not isinstance(found, tuple):
            return None
        member, local, instance = found
        if len(self._moved) >= MOVED_CACHE:
            self._moved.pop(next(iter(self._moved)))
        self._moved[key] = (member.name, instance, local)
        return member, local

    async def _adopt(
        self, member: Member, key: str, claim: bool, lost: bool
    ) -> tuple[Member, str, str] | bool | None:
        """(the node, its id, its instance); True when the node is busy moving it (503)."""
        body = json.dumps({"key": key, "claim": claim, "lost": lost}).encode()
        headers = {"content-type": "application/json"}
        try:
            r = await self.send(member, "POST", "/fleet/adopt", headers, body)
        except NodeGone:
            return None
        if r.status == 503:
            return True
        if r.status != 200:
            if r.status != 404:
                log.warning("fleet node %s answered an adoption with %d", member.name, r.status)
            return None
        try:
            handle = json.loads(r.body)
            return member, str(handle["session_id"]), str(handle["instance"])
        except (ValueError, KeyError, TypeError):
            raise ProtocolError(f"node {member.name} answered an adoption with no id") from None

    def isolation_for(self, tenant: str, asked: str | None) -> str | None:
        """The isolation a new session of `tenant` must have: the operator's rule for it (the
        nodes see no clients' tenants, so the front applies it), else the client's hint."""
        return forced_isolation(self.tenant_isolation, tenant, asked) or asked

    async def place(
        self,
        tenant: str,
        create: Callable[[Member], Awaitable[Reply]],
        prefer: str | None = None,
        isolation: str | None = None,
    ) -> tuple[Reply, dict[str, Any]]:
        """Create a session on a node with room (power of two choices, a few tries) that offers
        `isolation`; the node's answer and, when it is 201, its handle with the fleet's signed
        id. `prefer`: a key whose own node (by rendezvous hashing, the same on every front) is
        tried first. `Unprocessable` when no node up offers the isolation."""
        up = self.membership.up()
        if up and not any(m.offers(isolation) for m in up):
            offered = sorted({i for m in up if m.report for i in m.report.isolations})
            raise Unprocessable(
                f"isolation {isolation!r} is not offered by any node of this fleet (they offer "
                f"{', '.join(repr(i) for i in offered)}); leave it out, or ask a fleet that does"
            )
        tried: set[str] = set()
        for _ in range(PLACEMENT_TRIES):
            member = None
            if prefer is not None and not tried:
                member = rendezvous(
                    [m for m in up if m.accepting() and m.offers(isolation)], prefer
                )
            if member is None:
                member = choose(
                    self.membership.up(), self.settings.fleet_sample, self.rng, tried, isolation
                )
            if member is None:
                break
            tried.add(member.name)
            try:
                r = await create(member)
            except NodeGone:
                continue
            if r.status == 503:
                continue  # full or draining since its last report: another node may take it
            if r.status != 201:
                return r, {}
            instance = r.headers.get(INSTANCE_HEADER.decode(), "")
            if len(instance) != INSTANCE_LENGTH:
                raise SandboxError(f"fleet node {member.name} did not name its instance")
            member.instance = instance  # it may have restarted since its last report
            handle = r.json()
            local = instance + handle["session_id"]
            handle["session_id"] = self.ids.sign(tenant, member.name, local)
            member.placed += 1
            return r, handle
        raise AtCapacity("every sandbox node is full or draining; retry shortly", retry_after=5)


def _adopts(member: Member) -> bool:
    """Keeps snapshots (a durable isolation, snapshots moved at its drain): it can adopt."""
    return member.report is None or member.report.adopts


def _running(member: Member, instance: str) -> bool:
    """Up and the same process as `instance` names (it may be draining)."""
    return not member.lost and (not member.instance or member.instance == instance)


def _holds(member: Member | None, instance: str) -> bool:
    """Holds the sessions `instance` made: the same process, up and not draining."""
    if member is None or not _running(member, instance):
        return False
    return member.report is None or not member.report.draining


def rendezvous(members: list[Member], key: str) -> Member | None:
    """The member `key` belongs to (highest random weight): stable while the members are."""
    return max(
        members,
        key=lambda m: hashlib.sha256(f"{m.name}\0{key}".encode()).digest(),
        default=None,
    )


def gone(
    public_id: str, node: str, why: str = "is unreachable (crashed or cut off)"
) -> SessionNotFound:
    return SessionNotFound(
        f"session {public_id!r} is gone: the machine holding it ({node}) {why} "
        "and its state is lost; create a new session"
    )


@contextlib.contextmanager
def reaching(public_id: str, member: Member) -> Iterator[None]:
    """Calls to the node holding session `public_id`: a lost node is that session `gone`."""
    try:
        yield
    except NodeGone:
        raise gone(public_id, member.name) from None


class FrontApi:
    """The six operations of the protocol and /health, over the fleet. `tenant` authenticates."""

    def __init__(self, fleet: Fleet, tenant: Callable[[str | None], str]) -> None:
        self.fleet = fleet
        self.tenant = tenant

    def routes(self) -> list[Route]:
        return [
            Route("/sessions", self.create_session, methods=["POST"]),
            Route("/sessions/{session_id}", self.destroy_session, methods=["DELETE"]),
            Route("/sessions/{session_id}/exec", self.execute, methods=["POST"]),
            Route("/sessions/{session_id}/files/list", self.list_files, methods=["GET"]),
            Route("/sessions/{session_id}/files", self.get_file, methods=["GET"]),
            Route("/sessions/{session_id}/files", self.put_file, methods=["POST"]),
            Route("/sessions/{session_id}/pause", self.pause_or_resume, methods=["POST"]),
            Route("/sessions/{session_id}/resume", self.pause_or_resume, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
        ]

    async def _route(self, request: Request) -> tuple[str, Member, str]:
        """(public id, its node, the node's own id); 404 for an id the fleet did not sign."""
        public = request.path_params["session_id"]
        tenant = self.tenant(request.headers.get("authorization"))
        member, local = await self.fleet.route(tenant, public)
        return public, member, local

    def _headers(self, request: Request) -> dict[str, str]:
        return {k: v for k in REQUEST_HEADERS if (v := request.headers.get(k)) is not None}

    @staticmethod
    def _target(path: str, request: Request) -> str:
        query = request.url.query
        return f"{path}?{query}" if query else path

    async def create_session(self, request: Request) -> Response:
        tenant = self.tenant(request.headers.get("authorization"))
        body = await read_body(request, CREATE_BODY_MAX)
        headers = self._headers(request)
        headers.pop("content-length", None)
        asked = _isolation_asked(body)
        isolation = self.fleet.isolation_for(tenant, asked)
        if isolation != asked:
            body = _with_isolation(body, isolation)

        def create(member: Member) -> Awaitable[Reply]:
            return self.fleet.send(member, "POST", "/sessions", dict(headers), body)

        reply, handle = await self.fleet.place(tenant, create, isolation=isolation)
        if reply.status != 201:
            return _copy(reply)
        return JSONResponse(handle, status_code=201)

    async def destroy_session(self, request: Request) -> Response:
        try:
            _, member, local = await self._route(request)
            r = await self.fleet.send(member, "DELETE", f"/sessions/{local}", {})
            if r.status == 204:
                member.released()
        except (SessionNotFound, NodeGone):
            pass  # already gone: the desired state
        return Response(status_code=204)

    async def execute(self, request: Request) -> Response:
        public, member, local = await self._route(request)
        # Read whole (the node caps it at 16 MiB too), so a stale pooled connection can resend.
        body = await read_body(request, MAX_EXEC_BODY)
        headers = self._headers(request)
        headers.pop("content-length", None)
        with reaching(public, member):
            r = await self.fleet.send(member, "POST", f"/sessions/{local}/exec", headers, body)
        return _copy(r)

    async def list_files(self, request: Request) -> Response:
        public, member, local = await self._route(request)
        target = self._target(f"/sessions/{local}/files/list", request)
        with reaching(public, member):
            r = await self.fleet.send(member, "GET", target, self._headers(request))
        return _copy(r)

    async def put_file(self, request: Request) -> Response:
        """The upload streams through to the node, never held whole."""
        public, member, local = await self._route(request)
        target = self._target(f"/sessions/{local}/files", request)
        headers = self._headers(request)
        with reaching(public, member):
            r = await self.fleet.send(member, "POST", target, headers, request.stream())
        return _copy(r)

    async def get_file(self, request: Request) -> Response:
        """A file's bytes stream from the node to the client, never held whole."""
        public, member, local = await self._route(request)
        target = self._target(f"/sessions/{local}/files", request)
        with reaching(public, member):
            r = await self.fleet.send(member, "GET", target, self._headers(request), stream=True)
        assert r.stream is not None
        return StreamingResponse(r.stream, status_code=r.status, headers=_response_headers(r))

    async def pause_or_resume(self, request: Request) -> Response:
        """The additions PauseSession and ResumeSession, on the session's node (where its
        snapshot is kept); the handle names the session by its public id."""
        public, member, local = await self._route(request)
        verb = request.url.path.rsplit("/", 1)[1]
        headers = self._headers(request)
        headers.pop("content-length", None)
        with reaching(public, member):
            r = await self.fleet.send(member, "POST", f"/sessions/{local}/{verb}", headers, b"")
        if r.status != 200:
            return _copy(r)
        try:
            handle = json.loads(r.body)
            handle["session_id"] = public
        except (ValueError, TypeError) as e:
            raise ProtocolError(f"node {member.name} answered {verb} with no handle") from e
        return JSONResponse(handle)

    async def health(self, request: Request) -> Response:
        if self.fleet.terminating:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        up = self.fleet.membership.up()
        return JSONResponse(
            {"status": "ok", "nodes_up": len(up), "nodes_accepting": sum(m.accepting() for m in up)}
        )


def _response_headers(r: Reply) -> dict[str, str]:
    return {k: v for k in RESPONSE_HEADERS if (v := r.headers.get(k)) is not None}


def _copy(r: Reply) -> Response:
    headers = _response_headers(r)
    headers.pop("content-length", None)  # set again from the body
    return Response(r.body, status_code=r.status, headers=headers)


def _with_isolation(body: bytes, isolation: str | None) -> bytes:
    """CreateSession's body with the isolation the operator forces (one the node cannot read
    is left as it is: the node answers it)."""
    try:
        fields = json.loads(body or b"{}")
    except ValueError:
        return body
    if not isinstance(fields, dict):
        return body
    return json.dumps({**fields, "isolation": isolation}).encode()


def _isolation_asked(body: bytes) -> str | None:
    """CreateSession's isolation hint, for placement; the node checks the body itself."""
    try:
        asked = json.loads(body or b"{}").get("isolation")
    except (ValueError, AttributeError):
        return None
    return asked if isinstance(asked, str) else None
