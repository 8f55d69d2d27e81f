"""Output capture: pipes drained for the worker's whole life, each call's output between markers.

Python's fds 1 and 2 and bash's stdout and stderr are such pipes, so a call costs two markers
written into them (one before the call, one after), not new pipes and threads. What arrives
before a call's start marker was written while no call ran (a background thread, a process
left running) and is dropped: output is never attributed to a later call.
"""

from __future__ import annotations

import codecs
import fcntl
import os
import secrets
import sys
import threading
from collections.abc import Callable

_WAIT, _COLLECT, _IDLE = 0, 1, 2


class Stream(threading.Thread):
    """Drains one pipe; between `begin` and the end marker it keeps at most `limit` bytes."""

    def __init__(self, r: int, fd: int = -1) -> None:
        super().__init__(daemon=True)
        self.r = r
        self.fd = fd  # the descriptor writing into the pipe, where the worker owns it
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.start_marker = self.end_marker = b""
        self.state = _IDLE
        self.limit = 0
        self.data = bytearray()
        self.dropped = 0
        self.tail = b""
        self.ended = False
        self.live: Callable[[str], None] | None = None  # gets the call's text as it comes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.start()

    @classmethod
    def onto(cls, fd: int) -> Stream:
        """A stream that `fd` (1 or 2) writes into from now on."""
        # Above 9: with fd 1 or 2 closed by user code, a new pipe would take its number.
        r, w = (above_stdio(x) for x in os.pipe())
        os.dup2(w, fd)
        os.close(w)
        return cls(r, fd)

    def begin(
        self, markers: tuple[bytes, bytes], limit: int, live: Callable[[str], None] | None = None
    ) -> None:
        with self.lock:
            self.start_marker, self.end_marker = markers
            self.limit = limit
            self.live = live
            self._decoder.reset()
            self.data, self.dropped, self.tail = bytearray(), 0, b""
            self.state = _WAIT
            self.done.clear()

    def write_marker(self, marker: bytes) -> bool:
        try:
            os.write(self.fd, marker)
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
                    if self.state == _COLLECT:
                        self._keep(self.tail)
                    self.tail = b""
                    self.ended = True
                    self.state = _IDLE
                    self.done.set()
                    os.close(self.r)
                    return
                self._consume(chunk)

    def _consume(self, chunk: bytes) -> None:
        buf = self.tail + chunk
        self.tail = b""
        while buf:
            if self.state == _IDLE:
                return  # between calls: nobody is listening
            marker = self.start_marker if self.state == _WAIT else self.end_marker
            idx = buf.find(marker)
            if idx < 0:
                keep = _partial(buf, marker)  # the marker may be split across reads
                if self.state == _COLLECT:
                    self._keep(buf[: len(buf) - keep])
                self.tail = buf[len(buf) - keep :]
                return
            if self.state == _COLLECT:
                self._keep(buf[:idx])
                self.state = _IDLE
                self.done.set()
            else:
                self.state = _COLLECT
            buf = buf[idx + len(marker) :]

    def _keep(self, data: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            kept = data[:room]
            self.data += kept
            if self.live is not None and kept:
                text = self._decoder.decode(kept)
                if text:
                    self.live(text)
        self.dropped += max(0, len(data) - max(room, 0))

    def text(self, timeout: float = 2.0) -> str:
        self.done.wait(timeout)
        with self.lock:
            out = self.data.decode("utf-8", errors="replace")
            if self.dropped:
                out += f"\n[output truncated: {self.dropped} more bytes not shown]\n"
            self.data = bytearray()
            return out


def _partial(buf: bytes, marker: bytes) -> int:
    """How many bytes at the end of `buf` could be the start of `marker` (held back for now)."""
    start = max(0, len(buf) - len(marker) + 1)
    at = buf.find(marker[:1], start)  # usually none: the markers start with NUL or `__`
    while at >= 0:
        if marker.startswith(buf[at:]):
            return len(buf) - at
        at = buf.find(marker[:1], at + 1)
    return 0


def above_stdio(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def new_markers(nul: bool = True) -> tuple[bytes, bytes]:
    """A call's (start, end) markers; NUL-wrapped unless they pass through a shell's printf."""
    token = secrets.token_hex(8)
    wrap = "\x00" if nul else ""
    return (
        f"{wrap}__SANDBANK_BEGIN_{token}__{wrap}".encode(),
        f"{wrap}__SANDBANK_END_{token}__{wrap}".encode(),
    )


def flush_python_streams() -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: S110 - user code may have broken its own streams
        pass


class Capture:
    """Delimits one Python call's output on the worker's persistent fds 1 and 2."""

    streams: list[Stream] = []

    def __init__(
        self, limit: int, live: tuple[Callable[[str], None], Callable[[str], None]] | None = None
    ) -> None:
        self.limit = limit
        self.live = live
        self.out = self.err = ""
        if not Capture.streams:
            Capture.streams = [Stream.onto(1), Stream.onto(2)]

    def __enter__(self) -> Capture:
        # Text a background thread printed since the last call goes out before the start
        # marker, so it is dropped rather than shown as this call's.
        flush_python_streams()
        self.markers = new_markers()
        for i, s in enumerate(self.streams):
            live = self.live[i] if self.live else None
            s.begin(self.markers, self.limit, live)
            if not s.write_marker(self.markers[0]):
                s = Capture.streams[i] = Stream.onto(s.fd)  # fd 1 or 2 was gone
                s.begin(self.markers, self.limit, live)
                s.write_marker(self.markers[0])
        return self

    def __exit__(self, *exc: object) -> None:
        flush_python_streams()
        marked = [s.write_marker(self.markers[1]) for s in self.streams]  # both, then wait
        for i, (s, ok) in enumerate(zip(self.streams, marked, strict=True)):
            if not (ok and s.done.wait(2.0)) or s.ended:
                # User code closed or redirected fd 1 or 2: the next call gets a fresh stream.
                Capture.streams[i] = Stream.onto(s.fd)
        self.out, self.err = (s.text(0) for s in self.streams)
