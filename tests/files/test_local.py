"""Stores that serve their own presigned URLs (local, memory): signatures, expiry, size limits."""

from __future__ import annotations

import base64
import io
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from sandbank.config import Settings
from sandbank.errors import BadRequest, Forbidden, PathEscape, PayloadTooLarge
from sandbank.files import UploadReceiver, open_object_store
from sandbank.files.local import LocalObjectStore
from sandbank.files.signing import load_signing_key

pytestmark = pytest.mark.anyio
KEY = "sessions/s1/data.csv"


@pytest.fixture(params=["local", "memory"])
async def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> UploadReceiver:
    url = "memory://" if request.param == "memory" else ""
    settings = Settings(storage_url=url, data_dir=tmp_path, public_base_url="https://sb.example/")
    store = open_object_store(settings)
    assert isinstance(store, UploadReceiver)
    return store


async def body(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def test_a_signed_upload_is_accepted_and_stored(receiver: UploadReceiver) -> None:
    form = await receiver.presign_post(KEY, 10, 60)  # type: ignore[attr-defined]
    url, _, query = form.url.partition("?")
    assert url == "https://sb.example/api/uploads"
    assert dict(parse_qsl(query)) == form.fields  # the URL carries what the fields sign
    assert set(form.fields) == {"key", "policy", "signature"}
    assert receiver.verify_upload(form.fields) == (KEY, 10)
    assert await receiver.receive_upload(KEY, body(b"12345", b"67890"), 10) == 10
    assert await receiver.size(KEY) == 10  # type: ignore[attr-defined]


async def test_an_expired_upload_form_is_refused(receiver: UploadReceiver) -> None:
    form = await receiver.presign_post(KEY, 10, -5)  # type: ignore[attr-defined]
    with pytest.raises(Forbidden, match="expired"):
        receiver.verify_upload(form.fields)


def _reencode(policy_b64: str, **changes: object) -> str:
    policy = json.loads(base64.urlsafe_b64decode(policy_b64))
    policy.update(changes)
    return base64.urlsafe_b64encode(json.dumps(policy).encode()).decode()


@pytest.mark.parametrize("tamper", ["key", "policy_size", "policy_key", "signature"])
async def test_a_tampered_upload_form_is_refused(receiver: UploadReceiver, tamper: str) -> None:
    fields = dict((await receiver.presign_post(KEY, 10, 60)).fields)  # type: ignore[attr-defined]
    if tamper == "key":
        fields["key"] = "sessions/other/data.csv"
    elif tamper == "policy_size":
        fields["policy"] = _reencode(fields["policy"], max_size=10**9)
    elif tamper == "policy_key":
        fields["policy"] = _reencode(fields["policy"], key="sessions/other/data.csv")
        fields["key"] = "sessions/other/data.csv"
    else:
        fields["signature"] = "0" * 64
    with pytest.raises(Forbidden):
        receiver.verify_upload(fields)


async def test_an_incomplete_upload_form_is_a_bad_request(receiver: UploadReceiver) -> None:
    fields = dict((await receiver.presign_post(KEY, 10, 60)).fields)  # type: ignore[attr-defined]
    del fields["signature"]
    with pytest.raises(BadRequest):
        receiver.verify_upload(fields)


async def test_an_oversized_upload_stores_nothing(receiver: UploadReceiver, tmp_path: Path) -> None:
    with pytest.raises(PayloadTooLarge):
        await receiver.receive_upload(KEY, body(b"12345", b"678901"), 10)
    assert await receiver.size(KEY) is None  # type: ignore[attr-defined]
    if isinstance(receiver, LocalObjectStore):
        assert os.listdir(tmp_path / "objects" / ".tmp") == []  # no partial file left


async def test_a_signed_download_url_round_trips(receiver: UploadReceiver) -> None:
    url = await receiver.presign_get(KEY, "Résumé data.csv", 60)  # type: ignore[attr-defined]
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == "https://sb.example/api/downloads"
    query = dict(parse_qsl(parts.query))
    assert receiver.verify_download(query) == (KEY, "Résumé data.csv")

    for field, value in [("key", "sessions/x/y"), ("filename", "evil.exe"), ("signature", "0")]:
        with pytest.raises(Forbidden):
            receiver.verify_download({**query, field: value})
    with pytest.raises(Forbidden):  # a later expiry is a different signed message
        receiver.verify_download({**query, "expires": str(int(query["expires"]) + 3600)})
    with pytest.raises(BadRequest):
        receiver.verify_download({**query, "expires": "soon"})


async def test_an_expired_download_url_is_refused(receiver: UploadReceiver) -> None:
    url = await receiver.presign_get(KEY, "data.csv", -5)  # type: ignore[attr-defined]
    with pytest.raises(Forbidden, match="expired"):
        receiver.verify_download(dict(parse_qsl(urlsplit(url).query)))


# --- local store specifics ------------------------------------------------------------------


def test_the_signing_key_is_created_once_private_and_reused(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    first = load_signing_key(settings)
    path = tmp_path / "data" / "signing.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_signing_key(settings) == first and len(first) >= 64
    configured = Settings(data_dir=tmp_path / "data", signing_key="configured")
    assert load_signing_key(configured) == b"configured"


async def test_signatures_from_another_key_are_refused(tmp_path: Path) -> None:
    mine = open_object_store(Settings(data_dir=tmp_path / "a"))
    theirs = open_object_store(Settings(data_dir=tmp_path / "b"))
    assert isinstance(mine, LocalObjectStore)
    form = await theirs.presign_post(KEY, 10, 60)
    with pytest.raises(Forbidden):
        mine.verify_upload(form.fields)


async def test_symlinks_in_the_object_tree_are_not_followed(tmp_path: Path) -> None:
    store = open_object_store(Settings(data_dir=tmp_path))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (tmp_path / "objects" / "sessions").symlink_to(outside)
    (tmp_path / "objects" / "link").symlink_to(outside / "secret")

    with pytest.raises(PathEscape):
        await store.put("sessions/secret", io.BytesIO(b"overwrite"))
    with pytest.raises(PathEscape):
        await store.open("sessions/secret")
    with pytest.raises(PathEscape):
        await store.open("link")
    with pytest.raises(PathEscape):
        await store.size("link")
    assert (outside / "secret").read_bytes() == b"secret"
