"""Test support: data directories sandbox users can reach, test settings, a real `sandbank serve`."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from sandbank.config import Settings

REPO = Path(__file__).resolve().parents[1]
RUNTIME_DIR = Path(os.environ.get("SANDBANK_TEST_RUNTIME_DIR", REPO / ".runtime"))
SANDBANK = str(Path(sys.executable).with_name("sandbank"))
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "sandbank-test-uids"
# Marks every server this test run starts, so the run's end can find one left running
# (tests/conftest.py) among those of other runs on the machine.
TEST_RUN_VARIABLE = "SANDBANK_TEST_RUN"
TEST_RUN = str(os.getpid())

# Small limits: the suite runs on 2 cores next to other work.
TEST_LIMITS: dict[str, Any] = {
    "memory_limit_mb": 160,
    "disk_limit_mb": 16,
    "tmp_limit_mb": 16,
    "pids_limit": 64,
    "open_files_limit": 256,
    "pool_size": 0,
    "pool_preimport": False,
    "uid_lock_dir": UID_LOCK_DIR,
    "runtime_dir": RUNTIME_DIR,
    "interrupt_grace_seconds": 1.0,
    # Pausing every idle session at each server's stop costs the suite time; the tests of
    # paused sessions turn it on (tests/sandbox/test_durable.py).
    "pause_on_shutdown": False,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def data_dir() -> Iterator[Path]:
    """A data directory under /tmp: pytest's own tmp dirs are mode 0700, closed to sandbox uids."""
    path = Path(tempfile.mkdtemp(prefix="sandbank-test-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def unmount_under(path: Path) -> list[str]:
    """Unmount (lazily) what is mounted below `path`, deepest first; the mount points.

    For what a test leaves on purpose: a server it SIGKILLed cannot unmount its workspaces, and
    only the next server on the same data directory would."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [row.split()[4] for row in f if row.split()[4].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    return points


def settings(data: Path, **overrides: Any) -> Settings:
    return Settings(data_dir=data, **{**TEST_LIMITS, **overrides})


def env_for(data: Path, **overrides: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    env["SANDBANK_LLM_OFFLINE"] = "1"
    for key, value in {**TEST_LIMITS, **overrides}.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        env[f"SANDBANK_{key.upper()}"] = text
    env["SANDBANK_DATA_DIR"] = str(data)
    env[TEST_RUN_VARIABLE] = TEST_RUN
    return env


def left_running(run: str = TEST_RUN) -> list[tuple[int, str]]:
    """(pid, command line) of the processes started by test run `run` still alive."""
    marker = f"{TEST_RUN_VARIABLE}={run}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] == b"Z":
                    continue  # exited, awaiting its parent's wait
        except OSError:
            continue
        found.append((int(name), cmdline))
    return found


class Server:
    """A real `sandbank serve` process on a free loopback port; `start` again after `stop`
    runs a new one on the same data directory. `overrides` are settings (test-sized limits
    by default); `extra_env` adds raw variables (a model's, say)."""

    def __init__(
        self,
        data: Path,
        extra_env: dict[str, str] | None = None,
        ready: str = "/health",
        **overrides: Any,
    ) -> None:
        self.port = free_port()
        self.url = self.base_url = f"http://127.0.0.1:{self.port}"
        self.data = data
        self.ready = ready
        self.env = env_for(data, **overrides)
        self.env.update(extra_env or {})
        self.log = data / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Server:
        """Start and wait until ready; a server that fails to is ended before this raises."""
        argv = [SANDBANK, "serve", "--port", str(self.port), "--data-dir", str(self.data)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited at start:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}{self.ready}", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop(signal.SIGKILL)  # never left running by a test that could not use it
        raise RuntimeError(f"server did not start:\n{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        if self.proc is None:
            return 0  # never started
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30, **kwargs)

    def cli(self, *args: str) -> str:
        """Run `sandbank ARGS --data-dir DATA` with the server's settings; its output."""
        done = subprocess.run(
            [SANDBANK, *args, "--data-dir", str(self.data)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


def processes_of_uids(uids: set[int]) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid in uids:
                    found.append(int(name))
    return found


@functools.cache
def gvisor_missing() -> str | None:
    """Why the gvisor backend's tests cannot run on this machine, or None when they can.

    runsc is an optional test dependency (CI installs it from Debian's main archive when it
    can): absent, or installed but running no program at all here, its tests skip saying so.
    """
    if shutil.which("runsc") is None:
        return "runsc (gVisor) is not installed"
    from sandbank.sandbox.backends.gvisor import _runs_on

    if not _runs_on("ptrace"):
        return (
            "runsc is installed but runs no program here (`runsc --platform=ptrace do /bin/true`)"
        )
    return None
