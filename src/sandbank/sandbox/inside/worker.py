"""The process inside a sandbox: serves calls on a persistent Python, a persistent bash, an editor.

Runs as the session's unprivileged user under the runtime's Python, as `python -m
sandbank_inside.worker`. Standard library only: it imports nothing from the server. It speaks
the frames of `protocol` on the pipes it was started with (fd 0 in, fd 1 out), which it moves
out of the way first, so user code and its children never see them as 0, 1 or 2.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from . import protocol as p
from . import snapshot
from .capture import Capture
from .contexts import Contexts
from .editor import Editor
from .files import Tracker
from .notebook import session_shell
from .pyexec import PythonRunner
from .services import Services
from .shell import Shell, ShellUnavailable

WORKSPACE = os.environ.get("SANDBANK_WORKSPACE", "/workspace")


class Channel:
    """The call pipes, off fds 0 and 1; only the worker process itself ever uses them.

    The main thread reads the calls itself (no reader thread hands them over: a warm call's
    system calls are few, which gVisor charges ~75 us each); requests beside a running call
    (services) come on the interrupt channel (`Worker.watch_interrupts`).
    """

    def __init__(self) -> None:
        self.forked = False  # in a fork of user code, which must never speak here
        self.buf = bytearray()
        self.rfd = os.dup(0)
        self.wfd = os.dup(1)
        os.set_inheritable(self.rfd, False)
        os.set_inheritable(self.wfd, False)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        self.lock = threading.Lock()
        # A fork of user code (os.fork, multiprocessing) must never speak on the channel.
        os.register_at_fork(after_in_child=self._close_in_child)

    def _close_in_child(self) -> None:
        self.forked = True
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.rfd = self.wfd = -1

    def recv(self) -> dict[str, Any]:
        """The next frame: usually one read for its header and body together."""
        return p.next_frame(self.buf, lambda n: os.read(self.rfd, n), p.MAX_REQUEST)

    def send(self, msg: dict[str, Any]) -> None:
        if self.forked:
            return
        data = p.encode(msg)
        with self.lock:
            view = memoryview(data)
            while view:
                n = os.write(self.wfd, view)
                view = view[n:]


class Worker:
    """The request loop, on the main thread; interrupts arrive on a pipe of their own."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.python = PythonRunner(session_shell(), forked=lambda: channel.forked)
        self.contexts = Contexts(self.python, WORKSPACE)
        self.services = Services(channel)  # background processes and watches, beside calls
        self.shell = Shell(WORKSPACE)
        self.editor = Editor(WORKSPACE)
        self.tracker = Tracker(WORKSPACE)  # what a call produced (set up at the first call)
        self.busy: str | None = None
        self.busy_lock = threading.Lock()  # no interrupt is sent once a call has ended
        self.main_thread = threading.main_thread().ident

    def watch_interrupts(self, fd: int) -> None:
        """Serve the interrupt channel: interrupts, and services' requests beside a call."""
        buf = bytearray()

        def read(n: int) -> bytes:
            try:
                return os.read(fd, n)
            except OSError:
                return b""

        while True:
            if not buf and not (buf := bytearray(read(65536))):
                os._exit(0)  # the channel's end means the server is gone: so are we
            kind = bytes(buf[:1])
            del buf[:1]
            if kind in (p.CONTROL_INTERRUPT, p.CONTROL_KILL):
                self.interrupt(hard=kind == p.CONTROL_KILL)
            elif kind == p.CONTROL_SERVICE:
                try:
                    msg = p.next_frame(buf, read, p.MAX_REQUEST)
                except (EOFError, p.ProtocolViolation):
                    os._exit(0)  # a broken channel: the server restarts the worker
                self.services.serve(msg)

    def interrupt(self, hard: bool) -> None:
        with self.busy_lock:
            sig = signal.SIGKILL if hard else signal.SIGINT
            if self.busy == p.OP_BASH:
                self.shell.interrupt(sig)
            elif self.busy in (p.OP_PYTHON, p.OP_EDIT):
                if self.busy == p.OP_PYTHON:
                    # Children of the interpreter (os.system, subprocess) share our group.
                    me = os.getpid()
                    for pid in _group_members(os.getpgid(0)):
                        if pid != me:
                            with contextlib.suppress(OSError):
                                os.kill(pid, sig)
                if not hard and self.main_thread is not None:
                    signal.pthread_kill(self.main_thread, signal.SIGINT)

    @contextlib.contextmanager
    def busy_with(self, op: str) -> Any:
        with self.busy_lock:
            self.busy = op
        try:
            yield
        finally:
            with self.busy_lock:
                self.busy = None

    def serve(self, interrupt_fd: int) -> None:
        threading.Thread(target=self.watch_interrupts, args=(interrupt_fd,), daemon=True).start()
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError, p.ProtocolViolation):
                return
            if p.SERVICE in msg:  # services belong on the interrupt channel; served all the same
                self.services.serve(msg)
                continue
            try:
                reply = self.handle(msg)
            except KeyboardInterrupt:
                reply = p.result(stderr="KeyboardInterrupt\n", return_code=130)
            except Exception as e:  # never die of a request: say what broke
                reply = p.result(
                    stderr=f"[sandbank] the call failed inside the sandbox: {e!r}\n",
                    return_code=1,
                )
            self.channel.send(reply)

    def warm_up(self) -> None:
        """Run one empty call, so the first real one does not pay for first-time set-up."""
        with Capture(1024):
            self.python.warm_up()
        self.tracker.before()  # the workspace's watch set up and walked, not on the first call

    def _live(self) -> tuple[Callable[[str], None], Callable[[str], None]]:
        """Senders of a streamed call's output, as event frames before its reply."""

        def sender(kind: str) -> Callable[[str], None]:
            return lambda text: self.channel.send({p.EVENT: kind, "data": text})

        return sender(p.EVENT_STDOUT), sender(p.EVENT_STDERR)

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        limit = int(msg.get(p.LIMIT, 1 << 20))
        live = self._live() if msg.get(p.STREAM) else None
        if op == p.OP_PING:
            return {"ok": True}
        if op == p.OP_PYTHON:
            with self.contexts.entered(msg) as python:
                python.on_display = (
                    (lambda b: self.channel.send({p.EVENT: p.EVENT_DISPLAY, "data": b}))
                    if live
                    else None
                )
                # The capture's polls also say whether the workspace's watch has events.
                with Capture(limit, live, watch=self.tracker.fd) as cap:
                    before = self.tracker.before(pending=cap.watch_ready[0])
                    with self.busy_with(p.OP_PYTHON):
                        rc = python.run(str(msg["code"]))
            files = self.tracker.produced(before, pending=cap.watch_ready[1])
            reply = p.result(cap.out, cap.err, rc, files, python.displays)
            if msg.get(p.NOTEBOOK):
                reply[p.MAIN], reply[p.ERROR] = python.main, python.error
            return reply
        if op in (p.OP_SAVE, p.OP_RESTORE):
            path = os.path.join(WORKSPACE, os.path.basename(str(msg[p.PATH])))
            try:
                save_or_restore = snapshot.save if op == p.OP_SAVE else snapshot.restore
                return {"ok": True, p.LOST: save_or_restore(self, path)}
            except Exception as e:
                with contextlib.suppress(OSError):
                    os.unlink(f"{path}.tmp")
                return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        if op == p.OP_DROP_CONTEXT:
            self.contexts.drop(str(msg.get(p.CONTEXT)))
            return p.result()
        if op == p.OP_BASH:
            before = self.tracker.before()
            try:
                with self.busy_with(p.OP_BASH):
                    out, err, rc = self.shell.run(str(msg["command"]), limit, live)
            except ShellUnavailable as e:
                return p.result(stderr=f"[sandbank] {e}\n", return_code=1)
            return p.result(out, err, rc, self.tracker.produced(before))
        if op == p.OP_EDIT:
            with self.busy_with(p.OP_EDIT):
                out, err, rc = self.editor.run(msg)
            return p.result(out, err, rc)
        return p.result(stderr=f"unknown op {op!r}\n", return_code=2)


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
    import sandbank_mplbackend  # noqa: F401 - ~20 ms on first use

    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).groupby("b").sum().describe()
    fig = plt.figure(figsize=(1, 1))  # loads the font cache: a first chart then takes ~50 ms
    plt.plot([0, 1])
    fig.savefig(io.BytesIO(), format="png")
    plt.close("all")


def interrupt_channel() -> int:
    """The descriptor interrupts arrive on: inherited (bwrap, fork), or under gVisor, which
    passes no descriptor but stdio, a unix socket the host listens on (connected first, the
    host waits for it)."""
    path = os.environ.pop("SANDBANK_INTERRUPT_SOCKET", "")
    if path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock.detach()
    return int(os.environ.pop("SANDBANK_INTERRUPT_FD"))


def main() -> None:
    interrupt_fd = interrupt_channel()
    channel = Channel()
    os.chdir(WORKSPACE)
    if os.environ.get("SANDBANK_SITE"):  # set only when this server has egress
        from . import sandbank_egress

        sandbank_egress.start()  # the session's site directory and the relay to the proxy
    sys.argv = [""]
    import sandbank_plotly  # plotly's `fig.show()` saves JSON files (a lazy import hook)

    sandbank_plotly.install()
    if os.environ.get("SANDBANK_PREIMPORT") == "1":
        try:
            preimport()
        except Exception:
            traceback.print_exc()
    # The namespace the user sees starts clean: the shell's own fresh __main__, not this module.
    worker = Worker(channel)
    os.set_inheritable(interrupt_fd, False)
    worker.warm_up()
    channel.send({p.READY: True, "pid": os.getpid()})
    worker.serve(interrupt_fd)


if __name__ == "__main__":
    main()
