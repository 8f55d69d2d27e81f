"""Signed upload forms and download URLs pointing back at this server, and the key signing them."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlencode

from sandbank.config import Settings
from sandbank.errors import BadRequest, Forbidden
from sandbank.files.base import PresignedPost, check_key

UPLOAD_PATH = "/api/uploads"
DOWNLOAD_PATH = "/api/downloads"


def public_base_url(settings: Settings) -> str:
    return settings.public_base_url.rstrip("/") or f"http://{settings.host}:{settings.port}"


def load_signing_key(settings: Settings) -> bytes:
    """The configured key, else the one in DATA_DIR/signing.key, created on first use."""
    configured = settings.signing_key.get_secret_value()
    if configured:
        return configured.encode()
    path = settings.data_dir / "signing.key"
    if not path.exists():
        _create_key_file(path)
    key = path.read_text().strip()
    if not key:
        raise BadRequest(f"{path} is empty")
    return key.encode()


def _create_key_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".signing.key.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        # link() fails if another process won the race: then both use the winner's key.
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        temp.unlink()


class UrlSigner:
    """HMAC-SHA256 over a purpose tag and the signed values; comparisons are constant-time."""

    def __init__(self, key: bytes, base_url: str) -> None:
        self._key = key
        self._base_url = base_url.rstrip("/")

    def _sign(self, purpose: str, payload: str) -> str:
        message = f"{purpose}\n{payload}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _check(self, purpose: str, payload: str, signature: str) -> None:
        if not hmac.compare_digest(self._sign(purpose, payload), signature):
            raise Forbidden("invalid signature")

    def upload_form(self, key: str, max_size: int, expires_s: int) -> PresignedPost:
        policy = {"key": key, "expires": int(time.time()) + expires_s, "max_size": max_size}
        encoded = base64.urlsafe_b64encode(json.dumps(policy).encode()).decode()
        fields = {"key": key, "policy": encoded, "signature": self._sign("upload", encoded)}
        # The signed fields ride in the URL too: the server checks them before it reads a
        # byte of the body (in the body, as S3 has them, they could only be read after it).
        return PresignedPost(
            url=f"{self._base_url}{UPLOAD_PATH}?{urlencode(fields)}", fields=fields
        )

    def verify_upload(self, fields: Mapping[str, str]) -> tuple[str, int]:
        key, encoded, signature = _required(fields, "key", "policy", "signature")
        self._check("upload", encoded, signature)
        try:
            policy = json.loads(base64.urlsafe_b64decode(encoded))
            signed_key, expires, max_size = policy["key"], policy["expires"], policy["max_size"]
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise Forbidden("malformed upload policy") from None
        if not hmac.compare_digest(str(signed_key).encode(), key.encode()):
            raise Forbidden("the key is not the one the policy allows")
        if int(expires) < time.time():
            raise Forbidden("the upload form has expired")
        return key, int(max_size)

    def download_url(self, key: str, filename: str, expires_s: int) -> str:
        expires = int(time.time()) + expires_s
        query = {
            "key": key,
            "expires": str(expires),
            "filename": filename,
            "signature": self._sign("download", json.dumps([key, expires, filename])),
        }
        return f"{self._base_url}{DOWNLOAD_PATH}?{urlencode(query)}"

    def verify_download(self, query: Mapping[str, str]) -> tuple[str, str]:
        key, expires_text, filename, signature = _required(
            query, "key", "expires", "filename", "signature"
        )
        try:
            expires = int(expires_text)
        except ValueError:
            raise BadRequest("expires must be an integer") from None
        self._check("download", json.dumps([key, expires, filename]), signature)
        if expires < time.time():
            raise Forbidden("the download URL has expired")
        return key, filename


def _required(values: Mapping[str, str], *names: str) -> list[str]:
    missing = [n for n in names if not values.get(n)]
    if missing:
        raise BadRequest(f"missing {', '.join(missing)}")
    return [values[n] for n in names]


class SignedUrls:
    """Presigned forms and links this server signs and checks itself (local and memory storage)."""

    _signer: UrlSigner

    async def presign_post(self, key: str, max_size: int, expires_s: int) -> PresignedPost:
        check_key(key)
        return self._signer.upload_form(key, max_size, expires_s)

    async def presign_get(self, key: str, filename: str, expires_s: int) -> str:
        check_key(key)
        return self._signer.download_url(key, filename, expires_s)

    def verify_upload(self, fields: Mapping[str, str]) -> tuple[str, int]:
        return self._signer.verify_upload(fields)

    def verify_download(self, query: Mapping[str, str]) -> tuple[str, str]:
        return self._signer.verify_download(query)
