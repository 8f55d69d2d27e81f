"""S3 specifics against moto: the presigned POST's policy, a real form upload, the GET URL."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from sandbank.files import open_object_store
from sandbank.files.s3 import parse_storage_url
from tests.files.conftest import s3_settings

pytestmark = pytest.mark.anyio


async def test_presigned_post_fixes_the_key_and_bounds_the_size(
    moto_endpoint: str, tmp_path: Path
) -> None:
    store = open_object_store(s3_settings(moto_endpoint, tmp_path))
    form = await store.presign_post("sessions/s1/data.csv", 1000, 60)

    assert form.fields["key"] == "prefix/sessions/s1/data.csv"
    policy = json.loads(base64.b64decode(form.fields["policy"]))
    conditions = policy["conditions"]
    assert {"key": "prefix/sessions/s1/data.csv"} in conditions
    assert ["content-length-range", 0, 1000] in conditions

    # moto does not enforce policies, so this shows the form is well-formed, not the limit.
    async with httpx.AsyncClient() as client:
        response = await client.post(
            form.url, data=form.fields, files={"file": ("data.csv", b"a,b\n1,2\n")}
        )
    assert response.status_code in (200, 201, 204), response.text
    chunks = [c async for c in await store.open("sessions/s1/data.csv")]
    assert b"".join(chunks) == b"a,b\n1,2\n"
    await store.close()


async def test_presigned_get_downloads_as_an_attachment(moto_endpoint: str, tmp_path: Path) -> None:
    store = open_object_store(s3_settings(moto_endpoint, tmp_path))
    await store.put("sessions/s1/plot.png", io.BytesIO(b"\x89PNG"))
    url = await store.presign_get("sessions/s1/plot.png", "plot.png", 60)

    query = parse_qs(urlsplit(url).query)
    assert query["response-content-disposition"][0].startswith('attachment; filename="plot.png"')
    assert query["response-content-type"] == ["image/png"]
    async with httpx.AsyncClient() as client:
        response = await client.get(url)
    assert response.status_code == 200
    assert response.headers["content-disposition"].startswith("attachment")
    await store.close()


def test_storage_urls_parse_into_bucket_and_prefix() -> None:
    assert parse_storage_url("s3://bucket") == ("bucket", "")
    assert parse_storage_url("s3://bucket/a/b/") == ("bucket", "a/b/")
