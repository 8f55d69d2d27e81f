"""SQLite is for one serving process: a second `sandbank serve` on the same database warns."""

from __future__ import annotations

from tests.interpreter.harness import Server, running


def test_a_second_server_on_the_same_sqlite_database_warns_naming_the_first(machine: None) -> None:
    env = {"SANDBANK_POOL_SIZE": "0"}
    with running(env) as first:
        assert first.proc is not None
        second = Server(first.data, env)
        second.start()
        try:
            log = first.log.read_text()
            assert "another sandbank server already serves the SQLite database" in log
            assert f"process {first.proc.pid} on " in log
            assert "use PostgreSQL" in log
            assert second.stop() in (0, -15)
        finally:
            if second.proc is not None and second.proc.poll() is None:
                second.proc.kill()
                second.proc.wait()
