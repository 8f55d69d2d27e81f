"""Credentials the proxy adds, against loopback upstreams (one with a test CA): what goes out,
what comes back, what is never sent; the deployment CA, the operator's file, sealing at rest."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import ssl
import stat
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbank.egress.authority import CA_DIR, CERT_FILE, KEY_FILE, Authority
from sandbank.egress.credentials import (
    Chain,
    CredentialError,
    CredentialSet,
    Listed,
    load_operator_file,
    parse_credential,
    parse_credentials,
)
from sandbank.egress.limits import EgressLimits
from sandbank.egress.policy import NetworkPolicy
from sandbank.egress.proxy import POLICY_HOST, EgressProxy
from sandbank.egress.resolver import FixedResolver
from sandbank.egress.sealing import Sealer, parse_keys
from sandbank.egress.vault import Vault
from tests.egress.upstream import Upstream, make_ca

pytestmark = pytest.mark.anyio
LO = ipaddress.ip_address("127.0.0.1")
TOKEN = "sk-live-7f3a9c1e5b2d4680"  # the secret: it must reach the upstream and nothing else
KEY = "v8npWWdJeV2JdSheqc4tJC+oefUjuJhJkMoCsFx14n8="  # keys of the setting: base64 of 32 bytes
OTHER_KEY = "pwZoScq0Z3nA2x0+YNVuK8xGS3BXBSdHdcBD73Ps9dY="


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Rig:
    proxy: EgressProxy
    socket: Path
    tls: Upstream  # https://secure.test (and untrusted.test: same server, not in the test CA)
    web: Upstream  # http://allowed.test
    ca: ssl.SSLContext  # what a sandbox trusts: the deployment CA
    own: CredentialSet  # the session's own credentials

    async def https(
        self, name: str, heads: list[str], port: int | None = None
    ) -> tuple[str, list[bytes]]:
        """CONNECT, TLS as a sandbox would (deployment CA), then `heads` on the connection:
        the CONNECT's status line and each answer (head and body)."""
        port = port or self.tls.port
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        try:
            writer.write(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
            async with asyncio.timeout(10):
                status = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0].decode()
                if not status.startswith("HTTP/1.1 200"):
                    return status, []
                await writer.start_tls(self.ca, server_hostname=name)
                answers = []
                for head in heads:
                    writer.write(head.encode())
                    answers.append(await read_answer(reader))
            return status, answers
        finally:
            writer.close()

    async def plain(self, head: str) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        try:
            writer.write(head.encode())
            async with asyncio.timeout(10):
                return await reader.read(-1)
        finally:
            writer.close()


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@pytest.fixture
def upstreams(tmp_path: Path) -> Iterator[tuple[Upstream, Upstream, Path]]:
    ca_file, context = make_ca(tmp_path, ["secure.test", "other.secure.test"])
    with Upstream(context) as tls, Upstream() as web:
        yield tls, web, ca_file


@contextlib.asynccontextmanager
async def rigged(
    tmp: Path, tls: Upstream, web: Upstream, ca_file: Path | None, operator: list[dict[str, object]]
) -> AsyncIterator[Rig]:
    resolver = FixedResolver(
        {n: [LO] for n in ("secure.test", "other.secure.test", "untrusted.test", "allowed.test")}
    )
    trusted = NetworkPolicy.parse([f"127.0.0.1:{tls.port}", f"127.0.0.1:{web.port}"])
    limits = EgressLimits(connections_per_session=8, bytes_per_session=10**8, rate_bytes=0)
    data = tmp / "data"
    proxy = EgressProxy(trusted, limits, resolver, data_dir=data, extra_ca_file=ca_file)
    sock = tmp / "egress" / "egress.sock"
    await proxy.open("sb1", sock.parent, os.getuid())
    own = CredentialSet()
    chain = Chain(own, Listed(parse_credentials(operator, "operator", accept_id=True)))
    policy = NetworkPolicy.parse(
        [f"{n}:{tls.port}" for n in ("secure.test", "other.secure.test", "untrusted.test")]
        + [f"allowed.test:{web.port}"]
    )
    proxy.lease("sb1", "sess-1", policy, chain)
    ca = ssl.create_default_context(cadata=b"".join(proxy.roots()).decode())
    try:
        yield Rig(proxy, sock, tls, web, ca, own)
    finally:
        await proxy.close()


@pytest.fixture
async def rig(tmp_path: Path, upstreams: tuple[Upstream, Upstream, Path]) -> AsyncIterator[Rig]:
    tls, web, ca_file = upstreams
    operator: list[dict[str, object]] = [
        {"id": "bearer", "destination": f"secure.test:{tls.port}",
         "headers": {"Authorization": f"Bearer {TOKEN}", "X-Team": "blue"}},
        {"id": "keyed", "destination": f"allowed.test:{web.port}",
         "query": {"name": "api_key", "value": TOKEN}},
        {"id": "untrusted", "destination": f"untrusted.test:{tls.port}",
         "headers": {"Authorization": f"Bearer {TOKEN}"}},
    ]  # fmt: skip
    async with rigged(tmp_path, tls, web, ca_file, operator) as r:
        yield r


def get(name: str, path: str = "/", *extra: str) -> str:
    return "".join(
        [f"GET {path} HTTP/1.1\r\nHost: {name}\r\n", *(e + "\r\n" for e in extra), "\r\n"]
    )


async def test_https_to_a_destination_with_a_credential_carries_it_replacing_the_sandboxs(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sandbank.egress")
    status, answers = await rig.https(
        "secure.test",
        [
            get("secure.test", "/one", "Authorization: Bearer forged", "x-team: red"),
            get("secure.test", "/two"),  # the same kept-alive connection
        ],
    )
    assert status.startswith("HTTP/1.1 200"), status
    assert [a.split(b"\r\n")[0][-6:] for a in answers] == [b"200 OK"] * 2, answers
    assert b"hello from upstream /one" in answers[0] and b"/two" in answers[1]
    assert len(rig.tls.heads) == 2
    for head in rig.tls.heads:
        lines = [line.lower() for line in head.splitlines()]
        assert lines.count(f"authorization: bearer {TOKEN}".lower()) == 1, head
        assert "x-team: blue" in lines and "x-team: red" not in lines, head
        assert "forged" not in head
    stats = rig.proxy.stats("sb1")
    assert stats.intercepted == 1 and stats.injected == 2
    assert TOKEN not in caplog.text and "credential bearer added" in caplog.text


async def test_other_names_stay_tunnels_and_a_request_for_another_host_is_refused(
    rig: Rig, upstreams: tuple[Upstream, Upstream, Path]
) -> None:
    # other.secure.test has no credential: TLS is end to end (the deployment CA does not do).
    with pytest.raises(ssl.SSLCertVerificationError):
        await rig.https("other.secure.test", [get("other.secure.test")])
    _, _, ca_file = upstreams
    real = ssl.create_default_context(cafile=str(ca_file))
    rig.ca = real
    _, answers = await rig.https("other.secure.test", [get("other.secure.test", "/t")])
    assert b"hello from upstream /t" in answers[0]
    assert "authorization" not in rig.tls.heads[-1].lower()
    assert rig.proxy.stats("sb1").intercepted == 0

    # On a terminated connection, a request naming another host goes nowhere.
    rig.ca = ssl.create_default_context(cadata=b"".join(rig.proxy.roots()).decode())
    sent = len(rig.tls.heads)
    _, answers = await rig.https("secure.test", [get("other.secure.test", "/x")])
    assert answers[0].startswith(b"HTTP/1.1 421 "), answers
    assert len(rig.tls.heads) == sent


async def test_an_upstream_whose_certificate_does_not_verify_never_gets_the_credential(
    rig: Rig,
) -> None:
    status, _ = await rig.https("untrusted.test", [get("untrusted.test")])
    assert status.startswith("HTTP/1.1 502 ") and "did not verify" in status, status
    assert rig.tls.heads == [] and rig.proxy.stats("sb1").injected == 0


async def test_plain_http_gets_the_query_credential_and_answers_never_show_it(rig: Rig) -> None:
    port = rig.web.port
    rig.web.redirects["/go"] = f"http://elsewhere.test/?api_key={TOKEN}"
    data = await rig.plain(
        f"GET http://allowed.test:{port}/q?api_key=forged&b=2 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    )
    assert data.startswith(b"HTTP/1.0 200"), data
    assert rig.web.heads and "forged" not in data.decode()
    # the handler echoes its path: the body is the upstream's (README warns of echoes)
    assert b"/q?b=2&api_key=" in data
    data = await rig.plain(f"GET http://allowed.test:{port}/go HTTP/1.1\r\nHost: a\r\n\r\n")
    assert data.startswith(b"HTTP/1.0 302") and TOKEN.encode() not in data, data
    assert b"removed by sandbank" in data


async def test_the_policy_page_names_destinations_and_headers_never_values(rig: Rig) -> None:
    data = await rig.plain(f"GET http://{POLICY_HOST}/ HTTP/1.1\r\nHost: {POLICY_HOST}\r\n\r\n")
    text = data.decode()
    assert f"secure.test:{rig.tls.port} (Authorization, X-Team)" in text, text
    assert "query parameter api_key" in text and TOKEN not in text


async def test_a_credential_removed_mid_connection_is_not_added_to_the_next_request(
    rig: Rig, upstreams: tuple[Upstream, Upstream, Path]
) -> None:
    tls, _, _ = upstreams
    (own,) = parse_credentials(
        [{"id": "mine", "destination": f"other.secure.test:{tls.port}",
          "basic": {"username": "u", "password": TOKEN}}],
        "session", accept_id=True,
    )  # fmt: skip
    rig.own.replace([own])
    reader, writer = await asyncio.open_unix_connection(str(rig.socket))
    target = f"other.secure.test:{tls.port}"
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        await writer.start_tls(rig.ca, server_hostname="other.secure.test")
        writer.write(get("other.secure.test", "/1").encode())
        await read_answer(reader)
        assert rig.own.remove("mine")
        writer.write(get("other.secure.test", "/2").encode())
        await read_answer(reader)
    finally:
        writer.close()
    first, second = rig.tls.heads
    assert "Authorization: Basic " in first and "authorization" not in second.lower()


async def test_the_deployment_ca_is_made_once_and_its_key_is_the_servers_alone(
    tmp_path: Path,
) -> None:
    a = Authority.load_or_create(tmp_path)
    directory = tmp_path / CA_DIR
    key = directory / KEY_FILE
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_uid == os.geteuid()
    key.chmod(0o644)  # loosened by someone: tightened at the next start, the same CA kept
    b = Authority.load_or_create(tmp_path)
    assert b.certificate_pem == a.certificate_pem
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    (directory / CERT_FILE).write_text("garbage")
    assert Authority.load_or_create(tmp_path).certificate_pem != a.certificate_pem


def test_the_operators_file_is_checked_and_its_errors_never_show_a_value(tmp_path: Path) -> None:
    path = tmp_path / "credentials.toml"
    path.write_text(
        '[[credential]]\ndestination = "api.example.com:443"\n'
        f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n'
        '[[credential]]\nid = "pypi"\ndestination = "*.pkg.example:443"\n'
        f'basic = {{ username = "me", password = "{TOKEN}" }}\n'
    )
    first, second = load_operator_file(path)
    assert first.id == "operator-1" and str(second.destination) == "*.pkg.example:443"
    assert TOKEN not in repr(first) and TOKEN not in json.dumps(first.info().to_json())
    assert Listed([first, second]).find("a.pkg.example", 443) is second
    assert Listed([first, second]).find("pkg.example", 443) is None
    bad = [
        ({"destination": "10.0.0.1:443", "headers": {"A": TOKEN}}, "never to addresses"),
        ({"destination": "a.example:443", "headers": {"Host": TOKEN}}, "not settable"),
        ({"destination": "a.example:443", "headers": {"A": TOKEN + "\r\nX: y"}}, "printable"),
        ({"destination": "a.example", "headers": {"A": TOKEN}}, "NAME:PORT"),
        ({"destination": "a.example:443", "headers": {"A": TOKEN}, "query": {}}, "exactly one"),
    ]
    for data, said in bad:
        with pytest.raises(CredentialError, match=said) as e:
            parse_credential(data, "tenant")
        assert TOKEN not in str(e.value)


def test_stored_credentials_are_sealed_and_bound_to_their_owner(tmp_path: Path) -> None:
    path = tmp_path / "egress" / "credentials.json"
    vault = Vault(path, Sealer(parse_keys(KEY)))
    c = parse_credential(
        {"destination": "api.example.com:443", "headers": {"Authorization": f"Bearer {TOKEN}"}},
        "tenant",
    )
    vault.add("alice", c)
    assert TOKEN not in path.read_text() and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Vault(path, Sealer(parse_keys(KEY)))
    again.load()
    found = again.find("alice", "api.example.com", 443)
    assert found is not None and found.secret == c.secret
    assert again.find("bob", "api.example.com", 443) is None
    # Moved to another owner in the file: it does not open.
    raw = json.loads(path.read_text())
    raw["credentials"][0]["owner"] = "bob"
    path.write_text(json.dumps(raw))
    moved = Vault(path, Sealer(parse_keys(KEY)))
    moved.load()
    assert moved.find("bob", "api.example.com", 443) is None
    other_key = Vault(path, Sealer(parse_keys(OTHER_KEY)))
    other_key.load()
    assert other_key.list("alice") == [] and other_key.list("bob") == []
    assert vault.remove("alice", c.id) and vault.find("alice", "api.example.com", 443) is None
    with pytest.raises(ValueError, match="key #1"):
        parse_keys("short")
    path.write_text('{"credentials": [{"id": 1}]}')
    with pytest.raises(CredentialError, match="not a file of stored credentials"):
        Vault(path, Sealer(parse_keys(KEY))).load()
