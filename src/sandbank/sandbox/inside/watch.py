"""Directory watches: inotify on a directory (and its subdirectories, when recursive).

Changes go out as `{"bg": "watch", "wid", "changes": [[path, kind], ...]}` frames, paths
relative to the watched directory, kinds as fsnotify names them (create, write, remove,
rename, chmod). A file moved into place (how the server writes files: a hidden name first)
is a create and, when it has content, a write.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import protocol as p
from .processes import ServiceError

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_IGNORED, IN_ISDIR, IN_ONLYDIR = 0x8000, 0x40000000, 0x01000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
MASK |= IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
EVENT = struct.Struct("iIII")
MAX_WATCHES = 100  # per sandbox
MAX_DIRS = 4096  # directories one recursive watch follows
STAGED = ".sandbank-upload-"  # the server's own hidden names while it writes a file

Send = Callable[[dict[str, Any]], None]


def events(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(watch descriptor, mask, name) of each inotify event in what one read returned."""
    at = 0
    while at + EVENT.size <= len(data):
        wd, mask, _cookie, size = EVENT.unpack_from(data, at)
        yield wd, mask, data[at + EVENT.size : at + EVENT.size + size].rstrip(b"\0")
        at += EVENT.size + size


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


class Watch(threading.Thread):
    """One watched directory; ends when `stop` is called or the directory goes."""

    def __init__(self, wid: int, path: str, recursive: bool, send: Send) -> None:
        super().__init__(daemon=True)
        self.wid = wid
        self.root = path
        self.recursive = recursive
        self.send = send
        self.libc = _libc()
        self.fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise ServiceError("resource_exhausted", "no inotify instance is left")
        self.dirs: dict[int, str] = {}  # watch descriptor -> directory relative to the root
        self.stop_r, self.stop_w = os.pipe()
        try:
            self._add("")
        except BaseException:
            self.close()
            raise
        if recursive:
            for dirpath, dirnames, _ in os.walk(path):
                for name in dirnames:
                    rel = os.path.relpath(os.path.join(dirpath, name), path)
                    with contextlib.suppress(OSError):
                        self._add(rel)

    def _add(self, rel: str) -> None:
        if len(self.dirs) >= MAX_DIRS:
            return
        full = os.path.join(self.root, rel) if rel else self.root
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(full), MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if not rel:
                if err == 2:
                    raise ServiceError("not_found", f"directory not found: {full}")
                raise ServiceError("invalid_argument", f"cannot watch {full}: {os.strerror(err)}")
            raise OSError(err, os.strerror(err))
        self.dirs[wd] = rel

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.stop_w, b"x")

    def close(self) -> None:
        for fd in (self.fd, self.stop_r, self.stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.fd, self.stop_r], [], [])
                if self.stop_r in ready:
                    return
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    continue
                changes = self._changes(data)
                if changes:
                    self.send({p.BACKGROUND: "watch", "wid": self.wid, "changes": changes})
                if not self.dirs:  # the watched directory itself is gone
                    self.send({p.BACKGROUND: "watch", "wid": self.wid, "end": True})
                    return
        finally:
            self.close()

    def _changes(self, data: bytes) -> list[list[str]]:
        changes: list[list[str]] = []
        for wd, mask, raw in events(data):
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            base = self.dirs.get(wd)
            if base is None:
                continue
            name = os.fsdecode(raw)
            if name.startswith(STAGED):
                continue
            rel = f"{base}/{name}" if base and name else (name or base)
            shown = p.display_name(rel)
            if mask & (IN_CREATE | IN_MOVED_TO):
                changes.append([shown, "create"])
                if mask & IN_MOVED_TO and self._has_content(rel):
                    changes.append([shown, "write"])
                if mask & IN_ISDIR and self.recursive:
                    changes += self._follow(rel)
            if mask & IN_MODIFY:
                changes.append([shown, "write"])
            if mask & (IN_DELETE | IN_DELETE_SELF):
                changes.append([shown, "remove"])
            if mask & (IN_MOVED_FROM | IN_MOVE_SELF):
                changes.append([shown, "rename"])
            if mask & IN_ATTRIB:
                changes.append([shown, "chmod"])
        return changes

    def _follow(self, rel: str) -> list[list[str]]:
        """Watch a new directory, and tell what was made in it before the watch was in place."""
        found: list[list[str]] = []
        with contextlib.suppress(OSError):
            self._add(rel)
            for dirpath, dirnames, filenames in os.walk(os.path.join(self.root, rel)):
                for name in dirnames + filenames:
                    inner = os.path.relpath(os.path.join(dirpath, name), self.root)
                    found.append([p.display_name(inner), "create"])
                    if name in filenames and self._has_content(inner):
                        found.append([p.display_name(inner), "write"])
                for name in dirnames:
                    with contextlib.suppress(OSError):
                        self._add(os.path.relpath(os.path.join(dirpath, name), self.root))
        return found

    def _has_content(self, rel: str) -> bool:
        try:
            st = os.stat(os.path.join(self.root, rel), follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size > 0


class Watches:
    """The sandbox's watches, by id."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.active: dict[int, Watch] = {}
        self.next_id = 0

    def watch(self, path: str, recursive: bool) -> int:
        self.active = {w: x for w, x in self.active.items() if x.is_alive()}
        if len(self.active) >= MAX_WATCHES:
            raise ServiceError("resource_exhausted", f"at most {MAX_WATCHES} watches at once")
        if not os.path.isdir(path):
            if os.path.exists(path):
                raise ServiceError("invalid_argument", f"path is not a directory: {path}")
            raise ServiceError("not_found", f"directory not found: {path}")
        self.next_id += 1
        watch = Watch(self.next_id, path, recursive, self.send)
        self.active[watch.wid] = watch
        watch.start()
        return watch.wid

    def unwatch(self, wid: Any) -> None:
        watch = self.active.pop(wid, None) if isinstance(wid, int) else None
        if watch is not None:
            watch.stop()
