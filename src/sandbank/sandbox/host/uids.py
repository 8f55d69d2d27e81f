"""Host uids for sandboxes: one per live sandbox, claimed machine-wide under a file lock.

A claim is an exclusive `flock` on `<lock_dir>/<uid>` held for the sandbox's life, so
several servers (and test runs) on one machine never hand out the same uid, and a crashed
server's claims vanish with its process.
"""

from __future__ import annotations

import fcntl
import os
import random
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
        self._mutex = threading.Lock()
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o755)

    def claim(self) -> int:
        start = random.randrange(self.count)  # noqa: S311 - spreading claims, not a secret
        with self._mutex:
            for i in range(self.count):
                uid = self.base + (start + i) % self.count
                if uid in self._held:
                    continue
                fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise AtCapacity("no free sandbox uid left in the configured range")

    def release(self, uid: int) -> None:
        with self._mutex:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)

    def held(self) -> set[int]:
        with self._mutex:
            return set(self._held)
