"""What a SIGKILLed server leaves, swept by the next server to start on the machine (another
data directory): its sandboxes' cgroups and processes, and uid lock files nobody holds."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbank.sandbox.backends.base import instance_id
from tests.support import Server, data_dir, unmount_under

HIERARCHIES = ("memory", "pids", "cpu", "unified")


def _groups(instance: str) -> list[Path]:
    return [
        p for h in HIERARCHIES if (p := Path("/sys/fs/cgroup") / h / "sandbank" / instance).exists()
    ]


def _procs(instance: str) -> set[int]:
    base = Path("/sys/fs/cgroup/memory/sandbank") / instance
    found: set[int] = set()
    for procs in base.glob("*/cgroup.procs"):
        found.update(int(x) for x in procs.read_text().split())
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: killed, and waiting for a reaper this machine may not run)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] != b"Z"


@pytest.mark.parametrize("isolation", ["fork", "bwrap"])
def test_the_next_server_sweeps_what_a_killed_one_left(isolation: str, machine: None) -> None:
    locks = Path(tempfile.mkdtemp(prefix="sandbank-test-uid-locks-"))
    for uid in range(610000, 610500):  # a long-running machine's litter of uid lock files
        (locks / str(uid)).touch()
    limits: dict[str, Any] = {
        "isolation": isolation,
        "uid_lock_dir": locks,
        "uid_base": 610000,
        "pool_size": 2,
    }
    with data_dir() as first_dir, data_dir() as second_dir:
        killed = Server(first_dir, **limits).start()
        second = Server(second_dir, **limits)
        try:
            with killed.client() as client:
                sid = client.post("/sessions", json={}).json()["session_id"]
                client.post(
                    f"/sessions/{sid}/exec",
                    json={"tool": "bash_code_execution", "input": {"command": "sleep 600 &"}},
                )
            gone = instance_id(first_dir)
            assert _groups(gone) and (locks / "instances" / gone).exists()
            assert killed.proc is not None
            killed.proc.send_signal(signal.SIGKILL)
            killed.proc.wait()
            left = _procs(gone)
            second.start()
            assert httpx.get(f"{second.url}/health").status_code == 200
            assert _groups(gone) == []  # memory, pids, cpu and unified: all gone
            assert not (locks / "instances" / gone).exists()
            time.sleep(0.5)
            assert not [pid for pid in left if _alive(pid)]
            # Only the live server's claims remain: its pool's two uids, the lowest ones.
            files = sorted(p.name for p in locks.iterdir() if p.name.isdigit())
            assert len(files) <= 3 and all(int(f) < 610010 for f in files), files
            assert {p.name for p in (locks / "instances").iterdir()} == {instance_id(second_dir)}
        finally:
            for server in (killed, second):
                if server.proc is not None and server.proc.poll() is None:
                    server.stop()
            unmount_under(first_dir)  # the killed server's workspaces: nobody else will
            for path in sorted(locks.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            os.rmdir(locks)
