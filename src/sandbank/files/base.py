"""Object-store vocabulary: keys, presigned forms, the ObjectStore and UploadReceiver Protocols."""

from __future__ import annotations

import mimetypes
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable
from urllib.parse import quote

from sandbank.errors import BadRequest, PathEscape

CHUNK_SIZE = 256 * 1024
MAX_KEY_BYTES = 1024  # S3's limit, applied everywhere so every backend accepts the same keys


@dataclass(frozen=True)
class PresignedPost:
    """What a client needs to upload one object with a multipart/form-data POST."""

    url: str
    fields: dict[str, str] = field(default_factory=dict)


def object_key(session_id: str, filename: str) -> str:
    return f"{session_prefix(session_id)}{filename}"


def session_prefix(session_id: str) -> str:
    return f"sessions/{session_id}/"


def check_key(key: str) -> list[str]:
    """The key's segments; refuses keys that could leave the store's root or hide in it."""
    if not key or len(key.encode()) > MAX_KEY_BYTES or "\x00" in key:
        raise BadRequest("invalid object key")
    parts = key.split("/")
    # A leading dot covers `.`, `..` and the local store's own `.tmp`; an empty part covers
    # absolute keys and `//`.
    if any(not p or p.startswith(".") for p in parts):
        raise PathEscape("object key must be relative, without dot segments")
    return parts


def content_type(filename: str) -> str:
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"


def content_disposition(filename: str) -> str:
    """`attachment` with an ASCII fallback and the exact UTF-8 name (RFC 6266)."""
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


class ObjectStore(Protocol):
    """Bytes by key. Keys are `/`-separated relative paths (see `check_key`)."""

    async def put(self, key: str, source: BinaryIO | Path, size: int | None = None) -> None:
        """Store the bytes of an open binary file (from its position) or of a file path.

        `size`, when known, lets backends skip measuring; the object appears whole or not at all.
        """
        ...

    async def put_new(self, key: str, data: bytes) -> bool:
        """Store a small object only if no object has this key: False when one has. Atomic
        across every process on the store (S3's conditional write), so it claims a key once."""
        ...

    async def open(self, key: str) -> AsyncIterator[bytes]:
        """The object's bytes in chunks; raises `NotFound` now (not mid-stream) when missing."""
        ...

    async def size(self, key: str) -> int | None: ...

    async def copy_to(self, key: str, dest: Path) -> int:
        """Write the object to a local file (e.g. into a sandbox workspace); returns its size."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the object; removing a missing one is not an error."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with `prefix`; returns how many."""
        ...

    async def presign_post(self, key: str, max_size: int, expires_s: int) -> PresignedPost:
        """A form that lets its holder upload at most `max_size` bytes to exactly `key`."""
        ...

    async def presign_get(self, key: str, filename: str, expires_s: int) -> str:
        """A URL that downloads the object as an attachment named `filename`."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class UploadReceiver(Protocol):
    """Stores whose presigned URLs point back at this server (`/api/uploads`, `/api/downloads`)."""

    def verify_upload(self, fields: Mapping[str, str]) -> tuple[str, int]:
        """(key, max_size) of a signed upload form; `Forbidden` when expired or tampered."""
        ...

    def verify_download(self, query: Mapping[str, str]) -> tuple[str, str]:
        """(key, filename) of a signed download URL; `Forbidden` when expired or tampered."""
        ...

    async def receive_upload(self, key: str, chunks: AsyncIterable[bytes], max_size: int) -> int:
        """Store a streamed body; `PayloadTooLarge` past `max_size`, storing nothing."""
        ...
