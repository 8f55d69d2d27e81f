"""The filtering proxy: the only way out of a sandbox, one unix socket per sandbox.

It speaks just enough HTTP/1.x: `CONNECT host:port` (HTTPS and any TLS, tunnelled as bytes) and
requests with an absolute `http://` URI. The destination is checked against the session's
policy before anything is resolved; the name is resolved here, never in the sandbox; each
address is checked (non-public ones only if the operator listed them) and the connection goes
to that checked address, so a name that changes its answer (DNS rebinding) gains nothing.
Every byte from the sandbox is hostile: heads are bounded in size and time, parsed strictly.

Only then is a credential looked for (`credentials.py`): a plain request to its destination
gets it added to its head; a CONNECT to it is terminated and read (`interception.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from .authority import Authority, upstream_context
from .credentials import Applicable, Credential, NoCredentials
from .interception import Link, Streams, Terminated, scrub_head, with_query
from .limits import EgressLimits, EgressStats, RateLimiter
from .policy import IPAddress, NetworkPolicy, is_public, normalize_name, parse_address
from .pump import Pump
from .resolver import Resolver

log = logging.getLogger(__name__)

SOCKET_NAME = "egress.sock"
# Answered by the proxy itself with the session's own policy (`.invalid` never resolves).
POLICY_HOST = "policy.sandbank.invalid"
HEAD_LIMIT = 32 * 1024
HEAD_TIMEOUT = 15.0
CONNECT_TIMEOUT = 10.0
MAX_ADDRESSES = 4  # of a name's addresses, tried in turn
LOG_FIRST = 100  # connections logged one by one per session; then every LOG_EVERY-th (a
LOG_EVERY = 1000  # sandbox must not flood the log); the counters and the totals stay exact
CHUNK = 256 * 1024
STREAM_LIMIT = 1024 * 1024  # buffered per direction before reading pauses
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
    "te", "trailer", "upgrade", "host",
}  # fmt: skip


class Refusal(Exception):
    """A request the proxy answers itself, with an HTTP status and a reason naming the cause."""

    def __init__(self, status: int, reason: str, counted: str = "refused") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.counted = counted  # which counter it adds to: refused or failed


@dataclass
class Request:
    method: str
    host: str  # a normalized name, or an address literal
    port: int
    body: int | None = None  # for plain HTTP: the body's length; nothing after it is relayed
    # For plain HTTP: the URL's authority and origin-form target, and the headers kept.
    authority: str = ""
    path: str = "/"
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def tunnel(self) -> bool:
        return self.method == "CONNECT"

    def head(self, credential: Credential | None = None) -> bytes:
        """The head sent upstream (origin-form, `Connection: close`), the credential added:
        its headers replace same-named ones, its query parameter a same-named one."""
        headers, path = list(self.headers), self.path
        if credential is not None:
            secret = credential.secret
            replaced = {n.lower() for n, _ in secret.headers}
            headers = [(n, v) for n, v in headers if n.lower() not in replaced]
            headers += secret.headers
            if secret.query is not None:
                path = with_query(path.encode("ascii"), *secret.query).decode("ascii")
        out = [f"{self.method} {path} HTTP/1.1", f"Host: {self.authority}"]
        out += [f"{n}: {v}" for n, v in headers]
        out.append("Connection: close")
        return ("\r\n".join(out) + "\r\n\r\n").encode("ascii")


def split_authority(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise Refusal(400, "malformed address")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = text.partition(":")
    if not port_text:
        if default_port is None:
            raise Refusal(400, "CONNECT needs host:port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refusal(400, "malformed port")
    return host, int(port_text)


def checked_host(host: str) -> str:
    """An address literal as given, or a name in canonical form; 400 for anything else."""
    if parse_address(host) is not None and "%" not in host:  # no IPv6 zone: it is free text
        return host
    name = normalize_name(host)
    if name is None:
        raise Refusal(400, "not a valid host name")
    return name


def parse_head(head: bytes) -> Request:
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(400, "the request head is not ASCII") from None
    lines = text[: -len("\r\n\r\n")].split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not _TOKEN.match(parts[0]):
        raise Refusal(400, "malformed request line")
    method, target, _ = parts
    if method == "CONNECT":
        host, port = split_authority(target, None)
        return Request(method, checked_host(host), port)
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise Refusal(
            400, "this proxy takes CONNECT (for https) and absolute http:// URLs, nothing else"
        )
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, path = rest[:end], rest[end:].split("#", 1)[0]
    if "@" in authority or "\\" in authority or not authority:
        raise Refusal(400, "malformed URL authority")
    host, port = split_authority(authority, 80)
    if not path.startswith("/"):
        path = "/" + path
    dropped = set(_HOP_BY_HOP)
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name) or any(c in value for c in "\r\n\0"):
            raise Refusal(400, "malformed header")
        if name.lower() == "connection":
            dropped.update(v.strip().lower() for v in value.split(","))
        headers.append((name, value.strip()))
    kept = tuple((n, v) for n, v in headers if n.lower() not in dropped)
    return Request(method, checked_host(host), port, body_length(headers), authority, path, kept)


def body_length(headers: list[tuple[str, str]]) -> int:
    """The length of a plain-HTTP request's body. Only that much is relayed, so a second request
    cannot ride the connection to the same address with another Host (domain fronting)."""
    names = [n.lower() for n, _ in headers]
    if "transfer-encoding" in names:
        raise Refusal(411, "send a Content-Length: chunked request bodies are not relayed")
    lengths = [v for n, v in headers if n.lower() == "content-length"]
    if not lengths:
        return 0
    if len(lengths) > 1 or not lengths[0].isdigit():
        raise Refusal(400, "malformed Content-Length")
    return int(lengths[0])


def answer(status: int, reason: str, text: str = "") -> bytes:
    # The reason phrase carries the cause: it is what pip, requests and curl show for a
    # refused CONNECT. It is built from checked or fixed text only (no control characters).
    body = f"{text or reason}\n".encode()
    mark = "" if status == 200 else "X-Sandbank-Egress: refused\r\n"
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n{mark}Connection: close\r\n\r\n"
    ).encode() + body


def worth_logging(n: int) -> bool:
    return n <= LOG_FIRST or n % LOG_EVERY == 0


@dataclass
class Gate:
    """One sandbox's door: its socket, its policy and its counters."""

    sandbox_id: str
    server: asyncio.AbstractServer
    path: Path
    session_id: str = "(not leased)"
    policy: NetworkPolicy = field(default_factory=NetworkPolicy)
    credentials: Applicable = field(default_factory=NoCredentials)  # looked up per request
    stats: EgressStats = field(default_factory=EgressStats)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class EgressProxy:
    """The filtering proxy: a unix socket per sandbox, checked against its session's policy."""

    def __init__(
        self,
        trusted: NetworkPolicy,
        limits: EgressLimits,
        resolver: Resolver,
        data_dir: Path | None = None,
        extra_ca_file: Path | None = None,
        pump: Pump | None = None,
    ) -> None:
        self.trusted = trusted  # the operator's lists: the only source of non-public addresses
        self.limits = limits
        self.resolver = resolver
        self.rate = RateLimiter(limits.rate_bytes)
        # The data plane: where checked connections are relayed, out of this loop (`pump.py`);
        # without one (or while it is down), they are relayed here.
        self.pump = pump
        self._gates: dict[str, Gate] = {}
        # Where the deployment CA lives: without one, HTTPS is never terminated (tunnels only).
        self.data_dir = data_dir
        self.extra_ca_file = extra_ca_file
        self._authority: Authority | None = None
        self._upstream_tls: ssl.SSLContext | None = None

    # --- terminated TLS ------------------------------------------------------------------
    def roots(self) -> list[bytes]:
        """The certificates sandboxes must trust (the deployment CA, made at first start)."""
        authority = self.authority()
        return [] if authority is None else [authority.certificate_pem]

    def authority(self) -> Authority | None:
        if self._authority is None and self.data_dir is not None:
            self._authority = Authority.load_or_create(self.data_dir)
        return self._authority

    def upstream_tls(self) -> ssl.SSLContext:
        if self._upstream_tls is None:
            self._upstream_tls = upstream_context(self.extra_ca_file)
        return self._upstream_tls

    # --- sandboxes -----------------------------------------------------------------------
    async def open(self, sandbox_id: str, directory: Path, uid: int) -> Path:
        """Listen on `directory`/egress.sock for this sandbox; only its uid may connect."""
        os.makedirs(directory, mode=0o755, exist_ok=True)
        path = directory / SOCKET_NAME
        gate: Gate | None = None

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert gate is not None
            await self._serve(gate, reader, writer)

        server = await asyncio.start_unix_server(serve, path=str(path), limit=HEAD_LIMIT)
        os.chown(path, uid, uid)
        os.chmod(path, 0o600)
        gate = Gate(sandbox_id, server, path)
        self._gates[sandbox_id] = gate
        return path

    def lease(
        self,
        sandbox_id: str,
        session_id: str,
        policy: NetworkPolicy,
        credentials: Applicable | None = None,
    ) -> None:
        gate = self._gates.get(sandbox_id)
        if gate is not None:
            gate.session_id, gate.policy = session_id, policy
            gate.credentials = credentials or NoCredentials()
            log.info("egress policy of session %s: %s", session_id, policy)

    def stats(self, sandbox_id: str) -> EgressStats:
        gate = self._gates.get(sandbox_id)
        return gate.stats if gate is not None else EgressStats()

    async def close_sandbox(self, sandbox_id: str) -> None:
        gate = self._gates.pop(sandbox_id, None)
        if gate is None:
            return
        gate.server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(gate.path)
        for task in list(gate.tasks):
            task.cancel()
        await asyncio.gather(*gate.tasks, return_exceptions=True)
        if self.pump is not None:
            self.pump.forget(sandbox_id)
        s = gate.stats
        log.info(
            "egress of session %s: %d allowed, %d refused, %d failed, %d bytes out, %d in, "
            "%d requests with a credential",
            gate.session_id, s.allowed, s.refused, s.failed, s.bytes_out, s.bytes_in, s.injected,
        )  # fmt: skip

    async def close(self) -> None:
        for sandbox_id in list(self._gates):
            await self.close_sandbox(sandbox_id)
        if self.pump is not None:
            await self.pump.close()

    # --- one connection --------------------------------------------------------------------
    async def _serve(
        self, gate: Gate, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        gate.tasks.add(task)
        gate.stats.open += 1
        upstream: asyncio.StreamWriter | None = None
        try:
            req: Request | None = None
            try:
                req = await self._read_request(gate, reader)
                if req.host == POLICY_HOST and not req.tunnel:
                    writer.write(answer(200, "OK", describe(gate)))
                    await writer.drain()
                    return
                addresses = await self._check(gate, req)
                # Looked for only now: a credential never opens what the policy closed.
                credential = (
                    gate.credentials.find(req.host, req.port)
                    if parse_address(req.host) is None
                    else None
                )
                terminate = req.tunnel and credential is not None and self.data_dir is not None
                if terminate:
                    up_reader, upstream = await self._connect_tls(gate, req, addresses)
                else:
                    up_reader, upstream = await self._connect(gate, req, addresses)
            except Refusal as r:
                self._count(gate, r, req)
                writer.write(answer(r.status, r.reason))
                with contextlib.suppress(OSError, TimeoutError):
                    await asyncio.wait_for(writer.drain(), 5.0)
                return
            if terminate:
                await self._terminate(gate, req, addresses, (reader, writer), (up_reader, upstream))
                return
            markers: list[bytes] = []
            if req.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                head = req.head(credential)
                if credential is not None:
                    markers = credential.secret.markers()
                    self._injected(gate, req, credential)
                upstream.write(head)
                gate.stats.bytes_out += len(head)
            if markers or not await self._hand_off(
                gate, req, (reader, writer), (up_reader, upstream)
            ):
                await self._relay(req, gate, reader, writer, up_reader, upstream, markers)
        except (OSError, EOFError, asyncio.LimitOverrunError):
            pass
        finally:
            gate.stats.open -= 1
            gate.tasks.discard(task)
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    async def _hand_off(self, gate: Gate, req: Request, client: Streams, upstream: Streams) -> bool:
        """Relay this connection in the data-plane process; False if it cannot take it now."""
        pump = self.pump
        transports = [cast(asyncio.Transport, w.transport) for w in (client[1], upstream[1])]
        if pump is None or not all(
            isinstance(t, asyncio.Transport) and not t.get_write_buffer_size() for t in transports
        ):
            return False  # what is still to be sent stays with this loop's relay
        for t in transports:
            t.pause_reading()
        # Bytes the streams read ahead go first; of a plain request's, only its body.
        to_upstream, to_client = _read_ahead(client[0]), _read_ahead(upstream[0])
        limit = None if req.tunnel else req.body
        if limit is not None:
            to_upstream = to_upstream[:limit]
            limit -= len(to_upstream)
        done = pump.hand(
            gate.sandbox_id,
            client[1].get_extra_info("socket"),
            upstream[1].get_extra_info("socket"),
            limit=limit,
            budget=self.limits.bytes_per_session - gate.stats.bytes - len(to_upstream + to_client),
            to_upstream=to_upstream,
            to_client=to_client,
            moved=lambda out, into: _count_moved(gate.stats, out, into),
        )
        if done is None:
            for t in transports:
                t.resume_reading()
            return False
        _count_moved(gate.stats, len(to_upstream), len(to_client))
        for t in transports:
            t.abort()  # this loop's copies of the sockets; the connection lives on in the pump
        try:
            await done
        except asyncio.CancelledError:
            pump.cancel(done)
            raise
        return True

    async def _terminate(
        self,
        gate: Gate,
        req: Request,
        addresses: list[IPAddress],
        client: Streams,
        upstream: Streams,
    ) -> None:
        """A CONNECT to a destination with a credential: the sandbox's TLS ends here."""
        authority = self.authority()
        assert authority is not None
        context = authority.context_for(req.host)
        writer = client[1]
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        try:
            await writer.start_tls(context, ssl_handshake_timeout=HEAD_TIMEOUT)
        except (ssl.SSLError, TimeoutError) as e:
            gate.stats.failed += 1
            if worth_logging(gate.stats.failed):
                log.info(
                    "egress failed: session %s's client did not accept the deployment CA for "
                    "%s:%d (a CA list of its own?): %s",
                    gate.session_id, req.host, req.port, str(e)[:200],
                )  # fmt: skip
            upstream[1].close()
            return
        gate.stats.intercepted += 1

        async def connect() -> Streams:
            try:
                return await self._connect_tls(gate, req, addresses)
            except Refusal as r:
                raise OSError(r.reason) from None

        async def moved(n: int, out: bool) -> None:
            await self._moved(gate, n, out)

        def injected(credential: Credential) -> None:
            self._injected(gate, req, credential)

        link = Link(
            req.host, req.port, gate.credentials, connect, moved, injected,
            self.limits.idle_seconds,
        )  # fmt: skip
        await Terminated(link, client, upstream).run()

    def _injected(self, gate: Gate, req: Request, credential: Credential) -> None:
        gate.stats.injected += 1
        if worth_logging(gate.stats.injected):
            log.info(
                "egress credential %s added (#%d): session %s to %s:%d",
                credential.id, gate.stats.injected, gate.session_id, req.host, req.port,
            )  # fmt: skip

    async def _read_request(self, gate: Gate, reader: asyncio.StreamReader) -> Request:
        if gate.stats.open > self.limits.connections_per_session:
            raise Refusal(429, "too many connections from this session at once")
        if gate.stats.bytes >= self.limits.bytes_per_session:
            raise Refusal(429, "this session has used its network byte allowance")
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except asyncio.LimitOverrunError:
            raise Refusal(431, "the request head is too large") from None
        except TimeoutError:
            raise Refusal(408, "no complete request head in time") from None
        return parse_head(head)

    async def _connect(
        self, gate: Gate, req: Request, addresses: list[IPAddress]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        for ip in addresses[:MAX_ADDRESSES]:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    conn = await asyncio.open_connection(str(ip), req.port, limit=STREAM_LIMIT)
            except (OSError, TimeoutError):
                continue
            self._allowed(gate, req, ip)
            return conn
        raise Refusal(502, f"could not connect to {req.host}:{req.port}", counted="failed")

    async def _connect_tls(
        self, gate: Gate, req: Request, addresses: list[IPAddress]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The proxy's own TLS connection to the destination, its real certificate verified."""
        context = self.upstream_tls()
        where = f"{req.host}:{req.port}"
        for ip in addresses[:MAX_ADDRESSES]:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    conn = await asyncio.open_connection(
                        str(ip), req.port, ssl=context, server_hostname=req.host,
                        limit=STREAM_LIMIT, ssl_handshake_timeout=CONNECT_TIMEOUT,
                    )  # fmt: skip
            except ssl.SSLCertVerificationError as e:
                reason = _printable(str(e.verify_message or "not trusted"))
                raise Refusal(
                    502, f"the certificate of {where} did not verify: {reason}", counted="failed"
                ) from None
            except ssl.SSLError:
                raise Refusal(502, f"TLS with {where} failed", counted="failed") from None
            except (OSError, TimeoutError):
                continue
            self._allowed(gate, req, ip)
            return conn
        raise Refusal(502, f"could not connect to {where}", counted="failed")

    def _allowed(self, gate: Gate, req: Request, ip: IPAddress) -> None:
        gate.stats.allowed += 1
        if worth_logging(gate.stats.allowed):
            log.info(
                "egress allowed (#%d): session %s to %s:%d (%s)",
                gate.stats.allowed, gate.session_id, req.host, req.port, ip,
            )  # fmt: skip

    async def _check(self, gate: Gate, req: Request) -> list[IPAddress]:
        """The addresses this request may go to, checked; Refusal if none."""
        policy, where = gate.policy, f"{req.host}:{req.port}"
        if policy.is_none:
            raise Refusal(403, "Forbidden: this session's network policy is none (no network)")
        ip = parse_address(req.host)
        if ip is not None:
            if not policy.allows_address(ip, req.port):
                raise Refusal(403, f"Forbidden: direct IP {where} is not on the allow-list")
            return [ip]
        name = normalize_name(req.host)
        if name is None:
            raise Refusal(400, "not a valid host name")
        where = f"{name}:{req.port}"
        if not policy.allows_name(name, req.port):
            raise Refusal(403, f"Forbidden: {where} is not on this session's network allow-list")
        try:
            found = await self.resolver.resolve(name, req.port)
        except (OSError, TimeoutError):
            raise Refusal(502, f"{name} does not resolve", counted="failed") from None
        usable = [a for a in found if is_public(a) or self.trusted.allows_address(a, req.port)]
        if not usable:
            raise Refusal(
                403, f"Forbidden: {where} resolves to a non-public address the operator did "
                "not list",
            )  # fmt: skip
        return usable

    def _count(self, gate: Gate, refusal: Refusal, req: Request | None) -> None:
        target = f"{req.host}:{req.port}" if req is not None else "(unparsed request)"
        if refusal.counted == "failed":
            gate.stats.failed += 1
            n = gate.stats.failed
        else:
            gate.stats.refused += 1
            n = gate.stats.refused
        if worth_logging(n):
            log.info(
                "egress %s (#%d): session %s to %s: %d %s",
                refusal.counted, n, gate.session_id, target[:300], refusal.status, refusal.reason,
            )  # fmt: skip

    async def _moved(self, gate: Gate, n: int, out: bool) -> None:
        """Count bytes moved for the session; its allowance and everyone's rate apply."""
        if out:
            gate.stats.bytes_out += n
        else:
            gate.stats.bytes_in += n
        if gate.stats.bytes > self.limits.bytes_per_session:
            log.info("egress: session %s used its byte allowance", gate.session_id)
            raise OSError("byte allowance used")
        await self.rate.take(n)

    async def _relay(
        self,
        req: Request,
        gate: Gate,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        markers: Sequence[bytes] = (),
    ) -> None:
        last = [time.monotonic()]

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, out: bool, left: int | None
        ) -> None:
            idle = self.limits.idle_seconds
            while left is None or left > 0:
                try:
                    async with asyncio.timeout(idle):
                        data = await src.read(CHUNK if left is None else min(CHUNK, left))
                except TimeoutError:
                    if time.monotonic() - last[0] < idle:
                        continue
                    raise
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                last[0] = time.monotonic()
                if left is not None:
                    left -= len(data)
                await self._moved(gate, len(data), out)
                dst.write(data)
                await dst.drain()

        async def answer_back() -> None:
            if markers:  # the answer's heads, with a credential's value cut out
                await self._scrubbed_heads(gate, up_reader, writer, list(markers))
            await pump(up_reader, writer, False, None)

        body = None if req.tunnel else req.body
        up = asyncio.create_task(pump(reader, upstream, True, body))
        down = asyncio.create_task(answer_back())
        try:
            # The sandbox may finish sending first (EOF passed on) and still read the answer;
            # once the upstream is done, or anything fails, the connection is over.
            done, _ = await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
            if up in done and up.exception() is None and not down.done():
                await down
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _scrubbed_heads(
        self,
        gate: Gate,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        markers: list[bytes],
    ) -> None:
        """Relay a plain answer's heads (any 1xx, then the final one) with `markers` cut out."""
        while True:
            async with asyncio.timeout(self.limits.idle_seconds):
                head = await up_reader.readuntil(b"\r\n\r\n")
            if len(head) > HEAD_LIMIT:
                raise OSError("the answer's head is too large")
            await self._moved(gate, len(head), False)
            writer.write(scrub_head(head, markers))
            await writer.drain()
            status = head.split(b" ", 2)[1:2]
            if not status or not status[0].startswith(b"1") or status[0] == b"101":
                return


def describe(gate: Gate) -> str:
    """What the proxy tells a session of itself: its policy and where credentials are added
    (destinations and header names only)."""
    text = f"network policy: {gate.policy}"
    added = [
        f"{c.destination} ({'query parameter ' if c.kind == 'query' else ''}{', '.join(c.names)})"
        for c in gate.credentials.listed()
    ]
    if added:
        text += "\ncredentials the proxy adds: " + "; ".join(added)
    return text


def _read_ahead(reader: asyncio.StreamReader) -> bytes:
    """What a stream has read and not yet given out (asyncio keeps it in `_buffer`)."""
    return bytes(getattr(reader, "_buffer", b""))


def _count_moved(stats: EgressStats, out: int, into: int) -> None:
    stats.bytes_out += out
    stats.bytes_in += into


def _printable(text: str) -> str:
    """Text fit for a status line (OpenSSL's words): printable ASCII, bounded."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:200]
