"""Uploaded and produced files: the `ObjectStore` interface, its chooser, and filename rules."""

from __future__ import annotations

from sandbank.config import Settings
from sandbank.errors import BadRequest
from sandbank.files.base import (
    ObjectStore,
    PresignedPost,
    UploadReceiver,
    content_disposition,
    content_type,
    object_key,
    session_prefix,
)
from sandbank.files.names import validate_filename, validate_stored_name

__all__ = [
    "ObjectStore",
    "PresignedPost",
    "UploadReceiver",
    "content_disposition",
    "content_type",
    "object_key",
    "open_object_store",
    "session_prefix",
    "validate_filename",
    "validate_stored_name",
]


def open_object_store(settings: Settings) -> ObjectStore:
    """The store `storage_url` names: empty → DATA_DIR/objects, `s3://…`, or `memory://`."""
    url = settings.storage_url
    if url.startswith("s3://"):
        from sandbank.files.s3 import S3ObjectStore, client_from_settings, parse_storage_url

        bucket, prefix = parse_storage_url(url)
        return S3ObjectStore(client_from_settings(settings), bucket, prefix)

    from sandbank.files.signing import UrlSigner, load_signing_key, public_base_url

    signer = UrlSigner(load_signing_key(settings), public_base_url(settings))
    if url == "memory://":
        from sandbank.files.memory import MemoryObjectStore

        return MemoryObjectStore(signer)
    if url:
        raise BadRequest(f"unsupported storage URL {url!r}: use s3://bucket/prefix or leave empty")
    from sandbank.files.local import LocalObjectStore

    return LocalObjectStore(settings.data_dir / "objects", signer)
