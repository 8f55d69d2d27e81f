"""The suite's own guards: a process a test run started and left running is found by its run."""

from __future__ import annotations

import os
import subprocess
import time

from tests.support import TEST_RUN_VARIABLE, left_running


def test_a_process_left_running_is_found_by_its_run_and_no_other() -> None:
    run = f"guard-{os.getpid()}"
    env = {**os.environ, TEST_RUN_VARIABLE: run}
    proc = subprocess.Popen(["sleep", "30"], env=env)
    try:
        deadline = time.monotonic() + 10
        while not left_running(run) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has executed `sleep` with its environment
        assert [pid for pid, _ in left_running(run)] == [proc.pid]
        assert "sleep 30" in left_running(run)[0][1]
        assert proc.pid not in [pid for pid, _ in left_running(f"other-{run}")]
    finally:
        proc.kill()
        proc.wait()
    assert left_running(run) == []
