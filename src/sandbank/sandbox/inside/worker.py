"""The process inside a sandbox: a persistent Python namespace, a persistent bash and the editor.

Runs as the session's unprivileged user under the runtime's Python. Standard library only:
it imports nothing from the server. It speaks length-prefixed JSON frames on the pipes it
was started with (fd 0 in, fd 1 out); user code never sees those descriptors as 0, 1 or 2.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import linecache
import os
import secrets
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
import types
from typing import Any

WORKSPACE = os.environ.get("SANDBANK_WORKSPACE", "/workspace")
SCAN_LIMIT = 20000
SITE_DIR_NAME = ".site"
_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024


# --- the control channel -------------------------------------------------------------------


class Channel:
    def __init__(self) -> None:
        # Move the control pipes off 0/1 so user code and its children never inherit them.
        self.rfd = os.dup(0)
        self.wfd = os.dup(1)
        os.set_inheritable(self.rfd, False)
        os.set_inheritable(self.wfd, False)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        self.lock = threading.Lock()

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(self.rfd, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def recv(self) -> dict[str, Any]:
        (size,) = _HEADER.unpack(self._read_exact(_HEADER.size))
        if size > _MAX_FRAME:
            raise EOFError
        msg: dict[str, Any] = json.loads(self._read_exact(size))
        return msg

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode()
        with self.lock:
            os.write(self.wfd, _HEADER.pack(len(data)))
            view = memoryview(data)
            while view:
                n = os.write(self.wfd, view)
                view = view[n:]


# --- output capture ----------------------------------------------------------------------


class Stream(threading.Thread):
    """Drains one pipe for the worker's whole life; each call's output ends at the call's marker.

    Python's fds 1 and 2 and bash's stdout and stderr are such pipes, so a call costs a marker
    written after it, not new pipes and threads. Output between calls (background processes)
    is dropped; during a call it counts as the call's. At most `limit` bytes are kept per call.
    """

    def __init__(self, r: int, fd: int = -1) -> None:
        super().__init__(daemon=True)
        self.r = r
        self.fd = fd  # the descriptor writing into the pipe, where the worker owns it
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.marker = b""
        self.limit = 0
        self.data = bytearray()
        self.dropped = 0
        self.tail = b""
        self.ended = False
        self.start()

    @classmethod
    def onto(cls, fd: int) -> Stream:
        """A stream that `fd` (1 or 2) writes into from now on."""
        # Above 9: with fd 1 or 2 closed by user code, a new pipe would take its number.
        r, w = (_above_stdio(x) for x in os.pipe())
        os.dup2(w, fd)
        os.close(w)
        return cls(r, fd)

    def begin(self, marker: bytes, limit: int) -> None:
        with self.lock:
            self.marker, self.limit = marker, limit
            self.data, self.dropped, self.tail = bytearray(), 0, b""
            self.done.clear()

    def mark(self) -> bool:
        try:
            os.write(self.fd, self.marker)
        except OSError:
            return False
        return True

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.r, 65536)
            except OSError:
                chunk = b""
            with self.lock:
                if not chunk:  # every writer is gone (bash exited): the call's output ends here
                    self._keep(self.tail)
                    self.tail = b""
                    self.ended = True
                    self.done.set()
                    os.close(self.r)
                    return
                if not self.marker or self.done.is_set():
                    continue  # between calls: nobody is listening
                buf = self.tail + chunk
                idx = buf.find(self.marker)
                if idx >= 0:
                    self._keep(buf[:idx])
                    self.tail = b""
                    self.done.set()
                    continue
                keep = len(self.marker) - 1  # the marker may be split across reads
                self._keep(buf[:-keep])
                self.tail = buf[-keep:]

    def _keep(self, data: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += data[:room]
        self.dropped += max(0, len(data) - max(room, 0))

    def text(self, timeout: float = 2.0) -> str:
        self.done.wait(timeout)
        with self.lock:
            out = self.data.decode("utf-8", errors="replace")
            if self.dropped:
                out += f"\n[output truncated: {self.dropped} more bytes not shown]\n"
            return out


def _above_stdio(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def new_marker() -> bytes:
    return f"\x00__SANDBANK_END_{secrets.token_hex(8)}__\x00".encode()


class Capture:
    """Delimits one Python call's output on the worker's persistent fds 1 and 2."""

    streams: list[Stream] = []

    def __init__(self, limit: int) -> None:
        self.limit = limit
        if not Capture.streams:
            Capture.streams = [Stream.onto(1), Stream.onto(2)]

    def __enter__(self) -> Capture:
        self.marker = new_marker()
        for s in self.streams:
            s.begin(self.marker, self.limit)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: S110 - user code may have broken its own streams
            pass
        marked = [s.mark() for s in self.streams]  # both first: the waits then overlap
        for i, (s, ok) in enumerate(zip(self.streams, marked, strict=True)):
            if not (ok and s.done.wait(2.0)) or s.ended:
                # User code closed or redirected fd 1 or 2: the next call gets a fresh stream.
                Capture.streams[i] = Stream.onto(s.fd)
        self.out, self.err = (s.text(0) for s in self.streams)


# --- produced files ------------------------------------------------------------------------


def scan(root: str = WORKSPACE) -> dict[str, tuple[int, int, int]]:
    seen: dict[str, tuple[int, int, int]] = {}
    stack = [""]
    while stack and len(seen) < SCAN_LIMIT:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        for e in entries:
            path = f"{rel}/{e.name}" if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if path != SITE_DIR_NAME:  # pip's packages are not files the code produced
                    stack.append(path)
            elif stat.S_ISREG(st.st_mode):
                seen[path] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return seen


def produced(before: dict[str, tuple[int, int, int]]) -> list[str]:
    after = scan()
    return sorted(p for p, sig in after.items() if before.get(p) != sig)


# --- python ------------------------------------------------------------------------------


class Interpreter:
    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.cell = 0

    def run(self, code: str) -> int:
        self.cell += 1
        filename = f"<cell {self.cell}>"
        # Tracebacks show the offending line, as in a notebook.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
        except SyntaxError as e:
            traceback.print_exception(type(e), e, None)
            return 1
        last = None
        # As in Jupyter, a bare last expression is echoed, unless a `;` ends the cell.
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_with_semicolon(code):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        try:
            exec(compile(tree, filename, "exec"), self.namespace)  # noqa: S102 - the product
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)  # noqa: S307
                if value is not None:
                    print(repr(value))
            return 0
        except SystemExit as e:
            if e.code is None:
                return 0
            if isinstance(e.code, int):
                return e.code
            print(e.code, file=sys.stderr)
            return 1
        except BaseException as e:
            tb = e.__traceback__
            # Drop our own frames: the user sees only their cell's.
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
        finally:
            save_figures()
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:  # noqa: S110
                pass


def _ends_with_semicolon(code: str) -> bool:
    lines = [line for line in code.rstrip().splitlines() if line.strip()]
    return bool(lines) and lines[-1].split("#", 1)[0].rstrip().endswith(";")


def save_figures() -> None:
    """Figures still open at the end of a call are saved and closed, as `plt.show()` does."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not plt.get_fignums():
        return
    try:
        import sandbank_mplbackend

        sandbank_mplbackend.save_all()
    except Exception:
        traceback.print_exc()


# --- bash --------------------------------------------------------------------------------


class Shell:
    """One long-lived bash. Commands are sourced from a file so `cd`, exports and functions stay."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = os.path.join("/tmp", f".sandbank-{secrets.token_hex(8)}")

    def ensure(self) -> subprocess.Popen[bytes]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.status_r, status_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.status_fd = status_w  # the same number in bash, which writes each call's status to it
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=out_w,
            stderr=err_w,
            pass_fds=(status_w,),
            cwd=WORKSPACE,
            start_new_session=True,
        )
        for fd in (status_w, out_w, err_w):
            os.close(fd)
        self.out, self.err = Stream(out_r), Stream(err_r)
        self.status_buf = b""
        self._write("trap 'return 130 2>/dev/null' INT\n")
        return self.proc

    def _write(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, sig)

    def run(self, command: str, limit: int) -> tuple[str, str, int]:
        proc = self.ensure()
        script = os.path.join(self.dir, "cmd")
        with open(script, "w") as f:
            f.write(command if command.endswith("\n") else command + "\n")
        marker = f"__SANDBANK_{secrets.token_hex(12)}__"
        self.out.begin(marker.encode(), limit)
        self.err.begin(marker.encode(), limit)
        with contextlib.suppress(BrokenPipeError):
            self._write(
                f"builtin source {script} </dev/null\n"
                f"__sb_rc=$?; builtin printf '%s' {marker}; builtin printf '%s' {marker} >&2; "
                f"builtin printf '{marker} %d\\n' $__sb_rc >&{self.status_fd}\n"
            )
        rc = self._wait_status(marker.encode())
        if rc is None:  # the shell exited (`exit N`, or killed): its streams end at EOF
            proc.wait()
            rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
            self.proc = None
            os.close(self.status_r)
        return self.out.text(), self.err.text(), rc

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


# --- the main loop ---------------------------------------------------------------------------


class Worker:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.interp = Interpreter()
        self.shell = Shell()
        self.busy: str | None = None
        self.busy_lock = threading.Lock()  # no interrupt is sent once a call has ended
        self.main_thread = threading.main_thread().ident
        import editor  # beside this file

        self.editor = editor.Editor(WORKSPACE)

    def watch_interrupts(self, fd: int) -> None:
        # Interrupts come on a pipe of their own, so requests reach the main thread directly
        # (one wake-up per call, not two). Its end means the server is gone: so are we.
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b""
            if not data:
                os._exit(0)
            for byte in data:
                self.interrupt(hard=byte == ord("k"))

    def set_busy(self, kind: str | None) -> None:
        with self.busy_lock:
            self.busy = kind

    def interrupt(self, hard: bool) -> None:
        with self.busy_lock:
            self._interrupt(hard)

    def _interrupt(self, hard: bool) -> None:
        sig = signal.SIGKILL if hard else signal.SIGINT
        if self.busy == "bash":
            self.shell.interrupt(sig)
        elif self.busy == "python":
            # Children of the interpreter (os.system, subprocess) share our process group.
            me = os.getpid()
            for pid in _group_members(os.getpgid(0)):
                if pid != me:
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
            if not hard and self.main_thread is not None:
                signal.pthread_kill(self.main_thread, signal.SIGINT)

    def serve(self, interrupt_fd: int) -> None:
        threading.Thread(target=self.watch_interrupts, args=(interrupt_fd,), daemon=True).start()
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError, ValueError):
                return
            try:
                reply = self.handle(msg)
            except KeyboardInterrupt:
                reply = {"stdout": "", "stderr": "KeyboardInterrupt\n", "return_code": 130}
            self.channel.send(reply)

    def warm_up(self) -> None:
        """Run one empty call, so the first real one does not pay for first-time set-up."""
        with Capture(1024):
            self.interp.run("None")
        self.interp.cell = 0
        scan()

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        limit = int(msg.get("limit", 1 << 20))
        if op == "ping":
            return {"ok": True}
        if op == "python":
            before = scan()
            self.set_busy("python")
            try:
                with Capture(limit) as cap:
                    rc = self.interp.run(str(msg["code"]))
            finally:
                self.set_busy(None)
            return {
                "stdout": cap.out,
                "stderr": cap.err,
                "return_code": rc,
                "files": produced(before),
            }
        if op == "bash":
            before = scan()
            self.set_busy("bash")
            try:
                out, err, rc = self.shell.run(str(msg["command"]), limit)
            finally:
                self.set_busy(None)
            return {"stdout": out, "stderr": err, "return_code": rc, "files": produced(before)}
        if op == "edit":
            out, err, rc = self.editor.run(msg)
            return {"stdout": out, "stderr": err, "return_code": rc, "files": []}
        return {"stdout": "", "stderr": f"unknown op {op!r}\n", "return_code": 2, "files": []}


def _group_members(pgid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:
                pids.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def preimport() -> None:
    """Import the data stack and run its first-use paths, so a leased sandbox answers at once."""
    import io

    import matplotlib.pyplot as plt
    import numpy  # noqa: F401
    import pandas as pd
    import sandbank_mplbackend  # noqa: F401 - resolving the backend costs ~20 ms on first use

    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).groupby("b").sum().describe()
    fig = plt.figure(figsize=(1, 1))  # loads the font cache: a first chart then takes ~50 ms
    plt.plot([0, 1])
    fig.savefig(io.BytesIO(), format="png")
    plt.close("all")


def main() -> None:
    channel = Channel()
    os.chdir(WORKSPACE)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if os.environ.get("SANDBANK_SITE"):  # set only when this server has egress
        import sandbank_egress  # beside this file

        sandbank_egress.start()  # the session's site directory and the relay to the proxy
    sys.argv = [""]
    if os.environ.get("SANDBANK_PREIMPORT") == "1":
        try:
            preimport()
        except Exception:
            traceback.print_exc()
    # The namespace the user sees starts clean: drop what the worker itself defined.
    sys.modules["__main__"] = types.ModuleType("__main__")
    worker = Worker(channel)
    worker.interp.namespace = sys.modules["__main__"].__dict__
    worker.interp.namespace["__builtins__"] = __builtins__
    interrupt_fd = int(os.environ.pop("SANDBANK_INTERRUPT_FD"))
    os.set_inheritable(interrupt_fd, False)
    worker.warm_up()
    channel.send({"ready": True, "pid": os.getpid(), "t": time.time()})
    worker.serve(interrupt_fd)


if __name__ == "__main__":
    main()
