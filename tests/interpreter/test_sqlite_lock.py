"""A data directory is owned by one server: a second `sandbank serve` on it refuses to start,
naming the first, before it touches anything; SQLite shared across data directories warns."""

from __future__ import annotations

import shutil
import subprocess

import httpx

from tests.interpreter.harness import Server, data_dir, running
from tests.support import SANDBANK, env_for


def test_a_second_server_on_the_same_data_directory_refuses_and_touches_nothing(
    machine: None,
) -> None:
    with running({"SANDBANK_POOL_SIZE": "1"}) as first:
        assert first.proc is not None
        with first.new_user() as user:
            sid = user.new_session()
            assert user.upload(sid, "a.csv", b"x,y\n1,2\n").status_code == 204
        mounts_before = _mounts_under(first.data)
        second = subprocess.run(
            [SANDBANK, "serve", "--port", "0", "--data-dir", str(first.data)],
            env=env_for(first.data, pool_size=1),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr  # one line, naming the holder
        assert f"is served by another sandbank server (process {first.proc.pid} on " in lines[0]
        assert "serving since" in lines[0]
        # The first server's sandboxes, workspaces and files are as they were.
        assert _mounts_under(first.data) == mounts_before
        assert httpx.get(f"{first.url}/health").json()["pool_ready"] == 1
        with first.client() as client:
            created = client.post("/sessions", json={})
            assert created.status_code == 201
            sid2 = created.json()["session_id"]
            ran = client.post(
                f"/sessions/{sid2}/exec",
                json={"tool": "code_execution", "input": {"code": "print(2 + 2)"}},
            )
            assert ran.json()["result_block"]["content"]["stdout"] == "4\n"


def _mounts_under(path: object) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return sorted(line.split()[4] for line in f if line.split()[4].startswith(str(path)))


def test_a_second_server_on_the_same_sqlite_database_warns_naming_the_first(machine: None) -> None:
    env = {"SANDBANK_POOL_SIZE": "0"}
    with running(env) as first:
        assert first.proc is not None
        shared = {**env, "SANDBANK_DATABASE_URL": f"sqlite:///{first.data / 'sandbank.db'}"}
        second = Server(data_dir(), shared)  # a data directory of its own
        second.start()
        try:
            log = second.log.read_text()
            assert "another sandbank server already serves the SQLite database" in log
            assert f"process {first.proc.pid} on " in log
            assert "use PostgreSQL" in log
            assert second.stop() in (0, -15)
        finally:
            if second.proc is not None and second.proc.poll() is None:
                second.proc.kill()
                second.proc.wait()
            shutil.rmtree(second.data, ignore_errors=True)
