"""The sandboxes' trust store: the system's CAs and the operator's, used by every client alike."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbank.config import Settings
from sandbank.errors import ConfigError
from sandbank.sandbox.host import trust
from sandbank.sandbox.local import LocalSandboxes
from tests.egress.conftest import World
from tests.sandbox.conftest import Shell
from tests.support import data_dir, settings
from tests.tiers import param

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=[param("bwrap", "root"), param("fork", "root")])
async def runtime(
    request: pytest.FixtureRequest, world: World, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSandboxes]:
    ca_file = tmp_path_factory.mktemp("operator") / "corporate-ca.pem"
    ca_file.write_text(world.ca_pem)
    with data_dir() as data:
        rt = LocalSandboxes(
            settings(
                data,
                isolation=request.param,
                cpu_limit=0.5,
                egress_allow=world.policy(),
                egress_test_hosts="secure.test=127.0.0.1,allowed.test=127.0.0.1",
                extra_ca_file=ca_file,
            )
        )
        await rt.start()
        try:
            yield rt
        finally:
            await rt.close()


async def test_https_verifies_against_a_ca_the_operator_added_from_every_client(
    runtime: LocalSandboxes, world: World
) -> None:
    url = f"https://secure.test:{world.tls.port}/tls"
    sb = Shell(runtime, await runtime.create("tests"))
    try:
        r = await sb.sh(f"curl -sS {url}")
        assert r.stdout.startswith("hello from upstream /tls"), r
        r = await sb.py(
            "import urllib.request, requests, httpx, asyncio, aiohttp\n"
            f"url = {url!r}\n"
            "print('urllib', urllib.request.urlopen(url).read()[:25])\n"
            "print('requests', requests.get(url, timeout=10).text[:25])\n"
            "print('httpx', httpx.get(url, timeout=10).text[:25])\n"
            "async def fetch():\n"
            "    async with aiohttp.ClientSession(trust_env=True) as s:\n"
            "        async with s.get(url) as resp:\n"
            "            return (await resp.text())[:25]\n"
            "print('aiohttp', await fetch())",
            timeout=60,
        )
        assert r.return_code == 0, r
        for client in ("urllib", "requests", "httpx", "aiohttp"):
            assert f"{client} " in r.stdout and "hello from upstream /tls" in r.stdout, r
        assert r.stdout.count("hello from upstream") == 4, r
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_the_store_holds_the_systems_cas_and_the_operators_at_the_usual_path(
    runtime: LocalSandboxes, world: World
) -> None:
    sb = Shell(runtime, await runtime.create("tests"))
    try:
        r = await sb.py(
            "import os, ssl, certifi\n"
            "print(ssl.create_default_context().cert_store_stats()['x509_ca'])\n"
            "names = ('SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'PIP_CERT')\n"
            "print({os.environ[n] for n in names}, os.path.realpath(certifi.where()))\n"
            "print(open('/etc/ssl/certs/ca-certificates.crt').read().count('BEGIN CERTIFICATE'))"
        )
        count, paths, in_file = r.stdout.splitlines()
        system = trust.SYSTEM_BUNDLE.read_text().count("BEGIN CERTIFICATE")
        assert system > 100  # Debian's bundle
        # the system's, the operator's and the deployment CA of credentials (egress is on)
        assert int(in_file) == system + 2 and int(count) >= system, r
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        assert paths == f"{{'{bundle}'}} {bundle}", r
        inside = (await sb.sh(f"cat {bundle}")).stdout
        assert world.ca_pem.strip() in inside
        assert runtime.backend.egress_proxy is not None
        (deployment,) = runtime.backend.egress_proxy.roots()
        assert deployment.decode().strip() in inside
        r = await sb.sh(f"echo x >> {bundle} || echo refused")
        assert "refused" in r.stdout, r  # read-only for sandboxed code
    finally:
        await runtime.destroy(sb.session.id, "tests")


def test_an_operator_file_without_certificates_is_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        trust.assemble(Settings(data_dir=tmp_path, extra_ca_file=bad))
    with pytest.raises(ConfigError, match="cannot be read"):
        trust.assemble(Settings(data_dir=tmp_path, extra_ca_file=tmp_path / "missing.pem"))
    broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    bad.write_text(broken)
    with pytest.raises(ConfigError, match="OpenSSL rejects"):
        trust.assemble(Settings(data_dir=tmp_path, extra_ca_file=bad))


def test_the_bundle_is_the_systems_then_the_operators_then_what_callers_add(
    tmp_path: Path, world: World
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(world.ca_pem)
    bundle = trust.assemble(
        Settings(data_dir=tmp_path, extra_ca_file=ca), extra=[b"# deployment CA\n"]
    )
    system = trust.SYSTEM_BUNDLE.read_bytes()
    assert bundle.startswith(system)
    assert bundle.index(world.ca_pem.strip().encode()) > len(system) - 1
    assert bundle.endswith(b"# deployment CA\n")
