"""An in-memory `ObjectStore` for tests, signing URLs like the local store."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import BinaryIO

import anyio.to_thread

from sandbank.errors import NotFound, PayloadTooLarge
from sandbank.files.base import CHUNK_SIZE, check_key
from sandbank.files.signing import SignedUrls, UrlSigner


class MemoryObjectStore(SignedUrls):
    """Objects in memory (tests), with signed URLs to this server."""

    def __init__(self, signer: UrlSigner | None = None) -> None:
        self._signer = signer or UrlSigner(b"memory-store-key", "http://testserver")
        self._objects: dict[str, bytes] = {}

    async def put(self, key: str, source: BinaryIO | Path, size: int | None = None) -> None:
        check_key(key)
        if isinstance(source, Path):
            self._objects[key] = await anyio.to_thread.run_sync(source.read_bytes)
        else:
            self._objects[key] = await anyio.to_thread.run_sync(source.read)

    async def put_new(self, key: str, data: bytes) -> bool:
        check_key(key)
        if key in self._objects:
            return False
        self._objects[key] = data
        return True

    def _get(self, key: str) -> bytes:
        check_key(key)
        try:
            return self._objects[key]
        except KeyError:
            raise NotFound(f"no object {key}") from None

    async def open(self, key: str) -> AsyncIterator[bytes]:
        data = self._get(key)

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), CHUNK_SIZE):
                yield data[start : start + CHUNK_SIZE]

        return chunks()

    async def size(self, key: str) -> int | None:
        check_key(key)
        data = self._objects.get(key)
        return None if data is None else len(data)

    async def copy_to(self, key: str, dest: Path) -> int:
        data = self._get(key)
        await anyio.to_thread.run_sync(dest.write_bytes, data)
        return len(data)

    async def delete(self, key: str) -> None:
        check_key(key)
        self._objects.pop(key, None)

    async def delete_prefix(self, prefix: str) -> int:
        doomed = [k for k in self._objects if k.startswith(prefix)]
        for key in doomed:
            del self._objects[key]
        return len(doomed)

    async def close(self) -> None:
        pass

    async def receive_upload(self, key: str, chunks: AsyncIterable[bytes], max_size: int) -> int:
        check_key(key)
        parts: list[bytes] = []
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            if received > max_size:
                raise PayloadTooLarge(f"upload exceeds {max_size} bytes")
            parts.append(chunk)
        self._objects[key] = b"".join(parts)
        return received
