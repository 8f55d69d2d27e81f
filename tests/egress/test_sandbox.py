"""Egress from real sandboxes: through the relay and the proxy only, by name, as listed."""

from __future__ import annotations

import time

import pytest

from sandbank.egress.policy import NetworkPolicy
from sandbank.protocol.sessions import SessionSpec
from sandbank.sandbox.local import LocalSandboxes
from tests.egress.conftest import PACKAGE, World
from tests.sandbox.conftest import Shell
from tests.support import data_dir, settings

pytestmark = pytest.mark.anyio


async def shell(runtime: LocalSandboxes, network: NetworkPolicy | None = None) -> Shell:
    return Shell(runtime, await runtime.create("tests", SessionSpec(network=network)))


async def test_an_allowed_name_works_over_http_from_curl_and_python(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime)
    try:
        r = await sb.sh(f"curl -sS http://allowed.test:{world.web.port}/from-curl")
        assert r.stdout.startswith("hello from upstream /from-curl"), r
        r = await sb.py(
            "import urllib.request\n"
            f"print(urllib.request.urlopen('http://allowed.test:{world.web.port}/py').read())"
        )
        assert "hello from upstream /py" in r.stdout, r
        assert runtime.backend.egress_proxy is not None
        stats = runtime.backend.egress_proxy.stats(sb.session.sandbox.id)
        assert stats.allowed == 2 and stats.bytes_in > 0
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_an_allowed_name_works_over_https_with_a_ca_trusted_in_the_session(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime)
    url = f"https://secure.test:{world.tls.port}/tls"
    try:
        await sb.edit(command="create", path="ca.pem", file_text=world.ca_pem)
        r = await sb.sh(f"curl -sS --cacert ca.pem {url}")
        assert r.stdout.startswith("hello from upstream /tls"), r
        r = await sb.py(
            "import ssl, urllib.request\nctx = ssl.create_default_context(cafile='ca.pem')\n"
            f"print(urllib.request.urlopen('{url}', context=ctx).read())"
        )
        assert "hello from upstream /tls" in r.stdout, r
        r = await sb.sh(f"curl -sS {url} 2>&1")  # without the CA: TLS is end to end
        assert "certificate" in r.stdout, r
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_names_not_on_the_list_and_unlisted_private_addresses_are_refused_clearly(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime)
    try:
        r = await sb.py(
            "import urllib.request\n"
            f"for url in ['https://evil.test:{world.tls.port}/', 'http://evil.test:{world.web.port}/',"
            f" 'http://private.test:{world.other.port}/', 'http://10.1.2.3:{world.web.port}/']:\n"
            "    try:\n        urllib.request.urlopen(url, timeout=10); print('FETCHED', url)\n"
            "    except Exception as e:\n        print(e)"
        )
        out = r.stdout
        assert "FETCHED" not in out
        assert (
            f"Tunnel connection failed: 403 Forbidden: evil.test:{world.tls.port} is not on "
            "this session's network allow-list" in out
        ), out
        assert f"evil.test:{world.web.port} is not on this session's network allow-list" in out
        assert "resolves to a non-public address the operator did not list" in out
        assert f"direct IP 10.1.2.3:{world.web.port} is not on the allow-list" in out
        r = await sb.sh(f"curl -sS http://evil.test:{world.web.port}/ -w ' %{{http_code}}'")
        assert "is not on this session's network allow-list" in r.stdout and "403" in r.stdout
        assert world.other.connections == 0
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_no_interface_no_resolver_and_direct_ip_udp_and_raw_sockets_fail(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime)
    try:
        r = await sb.py(
            "import socket\n"
            "print(sorted(n for _, n in socket.if_nameindex()))\n"
            "def attempt(f):\n    try:\n        f(); print('OK')\n"
            "    except OSError as e:\n        print('failed', type(e).__name__)\n"
            "attempt(lambda: socket.create_connection(('93.184.215.14', 80), timeout=2))\n"
            f"attempt(lambda: socket.create_connection(('127.0.0.1', {world.web.port}), timeout=2))\n"
            "attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53)))\n"
            "attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))\n"
            "attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))\n"
            "attempt(lambda: socket.getaddrinfo('allowed.test', 80))"
        )
        lines = r.stdout.splitlines()
        assert lines[0] == "['lo']", r
        # AF_PACKET: EAFNOSUPPORT, refused by the filter; gVisor's kernel answers EPERM
        packet = "PermissionError" if runtime.settings.isolation == "gvisor" else "OSError"
        assert lines[1:] == ["failed " + x for x in (
            "OSError", "ConnectionRefusedError", "OSError", "PermissionError", packet, "gaierror",
        )], r  # fmt: skip
        r = await sb.sh(
            "cat /proc/net/route | wc -l; curl -sS --noproxy '*' http://allowed.test/ 2>&1"
        )
        assert r.stdout.startswith("1\n") and "Could not resolve host" in r.stdout, r
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_pip_installs_a_package_from_an_allowed_index_into_the_session(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime)
    try:
        await sb.edit(command="create", path="ca.pem", file_text=world.ca_pem)
        assert "No module named" in (await sb.py(f"import {PACKAGE}")).stderr
        r = await sb.sh(
            f"PIP_INDEX_URL=https://secure.test:{world.tls.port}/simple/ "
            f"PIP_CERT=/workspace/ca.pem pip install {PACKAGE} 2>&1",
            timeout=60,
        )
        assert r.return_code == 0, r
        assert f"Successfully installed {PACKAGE}-1.0\n" in r.stdout, r  # numpy was not
        assert r.files == [], r.files  # the site directory is not the code's output
        r = await sb.py(f"import {PACKAGE}; print({PACKAGE}.VALUE, {PACKAGE}.__file__)")
        site = "/workspace/.site/lib/python3.11/site-packages"
        assert r.stdout == f"42 {site}/{PACKAGE}/__init__.py\n", r
        r = await sb.sh(f"python3 -c 'import {PACKAGE}; print({PACKAGE}.VALUE)'; ls /workspace")
        assert r.stdout == "42\nca.pem\n", r  # children see it too; .site is hidden
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_pip_fails_at_once_naming_the_policy_when_the_index_is_not_allowed(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime, network=NetworkPolicy())
    try:
        assert sb.session.network.is_none
        started = time.monotonic()
        r = await sb.sh(
            f"PIP_INDEX_URL=https://secure.test:{world.tls.port}/simple/ pip install {PACKAGE} 2>&1",
            timeout=60,
        )
        assert r.return_code != 0 and time.monotonic() - started < 15, r
        assert "this session's network policy is none (no network)" in r.stdout, r.stdout
        assert r.stdout.count("Retrying") <= 1
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_a_hint_narrows_the_operators_list_and_cannot_widen_it(
    runtime: LocalSandboxes, world: World
) -> None:
    hint = NetworkPolicy.parse([f"allowed.test:{world.web.port}", f"evil.test:{world.web.port}",
                                f"127.0.0.0/8:{world.other.port}"])  # fmt: skip
    sb = await shell(runtime, network=hint)
    try:
        assert sb.session.network.entries() == [f"allowed.test:{world.web.port}"]
        r = await sb.sh(
            f"curl -sS http://allowed.test:{world.web.port}/a; "
            f"curl -sS -o /dev/null -w '%{{http_code}}\\n' http://evil.test:{world.web.port}/; "
            f"curl -sS --cacert ca.pem https://secure.test:{world.tls.port}/ 2>&1"
        )
        lines = r.stdout.splitlines()
        assert lines[0].startswith("hello from upstream /a") and lines[1] == "403", r
        assert "CONNECT tunnel failed, response 403" in lines[2], r
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_the_default_stays_no_network_at_all(world: World, machine: None) -> None:
    """No policy set: no proxy, no socket, no relay, no variables; pip says why it fails."""
    with data_dir() as data:
        rt = LocalSandboxes(settings(data, cpu_limit=0.5))
        await rt.start()
        try:
            assert rt.backend.egress_proxy is None
            sb = await shell(rt)
            r = await sb.sh(
                "env | grep -ic proxy; ls /opt/sandbank; "
                f"curl -sS --max-time 5 http://allowed.test:{world.web.port}/ 2>&1; "
                f"curl -sS --max-time 5 http://127.0.0.1:{world.web.port}/ 2>&1; "
                "python3 -c \"import socket; s = socket.socket(); s.connect(('127.0.0.1', 3128))\" 2>&1 | tail -1"
            )
            lines = r.stdout.splitlines()
            assert lines[0] == "0" and lines[1:3] == ["lib", "runtime"], r
            assert "Could not resolve host" in lines[3] and "Failed to connect" in lines[4], r
            assert "ConnectionRefusedError" in lines[5], r
            started = time.monotonic()
            r = await sb.sh(f"pip install {PACKAGE} 2>&1", timeout=60)
            assert r.return_code != 0 and time.monotonic() - started < 15, r
            assert "network policy is none (no network)" in r.stdout, r
            assert sb.session.network.is_none
        finally:
            await rt.close()


async def test_the_relay_comes_back_with_a_restarted_interpreter(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = await shell(runtime)
    url = f"http://allowed.test:{world.web.port}"
    try:
        await sb.sh(
            "pkill -KILL -f sandbank_relay; "
            "for i in $(seq 100); do pgrep -f sandbank_relay >/dev/null || break; sleep 0.05; done"
        )
        r = await sb.sh(f"curl -sS {url}/gone 2>&1")
        assert "Failed to connect to 127.0.0.1 port 3128" in r.stdout, r
        r = await sb.py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        assert r.return_code == 137
        r = await sb.sh(f"curl -sS {url}/back", timeout=60)
        assert r.stdout.startswith("hello from upstream /back"), r
    finally:
        await runtime.destroy(sb.session.id, "tests")
