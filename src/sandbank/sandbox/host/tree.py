"""The server's operations on a workspace's tree: stat, list deep, make, move, remove.

As every workspace operation (`workspace.py`): walked from the root's descriptor, one component
at a time with O_NOFOLLOW, never through a symlink; a symlink is described (its target read
with readlinkat), never followed, and a removal never leaves the directory it was asked for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator

from ...errors import AlreadyExists, BadRequest, NotFound
from ...protocol.filesystem import EntryKind, FsEntry
from ..inside.protocol import display_name
from .workspace import Workspace, _lstat, _on_disk, _translating, split, translate_oserror

MAX_ENTRIES = 10000  # a listing stops there
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Tree(Workspace):
    """A workspace's tree; `owners` names the uids of its entries (the sandbox's: "user")."""

    def __init__(self, root: os.PathLike[str] | str, uid: int | None, owners: dict[int, str]):
        super().__init__(root, uid)  # type: ignore[arg-type]
        self.owners = owners

    def _entry(self, rel: str, st: os.stat_result, target: str | None = None) -> FsEntry:
        kind: EntryKind
        if stat.S_ISREG(st.st_mode):
            kind = "file"
        elif stat.S_ISDIR(st.st_mode):
            kind = "dir"
        elif stat.S_ISLNK(st.st_mode):
            kind = "symlink"
        else:
            kind = "other"
        return FsEntry(
            path=rel,
            kind=kind,
            size=st.st_size,
            mode=stat.S_IMODE(st.st_mode),
            permissions=stat.filemode(st.st_mode),
            owner=self.owners.get(st.st_uid, str(st.st_uid)),
            group=self.owners.get(st.st_gid, str(st.st_gid)),
            modified_at=st.st_mtime,
            target=target,
        )

    def _described(self, parent: int, name: str, rel: str) -> FsEntry:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        target = None
        if stat.S_ISLNK(st.st_mode):
            target = display_name(os.readlink(name, dir_fd=parent))
        return self._entry(rel, st, target)

    @contextlib.contextmanager
    def _parent(self, path: str, create: bool = False) -> Iterator[tuple[int, str, str]]:
        """(the parent's descriptor, the entry's name on disk, its shown path); not the root.
        `create`: the parent directories are made."""
        parts = split(path)
        if not parts:
            raise BadRequest("the path is the workspace itself")
        with self._dir(parts[:-1], create=create) as parent:
            yield parent, _on_disk(parent, parts[-1]), "/".join(parts)

    @_translating
    def stat(self, path: str) -> FsEntry:
        parts = split(path)
        if not parts:
            with self._dir([]) as root:
                return self._entry("", os.fstat(root))
        with self._parent(path) as (parent, name, rel):
            return self._described(parent, name, rel)

    @_translating
    def walk(self, path: str, depth: int) -> list[FsEntry]:
        """The entries under a directory, `depth` levels down (1: its own), never through a
        symlink, at most MAX_ENTRIES; sorted by path."""
        parts = split(path)
        found: list[FsEntry] = []
        with self._dir(parts) as top:
            self._walk(os.dup(top), "/".join(parts), max(1, depth), found)
        found.sort(key=lambda e: e.path)
        return found

    def _walk(self, fd: int, prefix: str, depth: int, found: list[FsEntry]) -> None:
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            for de in entries:
                if len(found) >= MAX_ENTRIES:
                    return
                shown = display_name(de.name)
                rel = f"{prefix}/{shown}" if prefix else shown
                try:
                    entry = self._described(fd, de.name, rel)
                except OSError:
                    continue  # gone meanwhile
                found.append(entry)
                if entry.kind == "dir" and depth > 1:
                    try:
                        child = os.open(de.name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue  # swapped for a symlink meanwhile: not followed
                    self._walk(child, rel, depth - 1, found)
        finally:
            os.close(fd)

    @_translating
    def make_dir(self, path: str) -> FsEntry:
        """Make the directory and its parents; `AlreadyExists` when it is there already."""
        with self._parent(path, create=True) as (parent, name, rel):
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                st = _lstat(parent, name, rel)
                if stat.S_ISDIR(st.st_mode):
                    raise AlreadyExists(f"directory already exists: {rel}") from None
                raise BadRequest(f"path already exists but is not a directory: {rel}") from None
            if self.uid is not None:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                try:
                    os.fchown(fd, self.uid, self.uid)
                finally:
                    os.close(fd)
            return self._described(parent, name, rel)

    def _parent_made(self, path: str) -> contextlib.AbstractContextManager[int]:
        return self._dir(split(path)[:-1], create=True)

    @_translating
    def move(self, source: str, destination: str) -> FsEntry:
        """Rename `source` to `destination` (its parents made), as rename(2) does."""
        dst_parts = split(destination)
        if not dst_parts:
            raise BadRequest("the destination is the workspace itself")
        with self._parent(source) as (src_dir, src_name, src_rel):
            _lstat_any(src_dir, src_name, src_rel)  # a missing source is a 404
            with self._parent_made(destination) as dst_dir:
                dst_name = dst_parts[-1]
                os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
                return self._described(dst_dir, dst_name, "/".join(dst_parts))

    @_translating
    def remove(self, path: str) -> None:
        """Remove a file, a symlink (not what it points at) or a whole directory; a path
        that is not there is not an error."""
        try:
            with self._parent(path) as (parent, name, _):
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    return
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=parent)  # descriptor-based: never follows links
                else:
                    os.unlink(name, dir_fd=parent)
        except (FileNotFoundError, NotFound):
            return


def _lstat_any(parent: int, name: str, shown: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as e:
        raise translate_oserror(e, shown) from None
