"""The persistent bash: commands are sourced from a file so `cd`, exports and functions stay."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Callable

from .capture import Stream, new_markers


class ShellUnavailable(Exception):
    """bash could not be started (no descriptors or processes left, for instance)."""


class Shell:
    """One long-lived bash, restarted when it exits."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = os.path.join("/tmp", f".sandbank-{secrets.token_hex(8)}")

    def ensure(self) -> subprocess.Popen[bytes]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        opened: list[int] = []
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            status_r, status_w = os.pipe()
            opened += [status_r, status_w]
            out_r, out_w = os.pipe()
            opened += [out_r, out_w]
            err_r, err_w = os.pipe()
            opened += [err_r, err_w]
            proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(status_w,),
                cwd=self.workspace,
                start_new_session=True,
            )
            for fd in (status_w, out_w, err_w):
                os.close(fd)
                opened.remove(fd)
            self.out, self.err = Stream(out_r), Stream(err_r)
        except (OSError, RuntimeError) as e:  # EMFILE, EAGAIN, "can't start new thread"
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise ShellUnavailable(f"bash could not be started: {e}") from None
        self.proc = proc
        self.status_r = status_r
        self.status_fd = status_w  # the same number in bash, which writes each status to it
        self.status_buf = b""
        self._write("trap 'return 130 2>/dev/null' INT\n")
        return proc

    def _write(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, sig)

    def run(
        self,
        command: str,
        limit: int,
        live: tuple[Callable[[str], None], Callable[[str], None]] | None = None,
    ) -> tuple[str, str, int]:
        proc = self.ensure()
        script = os.path.join(self.dir, "cmd")
        with open(script, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(command if command.endswith("\n") else command + "\n")
        markers = new_markers()
        self.out.begin(markers, limit, live[0] if live else None)
        self.err.begin(markers, limit, live[1] if live else None)
        start, end = (m.decode() for m in markers)
        with contextlib.suppress(BrokenPipeError):
            self._write(
                f"builtin printf '%s' {start}; builtin printf '%s' {start} >&2\n"
                f"builtin source {script} </dev/null\n"
                f"__sb_rc=$?; builtin printf '%s' {end}; builtin printf '%s' {end} >&2; "
                f"builtin printf '{end} %d\\n' $__sb_rc >&{self.status_fd}\n"
            )
        rc = self._wait_status(markers[1])
        if rc is None:  # the shell exited (`exit N`, or killed): its streams end at EOF
            proc.wait()
            rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
            self.proc = None
            os.close(self.status_r)
        return self.out.text(), self.err.text(), rc

    def state(self) -> str:
        """A script giving a new bash this one's directory, exports, functions and aliases."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        out = os.path.join(self.dir, "state")
        self.run(
            "{ builtin printf 'builtin cd -- %q\\n' \"$PWD\"; builtin export -p; "
            "builtin declare -f; builtin alias -p; builtin shopt -p expand_aliases; } "
            f"> {out} 2>/dev/null",
            4096,
        )
        try:
            with open(out, encoding="utf-8", errors="surrogateescape") as f:
                return f.read()
        except OSError:
            return ""

    def restore(self, script: str) -> None:
        """Run a script `state` wrote (its errors, a directory gone say, are not the user's)."""
        with contextlib.suppress(ShellUnavailable):
            self.run(script, 4096)

    def _wait_status(self, marker: bytes) -> int | None:
        while True:
            line_end = self.status_buf.find(b"\n")
            if line_end >= 0:
                line, self.status_buf = self.status_buf[:line_end], self.status_buf[line_end + 1 :]
                if line.startswith(marker + b" "):
                    return int(line[len(marker) + 1 :])
                continue
            chunk = os.read(self.status_r, 4096)
            if not chunk:
                return None
            self.status_buf += chunk
