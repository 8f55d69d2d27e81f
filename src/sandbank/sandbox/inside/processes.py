"""Background processes: started beside calls, each with pipes of its own, streamed as frames.

A process gets its own session (so signals reach its whole group, and interrupting a call
never touches it), stdin from a pipe or /dev/null, and a lifetime when one is asked for. Its
output goes out as `{"bg": "proc", "pid", "stdout"|"stderr": base64}` frames as it comes, and
its end as `{"bg": "proc", "pid", "end": {...}}`, after which it is forgotten.
"""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from . import protocol as p

Send = Callable[[dict[str, Any]], None]
END_GRACE = 1.0  # after the process exits, how long its pipes may take to drain
# How Go's os.ProcessState names a death by signal (what E2B's SDKs show).
SIGNAL_WORDS = {
    signal.SIGKILL: "killed", signal.SIGTERM: "terminated", signal.SIGINT: "interrupt",
    signal.SIGSEGV: "segmentation fault", signal.SIGABRT: "aborted", signal.SIGHUP: "hangup",
    signal.SIGPIPE: "broken pipe", signal.SIGQUIT: "quit", signal.SIGBUS: "bus error",
}  # fmt: skip


class ServiceError(Exception):
    """A request that cannot be served: `code` says why (not_found, invalid_argument...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Process:
    """One started process: its pipes' pumps, its stdin writer, its deadline."""

    def __init__(self, popen: subprocess.Popen[bytes], config: dict[str, Any]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.config = config
        self.inputs: queue.SimpleQueue[tuple[bytes | None, Callable[[str | None], None]]] = (
            queue.SimpleQueue()
        )
        self.killed_by_deadline = False


class Processes:
    """The session's background processes, by pid."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.table: dict[int, Process] = {}
        self.lock = threading.Lock()

    def start(self, msg: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        """Start the process, answer with its pid, then stream it (the answer comes first)."""
        cmd = str(msg.get("cmd") or "")
        args = [str(a) for a in msg.get("args") or []]
        envs = {str(k): str(v) for k, v in (msg.get("envs") or {}).items()}
        # A relative directory is the workspace's (whose path differs without isolation).
        cwd = os.path.join(
            os.environ.get("SANDBANK_WORKSPACE", "/workspace"), str(msg.get("cwd") or "")
        )
        if not cmd:
            raise ServiceError("invalid_argument", "the command is empty")
        if not os.path.isdir(cwd):
            raise ServiceError("invalid_argument", f"cwd '{cwd}' does not exist")
        stdin = bool(msg.get("stdin"))
        try:
            popen = subprocess.Popen(
                [cmd, *args],
                cwd=cwd,
                env={**os.environ, **envs},
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise ServiceError("invalid_argument", f"failed to start {cmd!r}: {e.strerror}") from e
        config = {"cmd": cmd, "args": args, "envs": envs, "cwd": cwd, "tag": msg.get("tag")}
        proc = Process(popen, config)
        with self.lock:
            self.table[proc.pid] = proc
        reply({"pid": proc.pid})
        timeout = msg.get("timeout")
        if isinstance(timeout, int | float) and timeout > 0:
            timer = threading.Timer(float(timeout), self._expire, (proc,))
            timer.daemon = True
            timer.start()
        if stdin:
            threading.Thread(target=self._write_stdin, args=(proc,), daemon=True).start()
        threading.Thread(target=self._follow, args=(proc,), daemon=True).start()

    def _follow(self, proc: Process) -> None:
        pumps = [
            threading.Thread(target=self._pump, args=(proc, proc.popen.stdout, "stdout")),
            threading.Thread(target=self._pump, args=(proc, proc.popen.stderr, "stderr")),
        ]
        for t in pumps:
            t.daemon = True
            t.start()
        status = proc.popen.wait()
        for t in pumps:  # what it wrote before it exited; a child holding the pipe is not waited
            t.join(END_GRACE)
        with self.lock:
            self.table.pop(proc.pid, None)
        end: dict[str, Any]
        if status >= 0:
            end = {"exit_code": status, "exited": True, "status": f"exit status {status}"}
        else:
            sig = -status
            try:
                word = SIGNAL_WORDS.get(signal.Signals(sig), f"signal {sig}")
            except ValueError:
                word = f"signal {sig}"
            end = {"exit_code": -1, "exited": False, "status": f"signal: {word}"}
        if proc.killed_by_deadline:
            end["error"] = "the process was killed at the end of its timeout"
        self.send({p.BACKGROUND: "proc", "pid": proc.pid, "end": end})
        proc.inputs.put((None, lambda _: None))  # ends its stdin writer

    def _pump(self, proc: Process, pipe: Any, stream: str) -> None:
        fd = pipe.fileno()
        try:
            while chunk := os.read(fd, p.MAX_CHUNK):
                data = base64.b64encode(chunk).decode("ascii")
                self.send({p.BACKGROUND: "proc", "pid": proc.pid, stream: data})
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    def _expire(self, proc: Process) -> None:
        if proc.popen.poll() is None:
            proc.killed_by_deadline = True
            self._kill_group(proc, signal.SIGKILL)

    def _write_stdin(self, proc: Process) -> None:
        stdin = proc.popen.stdin
        assert stdin is not None
        while True:
            data, done = proc.inputs.get()
            if data is None:
                with contextlib.suppress(OSError):
                    stdin.close()
                done(None)
                return
            try:
                stdin.write(data)
                stdin.flush()
            except OSError as e:
                done(f"the process's stdin is closed ({e.strerror})")
                continue
            done(None)

    def find(self, pid: Any) -> Process:
        with self.lock:
            proc = self.table.get(pid) if isinstance(pid, int) else None
        if proc is None:
            raise ServiceError("not_found", f"process with pid {pid} not found")
        return proc

    def write(self, pid: Any, data: bytes | None, reply: Callable[[dict[str, Any]], None]) -> None:
        """Queue bytes for the process's stdin (None closes it); answered once written."""
        proc = self.find(pid)
        if proc.popen.stdin is None:
            raise ServiceError("failed_precondition", "the process was started without stdin")

        def done(error: str | None) -> None:
            reply({"error": error, "code": "failed_precondition"} if error else {})

        proc.inputs.put((data, done))

    def signal(self, pid: Any, name: str) -> None:
        sig = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}.get(name)
        if sig is None:
            raise ServiceError("invalid_argument", f"unsupported signal {name!r}")
        self._kill_group(self.find(pid), sig)

    @staticmethod
    def _kill_group(proc: Process, sig: int) -> None:
        # Its own session: the group is everything it started (bash -c forks children).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(sig)

    def listing(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"pid": proc.pid, **proc.config} for proc in self.table.values()]
