"""The lock files that say which process serves a data directory or a SQLite database, and
name it to any other that tries."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

DATA_DIR_LOCK = "serve.lock"


class ServeLock:
    """An exclusive `flock` on a lock file, held while `sandbank serve` runs.

    The kernel drops it when the process dies (kill -9 included), so a stale file never
    blocks a start. The file says who holds it, for the message another process gives.
    """

    def __init__(self, path: Path, target: Path) -> None:
        self.path = path
        self.target = target  # what it keeps to one server
        self._fd: int | None = None

    @classmethod
    def of_database(cls, database: Path) -> ServeLock:
        """`<database>.serve.lock`: SQLite is for one serving process."""
        return cls(database.with_name(database.name + ".serve.lock"), database)

    @classmethod
    def of_data_dir(cls, data_dir: Path) -> ServeLock:
        """`<data dir>/serve.lock`: a data directory is owned by one server, whatever its
        database (its sandboxes' disks, cgroups and objects live by it)."""
        return cls(data_dir / DATA_DIR_LOCK, data_dir)

    @property
    def database(self) -> Path:
        return self.target

    def acquire(self) -> str | None:
        """Take the lock: None when taken, else what the file says about the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace")
            os.close(fd)
            return describe(holder)
        os.ftruncate(fd, 0)
        about = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.write(fd, json.dumps(about).encode())
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def describe(holder: str) -> str:
    try:
        about = json.loads(holder)
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(about["since"])))
        return f"process {about['pid']} on {about['host']}, serving since {since}"
    except (ValueError, KeyError, TypeError):
        return "another process"
