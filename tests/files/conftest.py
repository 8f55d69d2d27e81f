"""Fixtures: an `object_store` of every kind, and a moto S3 server for the S3 one."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from sandbank.config import Settings
from sandbank.files import ObjectStore, open_object_store
from tests.postgres import free_port
from tests.tiers import needs, param


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
@needs("s3")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server in its own process (its warnings stay out of this one)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(endpoint + "/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    stderr = proc.stderr.read() if proc.stderr else b""
                    pytest.fail(f"moto server did not start: {stderr.decode()[-2000:]}")
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


def s3_settings(endpoint: str, tmp_path: Path) -> Settings:
    """Settings for a new, empty bucket on the moto server."""
    bucket = f"sandbank-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    return Settings(
        storage_url=f"s3://{bucket}/prefix",
        s3_endpoint_url=endpoint,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
        data_dir=tmp_path,
    )


@pytest.fixture(params=["local", param("s3", "s3"), "memory"])
def storage_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "s3":
        return s3_settings(request.getfixturevalue("moto_endpoint"), tmp_path)
    url = "memory://" if request.param == "memory" else ""
    return Settings(storage_url=url, data_dir=tmp_path, public_base_url="https://sb.example")


@pytest.fixture
async def object_store(storage_settings: Settings) -> AsyncIterator[ObjectStore]:
    store = open_object_store(storage_settings)
    try:
        yield store
    finally:
        await store.close()
