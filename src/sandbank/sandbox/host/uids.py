"""Host uids for sandboxes: one per live sandbox, claimed machine-wide under a file lock.

A claim is an exclusive `flock` on `<lock_dir>/<uid>` held for the sandbox's life, so
several servers (and test runs) on one machine never hand out the same uid, and a crashed
server's claims vanish with its process. Uids are claimed lowest first, so the lock files
number at most the most sandboxes ever live at once on the machine, not one per uid ever
used; files nobody holds are removed at start (`sweep`). A file is removed only under its
own lock, and a claim checks that the file it locked is still the one at its path, so a
removal never hands one uid to two sandboxes.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import threading
from pathlib import Path

from ...errors import AtCapacity


class UidAllocator:
    """Claims host uids for sandboxes, machine-wide."""

    def __init__(self, lock_dir: Path, base: int, count: int) -> None:
        self.lock_dir = lock_dir
        self.base = base
        self.count = count
        self._held: dict[int, int] = {}
        # Where a claim starts looking: uids below it are ours or another server's; those we
        # give back are tried first, lowest first. A claim costs what other servers hold near
        # the bottom, not what this server holds (a thousand of its sandboxes: no scan).
        self._next = base
        self._returned: list[int] = []  # a heap
        self._mutex = threading.Lock()
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o755)

    def claim(self) -> int:
        with self._mutex:
            while self._returned:
                uid = heapq.heappop(self._returned)
                if self._take(uid):
                    return uid
            while self._next < self.base + self.count:
                uid = self._next
                self._next += 1
                if uid not in self._held and self._take(uid):
                    return uid
            # Every uid was tried once: what other servers held may be free again.
            self._next = self.base
            for uid in range(self.base, self.base + self.count):
                if uid not in self._held and self._take(uid):
                    return uid
        raise AtCapacity("no free sandbox uid left in the configured range")

    def _take(self, uid: int) -> bool:
        fd = lock_file(self.lock_dir / str(uid), create=True)
        if fd is None:
            return False
        self._held[uid] = fd
        return True

    def release(self, uid: int) -> None:
        with self._mutex:
            fd = self._held.pop(uid, None)
            if fd is not None:
                heapq.heappush(self._returned, uid)
        if fd is not None:
            os.close(fd)

    def held(self) -> set[int]:
        with self._mutex:
            return set(self._held)

    def sweep(self) -> int:
        """Remove the lock files nobody holds (a killed server's, older runs'); how many."""
        removed = 0
        with self._mutex:
            held = {str(uid) for uid in self._held}
            for name in os.listdir(self.lock_dir):
                if not name.isdigit() or name in held:
                    continue
                path = self.lock_dir / name
                fd = lock_file(path, create=False)
                if fd is None:
                    continue  # a live claim
                try:
                    path.unlink()
                    removed += 1
                finally:
                    os.close(fd)
        return removed


def lock_file(path: Path, *, create: bool) -> int | None:
    """An exclusive lock on the file at `path`, or None when another holds it (or the file
    was removed under us: the path then names another file, or none)."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # removed by a sweep between our open and our lock: try the path again
        if not create:
            return None
