"""Objects in S3 or a compatible service: boto3 in worker threads, S3's own presigning."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

import anyio.to_thread
import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sandbank.config import Settings
from sandbank.errors import BadRequest, NotFound, SandbankError
from sandbank.files.base import (
    CHUNK_SIZE,
    PresignedPost,
    check_key,
    content_disposition,
    content_type,
)

T = TypeVar("T")
_MISSING = {"404", "NoSuchKey", "NotFound"}
# A conditional write lost: the key exists, or another writer's is in progress.
_TAKEN = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_DELETE_BATCH = 1000  # DeleteObjects' limit


def parse_storage_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → ("bucket", "some/prefix/")."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise BadRequest(f"storage URL must look like s3://bucket/prefix, not {url!r}")
    prefix = parts.path.strip("/")
    return parts.netloc, f"{prefix}/" if prefix else ""


def client_from_settings(settings: Settings) -> Any:
    """A boto3 S3 client; credentials from settings, else boto3's usual chain."""
    session = boto3.session.Session(
        aws_access_key_id=settings.s3_access_key_id.get_secret_value() or None,
        aws_secret_access_key=settings.s3_secret_access_key.get_secret_value() or None,
        region_name=settings.s3_region or None,
    )
    # Path-style addressing for custom endpoints: MinIO and friends rarely do virtual hosts.
    s3_options = {"addressing_style": "path"} if settings.s3_endpoint_url else {}
    config = Config(signature_version="s3v4", s3=s3_options, retries={"mode": "standard"})
    return session.client("s3", endpoint_url=settings.s3_endpoint_url or None, config=config)


@contextmanager
def _translated(key: str) -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            raise NotFound(f"no object {key}") from None
        raise SandbankError(f"object storage error: {code or 'unknown'}") from exc
    except BotoCoreError as exc:
        raise SandbankError(f"object storage unreachable: {exc.__class__.__name__}") from exc


class S3ObjectStore:
    """Objects in an S3-compatible bucket, with S3's own presigned URLs."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix

    def _full(self, key: str) -> str:
        check_key(key)
        return self._prefix + key

    async def _call(self, key: str, fn: Callable[[], T]) -> T:
        def run() -> T:
            with _translated(key):
                return fn()

        return await anyio.to_thread.run_sync(run)

    async def put(self, key: str, source: BinaryIO | Path, size: int | None = None) -> None:
        full = self._full(key)
        if isinstance(source, Path):
            await self._call(key, lambda: self._client.upload_file(str(source), self._bucket, full))
        else:
            await self._call(key, lambda: self._client.upload_fileobj(source, self._bucket, full))

    async def put_new(self, key: str, data: bytes) -> bool:
        full = self._full(key)

        def put() -> bool:
            try:
                self._client.put_object(Bucket=self._bucket, Key=full, Body=data, IfNoneMatch="*")
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code", "")) in _TAKEN:
                    return False
                raise
            return True

        return await self._call(key, put)

    async def open(self, key: str) -> AsyncIterator[bytes]:
        full = self._full(key)
        response = await self._call(
            key, lambda: self._client.get_object(Bucket=self._bucket, Key=full)
        )
        return self._stream(key, response["Body"])

    async def _stream(self, key: str, body: Any) -> AsyncIterator[bytes]:
        try:
            while chunk := await self._call(key, lambda: body.read(CHUNK_SIZE)):
                yield chunk
        finally:
            body.close()

    async def size(self, key: str) -> int | None:
        full = self._full(key)
        try:
            head = await self._call(
                key, lambda: self._client.head_object(Bucket=self._bucket, Key=full)
            )
        except NotFound:
            return None
        return int(head["ContentLength"])

    async def copy_to(self, key: str, dest: Path) -> int:
        full = self._full(key)

        def download() -> int:
            self._client.download_file(self._bucket, full, str(dest))
            return dest.stat().st_size

        return await self._call(key, download)

    async def delete(self, key: str) -> None:
        full = self._full(key)
        await self._call(key, lambda: self._client.delete_object(Bucket=self._bucket, Key=full))

    async def delete_prefix(self, prefix: str) -> int:
        return await self._call(prefix, lambda: self._delete_prefix_sync(self._prefix + prefix))

    def _delete_prefix_sync(self, full_prefix: str) -> int:
        paginator = self._client.get_paginator("list_objects_v2")
        keys = [
            obj["Key"]
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full_prefix)
            for obj in page.get("Contents", [])
        ]
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[start : start + _DELETE_BATCH]]
            self._client.delete_objects(
                Bucket=self._bucket, Delete={"Objects": batch, "Quiet": True}
            )
        return len(keys)

    async def presign_post(self, key: str, max_size: int, expires_s: int) -> PresignedPost:
        full = self._full(key)
        # boto3 adds the bucket and exact-key conditions itself; S3 enforces the size range.
        form = await self._call(
            key,
            lambda: self._client.generate_presigned_post(
                Bucket=self._bucket,
                Key=full,
                Conditions=[["content-length-range", 0, max_size]],
                ExpiresIn=expires_s,
            ),
        )
        return PresignedPost(url=form["url"], fields={k: str(v) for k, v in form["fields"].items()})

    async def presign_get(self, key: str, filename: str, expires_s: int) -> str:
        params = {
            "Bucket": self._bucket,
            "Key": self._full(key),
            "ResponseContentDisposition": content_disposition(filename),
            "ResponseContentType": content_type(filename),
        }
        url = await self._call(
            key,
            lambda: self._client.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=expires_s
            ),
        )
        return str(url)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)
