"""Fixtures: loopback upstreams standing in for the world, and a runtime whose operator policy
lists them (names answered by the proxy's test resolver, 127.0.0.1 listed explicitly)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbank.sandbox.local import LocalSandboxes
from tests.egress.upstream import Upstream, make_ca, make_wheel, serve_index
from tests.support import data_dir, settings
from tests.tiers import param

PACKAGE = "sbtestpkg"  # depends on numpy, which the runtime image has: it is not reinstalled


@dataclass
class World:
    web: Upstream  # http://allowed.test
    tls: Upstream  # https://secure.test, with the package index
    other: Upstream  # private.test: a listed name whose address the operator did not list
    ca_pem: str

    def policy(self) -> str:
        return (
            f"allowed.test:{self.web.port},secure.test:{self.tls.port},"
            f"private.test:{self.other.port},127.0.0.1:{self.web.port},127.0.0.1:{self.tls.port}"
        )


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    ca_file, context = make_ca(tmp_path_factory.mktemp("ca"), ["secure.test"])
    with Upstream() as web, Upstream(context) as tls, Upstream() as other:
        wheel = make_wheel(PACKAGE, "1.0", "import numpy\nVALUE = 42\n", requires=("numpy",))
        serve_index(tls, PACKAGE, wheel)
        yield World(web, tls, other, ca_file.read_text())


@pytest.fixture(scope="module")
def module_data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


# gvisor too when named (`SANDBANK_TEST_BACKENDS=gvisor`): the suite's budget runs it in
# tests/sandbox/test_gvisor.py alone by default.
ISOLATIONS = ["bwrap", "fork"] + (
    ["gvisor"] if "gvisor" in os.environ.get("SANDBANK_TEST_BACKENDS", "").split(",") else []
)


@pytest.fixture(scope="module", params=[param(i, "root", id=i) for i in ISOLATIONS])
async def runtime(
    request: pytest.FixtureRequest, module_data: Path, world: World
) -> AsyncIterator[LocalSandboxes]:
    rt = LocalSandboxes(
        settings(
            module_data,
            isolation=request.param,
            cpu_limit=0.5,
            disk_limit_mb=32,
            egress_allow=world.policy(),
            egress_test_hosts="allowed.test=127.0.0.1,secure.test=127.0.0.1,"
            "private.test=127.0.0.1,evil.test=127.0.0.1",
        )
    )
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()
