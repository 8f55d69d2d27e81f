"""Secretless credentials from a real sandbox: its clients' requests arrive with the key, which
the sandbox never holds; who has no credential gets nothing; the deployment CA's key stays the
server's."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbank.egress.authority import CA_DIR, KEY_FILE
from sandbank.egress.credentials import parse_credential, parse_credentials
from sandbank.egress.policy import NetworkPolicy
from sandbank.protocol.calls import BashCall, PythonCall
from sandbank.protocol.sessions import SessionSpec
from sandbank.sandbox.host import disk
from sandbank.sandbox.local import LocalSandboxes
from tests.egress.conftest import PACKAGE
from tests.egress.upstream import Upstream, make_ca, make_wheel, serve_index
from tests.sandbox.conftest import Shell
from tests.support import data_dir, settings
from tests.tiers import param

pytestmark = pytest.mark.anyio
OPERATOR_TOKEN = "sk-operator-51c2e8d07a9b4f36"
TENANT_TOKEN = "tk-tenant-0e6d93b8c4a27f15"
SESSION_TOKEN = "ss-session-8a1f4c7e2d9b6035"
KEY = "7Ydbl0o3xTmCz1vJ2n0m6Qy3oR9Zr0sF4hQm1wXk5aI="  # a test key (base64 of 32 bytes)


@dataclass
class Sites:
    tls: Upstream  # https: secure.test (the operator's credential), tenant.test, session.test
    web: Upstream  # http: allowed.test (where a redirect leads)
    ca_file: Path  # the test CA: the operator's (SANDBANK_EXTRA_CA_FILE)

    def heads_since(self, n: int) -> str:
        return "\n".join(self.tls.heads[n:] + self.web.heads)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    directory = tmp_path_factory.mktemp("ca")
    ca_file, context = make_ca(directory, ["secure.test", "tenant.test", "session.test"])
    with Upstream(context) as tls, Upstream() as web:
        serve_index(tls, PACKAGE, make_wheel(PACKAGE, "1.0", "VALUE = 42\n"))
        tls.redirects["/away"] = f"http://allowed.test:{web.port}/landed"
        yield Sites(tls, web, ca_file)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=[param("fork", "root")])
async def runtime(
    request: pytest.FixtureRequest, sites: Sites, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSandboxes]:
    port = sites.tls.port
    operator = tmp_path_factory.mktemp("operator") / "credentials.toml"
    operator.write_text(
        f'[[credential]]\nid = "models"\ndestination = "secure.test:{port}"\n'
        f'headers = {{ Authorization = "Bearer {OPERATOR_TOKEN}" }}\n'
    )
    names = ("secure.test", "tenant.test", "session.test", "allowed.test")
    with data_dir() as data:
        rt = LocalSandboxes(
            settings(
                data,
                isolation=request.param,
                cpu_limit=0.5,
                disk_limit_mb=32,
                egress_allow=",".join(
                    [f"{n}:{port}" for n in names[:3]]
                    + [f"allowed.test:{sites.web.port}", f"127.0.0.1:{port}"]
                    + [f"127.0.0.1:{sites.web.port}"]
                ),
                egress_test_hosts=",".join(f"{n}=127.0.0.1" for n in names),
                extra_ca_file=sites.ca_file,
                egress_credentials_file=operator,
                credentials_key=KEY,
            )
        )
        await rt.start()
        store = rt.backend.host.trust_store  # type: ignore[attr-defined]
        try:
            yield rt
        finally:
            await rt.close()
        # The store holding this deployment's CA is its alone: it goes with the server.
        assert store is not None and str(store) not in disk.mounts_under(store.parent)


async def test_curl_requests_httpx_urllib_and_pip_arrive_with_the_credential(
    runtime: LocalSandboxes, sites: Sites
) -> None:
    url = f"https://secure.test:{sites.tls.port}"
    before = len(sites.tls.heads)
    sb = Shell(runtime, await runtime.create("tests"))
    try:
        r = await sb.sh(f"curl -sS -H 'Authorization: Bearer mine' {url}/curl")
        assert r.stdout.startswith("hello from upstream /curl"), r
        r = await sb.py(
            "import urllib.request, requests, httpx\n"
            f"print(urllib.request.urlopen('{url}/urllib').read()[:26])\n"
            f"print(requests.get('{url}/requests', timeout=10).text[:28])\n"
            f"print(httpx.get('{url}/httpx', timeout=10).text[:25])",
            timeout=60,
        )
        assert r.return_code == 0 and r.stdout.count("hello from upstream /") == 3, r
        r = await sb.sh(
            f"PIP_INDEX_URL={url}/simple/ pip install --no-deps {PACKAGE} 2>&1", timeout=60
        )
        assert f"Successfully installed {PACKAGE}-1.0" in r.stdout, r
        heads = sites.tls.heads[before:]
        assert len(heads) >= 6, heads  # 4 clients, pip's index page and its wheel
        for head in heads:
            assert f"Authorization: Bearer {OPERATOR_TOKEN}" in head, head
            assert "Bearer mine" not in head
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_the_sandbox_never_holds_the_credential_nor_learns_it(
    runtime: LocalSandboxes, sites: Sites
) -> None:
    url = f"https://secure.test:{sites.tls.port}"
    before = len(sites.web.heads)
    sb = Shell(runtime, await runtime.create("tests"))
    try:
        # Its own process's memory, after a request that carried it.
        r = await sb.py(
            "import re, requests\n"
            f"answer = requests.get('{url}/mem', timeout=10)\n"
            # a pattern that never holds the token's bytes in a row (the source would match)
            f"needle = re.compile({''.join(f'[{c}]' for c in OPERATOR_TOKEN)!r}.encode())\n"
            # and, to show the search finds what is there, the answer's text
            f"canary = re.compile({''.join(f'[{c}]' for c in 'upstream /mem')!r}.encode())\n"
            "found = seen = 0\n"
            "with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
            "    for line in maps:\n"
            "        span, perms = line.split()[:2]\n"
            "        if 'r' not in perms: continue\n"
            "        a, b = (int(x, 16) for x in span.split('-'))\n"
            "        while a < b:\n"
            "            try:\n"
            "                mem.seek(a); chunk = mem.read(min(b - a, 1 << 20) + 64)\n"
            "                found += len(needle.findall(chunk)); seen += len(canary.findall(chunk))\n"
            "            except (OSError, ValueError, OverflowError): break\n"
            "            a += 1 << 20\n"
            "print('status', answer.status_code, 'found', found, 'seen', seen > 0)",
            timeout=60,
        )
        assert "status 200 found 0 seen True" in r.stdout, r
        # Environment, files, the proxy's own page, a redirect to a host it controls.
        r = await sb.sh(
            "env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
            "grep -rIl sk-operator /etc /tmp /workspace /home /root /run 2>/dev/null; "
            "curl -sS http://policy.sandbank.invalid/; "
            f"curl -sS -L -D - {url}/away; curl -sS -v {url}/ -H 'Host: evil.test' 2>&1",
            timeout=60,
        )
        assert OPERATOR_TOKEN not in r.stdout and OPERATOR_TOKEN[:12] not in r.stdout, r
        assert f"secure.test:{sites.tls.port} (Authorization)" in r.stdout, r
        assert "hello from upstream /landed" in r.stdout, r
        assert "421" in r.stdout
        landed = sites.web.heads[before:]
        assert len(landed) == 1 and "Authorization" not in landed[0], landed
    finally:
        await runtime.destroy(sb.session.id, "tests")


async def test_who_has_no_credential_gets_none_and_a_deleted_one_stops_applying(
    runtime: LocalSandboxes, sites: Sites
) -> None:
    port = sites.tls.port
    assert runtime.credentials.vault is not None
    runtime.credentials.vault.add(
        "alpha",
        parse_credential(
            {"destination": f"tenant.test:{port}", "headers": {"X-Api-Key": TENANT_TOKEN}},
            "tenant",
        ),
    )
    own = parse_credentials(
        [{"id": "mine", "destination": f"session.test:{port}",
          "basic": {"username": "me", "password": SESSION_TOKEN}}],
        "session", accept_id=True,
    )  # fmt: skip
    fetch = "; ".join(
        f"curl -sS -o /dev/null -w '{n} %{{http_code}}\\n' https://{n}:{port}/"
        for n in ("tenant.test", "session.test")
    )
    sessions = [
        await runtime.create("alpha", SessionSpec(credentials=own)),
        await runtime.create("beta"),
        await runtime.create(
            "alpha", SessionSpec(network=NetworkPolicy.parse([f"tenant.test:{port}"]))
        ),
        await runtime.create("alpha"),
    ]
    try:
        heads = []
        for s in sessions:
            tenant = "alpha" if s is not sessions[1] else "beta"
            before = len(sites.tls.heads)
            await runtime.execute(
                s.id,
                tenant,
                BashCall(
                    fetch
                    + "; curl -sS -o /dev/null -w 'secure %{http_code}' https://secure.test:"
                    + str(port)
                ),
                30,
            )
            heads.append(sites.heads_since(before))
        with_own, other_tenant, narrowed, plain = heads
        assert f"X-Api-Key: {TENANT_TOKEN}" in with_own and "Authorization: Basic " in with_own
        assert TENANT_TOKEN not in other_tenant and "Basic" not in other_tenant
        assert f"Bearer {OPERATOR_TOKEN}" in other_tenant  # the operator's: everyone's
        assert f"X-Api-Key: {TENANT_TOKEN}" in narrowed
        assert "Basic" not in narrowed and OPERATOR_TOKEN not in narrowed  # off its policy
        assert "Basic" not in plain and f"X-Api-Key: {TENANT_TOKEN}" in plain

        infos = await runtime.list_credentials(sessions[0].id, "alpha")
        assert [(c.id, c.names) for c in infos] == [("mine", ("Authorization",))]
        await runtime.remove_credential(sessions[0].id, "alpha", "mine")
        before = len(sites.tls.heads)
        r = await runtime.execute(sessions[0].id, "alpha", PythonCall(
            f"import requests; print(requests.get('https://session.test:{port}/', timeout=10).status_code)"
        ), 30)  # fmt: skip
        assert r.stdout == "200\n", r
        assert "Basic" not in sites.heads_since(before)
    finally:
        for s, tenant in zip(sessions, ("alpha", "beta", "alpha", "alpha"), strict=True):
            await runtime.destroy(s.id, tenant)


async def test_the_deployment_cas_key_is_unreadable_by_a_sandboxs_uid(
    runtime: LocalSandboxes,
) -> None:
    key = runtime.settings.data_dir / CA_DIR / KEY_FILE
    assert key.stat().st_mode & 0o077 == 0 and key.stat().st_uid == 0
    sb = Shell(runtime, await runtime.create("tests"))
    try:
        uid = sb.session.sandbox.uid
        assert uid != 0
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-c", f"open({str(key)!r}).read()",
            user=uid, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await probe.communicate()
        assert probe.returncode != 0 and b"PermissionError" in out, out
        r = await sb.sh(f"cat {key} 2>&1; ls {key.parent} 2>&1")
        assert "PRIVATE KEY" not in r.stdout and r.return_code != 0, r
    finally:
        await runtime.destroy(sb.session.id, "tests")
    assert os.geteuid() == 0
