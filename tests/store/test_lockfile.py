"""The serve lock: one holder at a time, named to whoever else tries; dropped when it dies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbank.store.lockfile import ServeLock

HOLD = """
import sys, time
from pathlib import Path
from sandbank.store.lockfile import ServeLock
assert ServeLock.of_database(Path(sys.argv[1])).acquire() is None
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_process_is_told_who_holds_the_database(tmp_path: Path) -> None:
    database = tmp_path / "sandbank.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(database)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = ServeLock.of_database(database).acquire()
        assert other is not None and f"process {holder.pid} on " in other
        assert "serving since" in other
    finally:
        holder.kill()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
    lock = ServeLock.of_database(database)  # the kernel dropped the dead holder's lock
    assert lock.acquire() is None
    assert f'"pid": {os.getpid()}' in lock.path.read_text()
    lock.release()
