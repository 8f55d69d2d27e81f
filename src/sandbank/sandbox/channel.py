"""The host's end of a worker: the process, and the frames of `inside.protocol` over its pipes.

Everything read from a worker was written by a process user code controls: frames are
size-capped, and a frame that breaks the protocol means the worker is broken (`WorkerBroken`),
which the caller handles like its death.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from .inside import protocol

log = logging.getLogger(__name__)


class WorkerGone(Exception):
    """The worker's pipe closed: it exited or was killed."""


class WorkerBroken(WorkerGone):
    """The worker sent something that breaks the protocol; it must be killed and replaced."""


class WorkerProcess:
    """A worker process and the frames over its pipes."""

    # Every worker process asyncio spawned and has not reaped yet: the orphan reaper skips them.
    spawned: set[int] = set()
    # Once demultiplexed (`demux`): a reader takes every frame, the services' apart.
    _replies: asyncio.Queue[dict[str, Any] | WorkerGone] | None = None
    _splitter: asyncio.Task[None] | None = None
    # The interrupt channel as a stream, once a service request was sent on it (`send_service`),
    # made once under its lock (requests may come at once).
    _control: asyncio.StreamWriter | None = None
    _control_made: asyncio.Lock | None = None

    def __init__(self, proc: asyncio.subprocess.Process, interrupts: int) -> None:
        self.proc = proc
        self._interrupts = interrupts  # write end of the worker's interrupt pipe
        WorkerProcess.spawned.add(proc.pid)
        self._stderr_tail = b""
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    @staticmethod
    def interrupt_pipe() -> tuple[int, int]:
        """(read end for the worker, write end for us); the worker learns its number from env."""
        return os.pipe()

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        env: dict[str, str],
        pass_fds: Sequence[int],
        interrupt_pipe: tuple[int, int],
        cwd: str = "/",
    ) -> WorkerProcess:
        r, w = interrupt_pipe
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                pass_fds=(*pass_fds, r),
                close_fds=True,
                cwd=cwd,
                start_new_session=True,
                limit=1 << 16,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        return cls(proc, w)

    def interrupt(self, hard: bool = False) -> None:
        """SIGINT the running call (hard: SIGKILL its processes); the worker acts at once."""
        byte = protocol.CONTROL_KILL if hard else protocol.CONTROL_INTERRUPT
        if self._control is not None:  # after a service request's frame, never inside one
            if not self._control.is_closing():
                self._control.write(byte)
            return
        with contextlib.suppress(OSError):
            os.write(self._interrupts, byte)

    async def send_service(self, msg: dict[str, Any]) -> None:
        """A service request (processes, watches), on the interrupt channel: the worker's main
        thread reads only calls, and the channel's thread serves these beside a running one."""
        if self._control_made is None:
            self._control_made = asyncio.Lock()
        async with self._control_made:
            if self._control is None:
                if self._interrupts < 0:
                    raise WorkerGone
                loop = asyncio.get_running_loop()
                transport, proto = await loop.connect_write_pipe(
                    asyncio.streams.FlowControlMixin,
                    os.fdopen(os.dup(self._interrupts), "wb", buffering=0),
                )
                self._control = asyncio.StreamWriter(transport, proto, None, loop)
            control = self._control
        try:
            control.write(protocol.CONTROL_SERVICE + protocol.encode(msg))
            await control.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as e:
            raise WorkerGone from e

    def _close_interrupts(self) -> None:
        if self._control is not None:
            if not self._control.transport.is_closing():  # closed already when the worker went
                self._control.transport.abort()
            self._control = None
        if self._interrupts >= 0:
            os.close(self._interrupts)
            self._interrupts = -1

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _drain_stderr(self) -> None:
        # bwrap's and the worker's own diagnostics: keep a short tail for error messages.
        assert self.proc.stderr is not None
        with contextlib.suppress(Exception):
            while chunk := await self.proc.stderr.read(4096):
                self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def diagnostics(self) -> str:
        return self._stderr_tail.decode(errors="replace").strip()

    async def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(protocol.encode(msg))
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as e:
            raise WorkerGone from e

    async def recv(self) -> dict[str, Any]:
        """The next frame of a call; `WorkerGone` when the pipe closed, `WorkerBroken` on a
        bad frame."""
        if self._replies is None:
            return await self._read_frame()
        item = await self._replies.get()
        if isinstance(item, WorkerGone):
            self._replies.put_nowait(item)  # and so for every later call
            raise _fresh(item)
        return item

    def demux(self, on_background: Callable[[dict[str, Any] | None], None]) -> None:
        """From now on a reader takes every frame as it comes: the services' frames (processes,
        watches: `protocol.BACKGROUND`) go to `on_background` (None once the worker is gone),
        a call's to `recv`. Without it nothing reads between calls, and a background process's
        output would wait in the pipe."""
        self._replies = asyncio.Queue()
        self._splitter = asyncio.create_task(self._split(self._replies, on_background))

    async def _split(
        self,
        replies: asyncio.Queue[dict[str, Any] | WorkerGone],
        on_background: Callable[[dict[str, Any] | None], None],
    ) -> None:
        try:
            while True:
                msg = await self._read_frame()
                if protocol.BACKGROUND in msg:
                    try:
                        on_background(msg)
                    except Exception:  # a listener's failure must not stop the calls' frames
                        log.exception("a background frame could not be handled")
                else:
                    replies.put_nowait(msg)
        except WorkerGone as e:
            replies.put_nowait(_fresh(e))
        except asyncio.CancelledError:
            replies.put_nowait(WorkerGone())
        finally:
            on_background(None)

    def stop_reading(self) -> None:
        if self._splitter is not None:
            self._splitter.cancel()

    async def _read_frame(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        return await read_frame(self.proc.stdout)

    async def wait(self, timeout: float = 5.0) -> int | None:
        try:
            status = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            return None
        WorkerProcess.spawned.discard(self.proc.pid)
        return status

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    async def close(self) -> None:
        self.kill()
        self.stop_reading()
        await self.wait()
        self._stderr_task.cancel()
        with contextlib.suppress(BaseException):
            await self._stderr_task
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        self._close_interrupts()


def _fresh(gone: WorkerGone) -> WorkerGone:
    """The same news without a traceback: one kept in the queue (or raised again from it) would
    hold the frames that hold the worker that holds the queue, a cycle only a full collection
    frees, and the server's heap is frozen as it settles (heap.py)."""
    return type(gone)(*gone.args)


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    """A worker's next frame; `WorkerGone` when the pipe closed, `WorkerBroken` on a bad one."""
    try:
        head = await reader.readexactly(protocol.HEADER.size)
        (size,) = protocol.HEADER.unpack(head)
        protocol.check_size(size, protocol.MAX_REPLY)
        return protocol.decode(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionResetError) as e:
        raise WorkerGone from e
    except protocol.ProtocolViolation as e:
        raise WorkerBroken(str(e)) from e
