"""Objects as files under DATA_DIR/objects, with presigned URLs served by this server."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO

import anyio.to_thread

from sandbank.errors import NotFound, PathEscape, PayloadTooLarge, StorageFull
from sandbank.files.base import CHUNK_SIZE, check_key
from sandbank.files.signing import SignedUrls, UrlSigner

TMP_DIR = ".tmp"  # beside the objects, so a finished file is renamed into place atomically


class LocalObjectStore(SignedUrls):
    """Objects as files under the data directory, with signed URLs to this server."""

    def __init__(self, root: Path, signer: UrlSigner) -> None:
        self._root = root.resolve()
        self._signer = signer
        (self._root / TMP_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)

    # --- paths -------------------------------------------------------------------------------
    def _path(self, key: str, *, create_parents: bool = False) -> Path:
        """The file for `key`; refuses any symlink on the way (none is ever made here)."""
        parts = check_key(key)
        current = self._root
        for part in parts[:-1]:
            current = current / part
            if current.is_symlink():
                raise PathEscape("object path crosses a symlink")
            if create_parents:
                current.mkdir(exist_ok=True)
        return current / parts[-1]

    def _temp(self) -> tuple[int, Path]:
        fd, name = tempfile.mkstemp(dir=self._root / TMP_DIR)
        return fd, Path(name)

    def _commit(self, temp: Path, key: str) -> None:
        # rename() replaces a symlink at the destination rather than following it.
        os.replace(temp, self._path(key, create_parents=True))

    # --- ObjectStore ---------------------------------------------------------------------------
    async def put(self, key: str, source: BinaryIO | Path, size: int | None = None) -> None:
        check_key(key)  # refuse a bad key before doing any work
        with _full_is_storage_full():
            await anyio.to_thread.run_sync(self._put_sync, key, source)

    def _put_sync(self, key: str, source: BinaryIO | Path) -> None:
        fd, temp = self._temp()
        try:
            with os.fdopen(fd, "wb") as out:
                if isinstance(source, Path):
                    with source.open("rb") as src:
                        shutil.copyfileobj(src, out, CHUNK_SIZE)
                else:
                    shutil.copyfileobj(source, out, CHUNK_SIZE)
            self._commit(temp, key)
        finally:
            temp.unlink(missing_ok=True)

    async def put_new(self, key: str, data: bytes) -> bool:
        check_key(key)
        with _full_is_storage_full():
            return await anyio.to_thread.run_sync(self._put_new_sync, key, data)

    def _put_new_sync(self, key: str, data: bytes) -> bool:
        fd, temp = self._temp()
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            try:
                # link() never replaces: of two processes, one makes the name, the other fails.
                os.link(temp, self._path(key, create_parents=True))
            except FileExistsError:
                return False
            return True
        finally:
            temp.unlink(missing_ok=True)

    def _open_fd(self, key: str) -> int:
        try:
            return os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotFound(f"no object {key}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathEscape("object is a symlink") from None
            raise

    async def open(self, key: str) -> AsyncIterator[bytes]:
        fd = await anyio.to_thread.run_sync(self._open_fd, key)
        return _read_chunks(os.fdopen(fd, "rb"))

    async def size(self, key: str) -> int | None:
        return await anyio.to_thread.run_sync(self._size_sync, key)

    def _size_sync(self, key: str) -> int | None:
        try:
            stat = os.lstat(self._path(key))
        except FileNotFoundError:
            return None
        if not S_ISREG(stat.st_mode):
            raise PathEscape("object is not a regular file")
        return stat.st_size

    async def copy_to(self, key: str, dest: Path) -> int:
        def copy() -> int:
            with os.fdopen(self._open_fd(key), "rb") as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out, CHUNK_SIZE)
                return out.tell()

        return await anyio.to_thread.run_sync(copy)

    async def delete(self, key: str) -> None:
        await anyio.to_thread.run_sync(lambda: self._path(key).unlink(missing_ok=True))

    async def delete_prefix(self, prefix: str) -> int:
        return await anyio.to_thread.run_sync(self._delete_prefix_sync, prefix)

    def _delete_prefix_sync(self, prefix: str) -> int:
        # Only the directory holding the prefix's last segment needs walking.
        directory, _, _ = prefix.rpartition("/")
        top = self._path(directory + "/x").parent if directory else self._root
        removed = 0
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            here = Path(dirpath)
            if here == self._root:
                dirnames[:] = [d for d in dirnames if d != TMP_DIR]
            for name in filenames:
                key = (here / name).relative_to(self._root).as_posix()
                if key.startswith(prefix) and not key.startswith(TMP_DIR + "/"):
                    (here / name).unlink(missing_ok=True)
                    removed += 1
            if here != self._root and here != self._root / TMP_DIR:
                with contextlib.suppress(OSError):
                    here.rmdir()  # only succeeds once empty
        return removed

    async def close(self) -> None:
        pass

    async def receive_upload(self, key: str, chunks: AsyncIterable[bytes], max_size: int) -> int:
        check_key(key)
        with _full_is_storage_full():
            fd, temp = await anyio.to_thread.run_sync(self._temp)
        try:
            received = 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in chunks:
                    received += len(chunk)
                    if received > max_size:
                        raise PayloadTooLarge(f"upload exceeds {max_size} bytes")
                    with _full_is_storage_full():
                        await anyio.to_thread.run_sync(out.write, chunk)
            with _full_is_storage_full():
                await anyio.to_thread.run_sync(self._commit, temp, key)
            return received
        finally:
            # Shielded: a client that hangs up mid-upload still leaves no partial file.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: temp.unlink(missing_ok=True))


@contextlib.contextmanager
def _full_is_storage_full() -> Iterator[None]:
    """A full file system (or quota) is the server's storage being full: a clear 507."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(
                "the server's storage is full: the file was not stored; retry later"
            ) from None
        raise


async def _read_chunks(file: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while chunk := await anyio.to_thread.run_sync(file.read, CHUNK_SIZE):
            yield chunk
    finally:
        file.close()
