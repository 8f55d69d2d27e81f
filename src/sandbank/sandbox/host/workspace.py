"""The server's own file operations on a workspace, which never follow a path out of it.

Sandboxed code controls every name in the workspace and can plant symlinks (`ln -s / root`),
FIFOs or swap a directory mid-operation. So every operation walks from the workspace's
directory descriptor one component at a time with O_NOFOLLOW, refuses `..`, and works on
descriptors, not path strings. Symlinks are refused, even ones pointing inside.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ...errors import (
    BadRequest,
    Conflict,
    Forbidden,
    IsADirectory,
    NotFound,
    PathEscape,
    PayloadTooLarge,
    SandbankError,
)
from ...protocol.sessions import FileEntry
from ..inside.protocol import disk_name, display_name

SANDBOX_ROOT = "/workspace"  # how sandboxed code (and clients) name the workspace
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_NAME = 255


def split(path: str) -> list[str]:
    """A client's path as workspace-relative components; anything escaping is refused."""
    if "\x00" in path:
        raise BadRequest("the path contains a NUL byte")
    if path.startswith("/"):
        if path == SANDBOX_ROOT or path.startswith(SANDBOX_ROOT + "/"):
            path = path[len(SANDBOX_ROOT) :]
        else:
            raise PathEscape(f"{path!r} is outside the session workspace ({SANDBOX_ROOT})")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(f"{path!r} escapes the session workspace")
    if any(len(p.encode()) > _MAX_NAME for p in parts):
        raise BadRequest("a path component is longer than 255 bytes")
    return parts


class TransferAborted(Exception):
    """The file's session was destroyed while the file was being sent or received."""


class OpenFile:
    """A workspace file the server holds open for a client; `close` may come from any thread.

    A session's open files are closed when it is destroyed, so a slow or stalled client can
    never keep the workspace's disk (and its loop device) busy after the session is gone.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self.closed = False

    def read(self, size: int) -> bytes:
        with self._lock:
            if self.closed:
                raise TransferAborted
            return os.read(self.fd, size)

    def write(self, data: bytes) -> None:
        with self._lock:
            if self.closed:
                raise TransferAborted
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self.fd)


F = TypeVar("F", bound=Callable[..., Any])


def _translating(method: F) -> F:
    """Any OSError the operation meets (the workspace is changed by hostile code) is a 4xx."""

    @functools.wraps(method)
    def wrapper(self: Workspace, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            shown = args[0] if args and isinstance(args[0], str) else "the workspace"
            raise translate_oserror(e, shown) from None

    return wrapper  # type: ignore[return-value]


class Workspace:
    """The server's file operations on one workspace, from its root's directory descriptor."""

    def __init__(self, root: Path, uid: int | None) -> None:
        self.root = root
        self.uid = uid  # files the server writes belong to the session's user

    @contextlib.contextmanager
    def _dir(self, parts: list[str], create: bool = False) -> Iterator[int]:
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for shown in parts:
                name = _on_disk(fd, shown)
                try:
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise NotFound(f"no such directory: {'/'.join(parts)}") from None
                    os.mkdir(name, 0o755, dir_fd=fd)
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    if self.uid is not None:
                        os.fchown(nxt, self.uid, self.uid)
                except OSError as e:
                    if e.errno in (errno.ENOTDIR, errno.ELOOP):
                        _lstat(fd, name, "/".join(parts))  # a symlink: refused as an escape
                    raise translate_oserror(e, "/".join(parts)) from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    @_translating
    def list(self, path: str, limit: int) -> tuple[list[FileEntry], bool]:
        """One level of the directory at `path` (or that single file); and whether it was cut."""
        parts = split(path)
        if parts:
            with self._dir(parts[:-1]) as parent:
                st = _lstat(parent, _on_disk(parent, parts[-1]), "/".join(parts))
                if stat.S_ISREG(st.st_mode):
                    return [FileEntry("/".join(parts), st.st_size, st.st_mtime)], False
        entries: list[FileEntry] = []
        truncated = False
        with self._dir(parts) as fd, os.scandir(fd) as it:
            prefix = "/".join(parts)
            for de in it:
                try:
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue
                shown = display_name(de.name)
                rel = f"{prefix}/{shown}" if prefix else shown
                if stat.S_ISREG(st.st_mode):
                    entry = FileEntry(rel, st.st_size, st.st_mtime)
                elif stat.S_ISDIR(st.st_mode):
                    entry = FileEntry(rel, 0, st.st_mtime, is_dir=True)
                else:
                    continue  # symlinks, FIFOs, sockets: nothing the server serves
                if len(entries) >= limit:
                    truncated = True
                    break
                entries.append(entry)
        entries.sort(key=lambda e: e.path)
        return entries, truncated

    @_translating
    def open_file(self, path: str) -> tuple[int, os.stat_result]:
        """A read descriptor on a regular file inside the workspace, and its stat."""
        parts = split(path)
        if not parts:
            raise IsADirectory("the path is the workspace directory, not a file")
        with self._dir(parts[:-1]) as parent:
            try:
                fd = os.open(
                    _on_disk(parent, parts[-1]),
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=parent,
                )
            except OSError as e:
                raise translate_oserror(e, path) from None
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise IsADirectory(f"{path!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotFound(f"{path!r} is not a regular file")
        return fd, st

    @_translating
    def write_file(self, path: str, chunks: Iterator[bytes], max_bytes: int) -> int:
        """Write a whole file (to a temporary name, renamed on success); nothing left on failure."""
        parts = split(path)
        if not parts:
            raise BadRequest("a file path is required")
        name = parts[-1]
        with self._dir(parts[:-1], create=True) as parent:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectory(f"{path!r} is a directory")
            tmp = f".sandbank-upload-{secrets.token_hex(6)}"
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                dir_fd=parent,
            )  # fmt: skip
            size = 0
            try:
                if self.uid is not None:
                    os.fchown(fd, self.uid, self.uid)
                for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise PayloadTooLarge(
                            f"the file is larger than the cap of {max_bytes} bytes"
                        )
                    os.write(fd, chunk)
                os.close(fd)
                fd = -1
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
        return size

    # --- staged writes: bytes land under a hidden name first, moved in place when complete ---
    @_translating
    def stage(self) -> tuple[str, int]:
        """A new hidden file at the workspace root, open for writing, owned by the session."""
        name = f".sandbank-upload-{secrets.token_hex(8)}"
        with self._dir([]) as root:
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                dir_fd=root,
            )  # fmt: skip
        if self.uid is not None:
            os.fchown(fd, self.uid, self.uid)
        return name, fd

    @_translating
    def commit(self, staged: str, path: str) -> str:
        """Move a staged file to `path` (parents created); returns the workspace-relative path."""
        try:
            parts = split(path)
            if not parts:
                raise BadRequest("a file path is required")
            with self._dir([]) as root, self._dir(parts[:-1], create=True) as parent:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        raise IsADirectory(f"{path!r} is a directory")
                os.rename(staged, parts[-1], src_dir_fd=root, dst_dir_fd=parent)
        except BaseException:
            self.discard(staged)
            raise
        return "/".join(parts)

    def discard(self, staged: str) -> None:
        with contextlib.suppress(OSError), self._dir([]) as root:
            os.unlink(staged, dir_fd=root)


def _on_disk(parent: int, shown: str) -> str:
    """The entry's name on disk: as given, or decoded from `\\xNN` escapes if only that exists."""
    raw = disk_name(shown)
    if raw is None:
        return shown
    try:
        os.stat(shown, dir_fd=parent, follow_symlinks=False)
        return shown
    except OSError:
        return raw


@contextlib.contextmanager
def translated(shown: str) -> Iterator[None]:
    """OSErrors of a workspace operation as errors of our tree (never a bare 500)."""
    try:
        yield
    except OSError as e:
        raise translate_oserror(e, shown) from None


def _lstat(parent: int, name: str, shown: str) -> os.stat_result:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as e:
        raise translate_oserror(e, shown) from None
    if stat.S_ISLNK(st.st_mode):
        raise PathEscape(f"{shown!r} is a symbolic link; links are not followed")
    return st


def translate_oserror(e: OSError, shown: str) -> SandbankError:
    """An OSError of a workspace operation as an error of our tree, naming what was touched."""
    if e.errno == errno.ENOENT:
        return NotFound(f"no such file or directory: {shown!r}")
    if e.errno in (errno.ELOOP, errno.EMLINK):
        return PathEscape(f"{shown!r} goes through a symbolic link; links are not followed")
    if e.errno == errno.ENOTDIR:
        return NotFound(f"{shown!r}: a component is not a directory")
    if e.errno == errno.EISDIR:
        return IsADirectory(f"{shown!r} is a directory")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return PayloadTooLarge("the session's workspace disk is full (no space or no inodes left)")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return Forbidden(f"{shown!r}: permission denied in the workspace")
    if e.errno == errno.ENAMETOOLONG:
        return BadRequest(f"{shown!r}: a name is too long")
    # The workspace changed under the operation (sandboxed code swapped a name, say).
    return Conflict(f"{shown!r}: the workspace changed during the operation ({e.strerror})")
