"""The host's side of a worker's services: background processes and watches, beside calls.

One per worker (a restarted worker starts with none): requests go out as `{"svc": ...}`
frames, their answers and the processes' and watches' frames come back through the worker's
reader (`WorkerProcess.demux`) to `dispatch`, which hands them to their listeners. Everything
read here was written by a process user code controls: it is checked, and a listener that
falls too far behind is cut off rather than buffered without end.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    NotFound,
    SandbankError,
    SandboxError,
)
from ..protocol.filesystem import CHANGE_KINDS, FsChange
from ..protocol.processes import (
    Exited,
    ProcessEvent,
    ProcessInfo,
    ProcessOutput,
    ProcessSpec,
    Signal,
    Started,
)
from .inside import protocol

REQUEST_TIMEOUT = 60.0  # a request waits at most this (stdin to a process that reads nothing)
MAX_BEHIND = 32 * 1024 * 1024  # bytes a listener may have unread before it is cut off
GONE = "the sandbox's interpreter was restarted or the session ended; its processes are gone"


class Worker(Protocol):
    """What is asked of a worker here: sending it a service request."""

    async def send_service(self, msg: dict[str, Any]) -> None: ...


class Behind(SandboxError):
    """A listener read too slowly and was cut off."""


@dataclass(eq=False)
class Listener:
    """One stream of a process's events (or a watch's changes), and what it has not read."""

    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    unread: int = 0
    cut: bool = False

    def put(self, item: Any, size: int = 0) -> None:
        if self.cut:
            return
        self.unread += size
        if self.unread > MAX_BEHIND:
            self.cut = True
            item = Behind("the output came faster than it was read; this stream was cut off")
        self.queue.put_nowait(item)

    async def get(self) -> Any:
        item = await self.queue.get()
        if isinstance(item, ProcessOutput):
            self.unread -= len(item.data)
        if isinstance(item, BaseException):
            raise item
        return item


@dataclass
class Record:
    """A running process: what started it and who listens."""

    info: ProcessInfo
    listeners: set[Listener] = field(default_factory=set)


class Background:
    """Processes and watches of one worker."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.processes: dict[int, Record] = {}
        self.watches: dict[int, Listener] = {}
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], Any]] = {}
        self._ids = itertools.count(1)
        self.gone = False

    # --- frames from the worker -----------------------------------------------------------
    def dispatch(self, msg: dict[str, Any] | None) -> None:
        """A frame for the services (None: the worker is gone)."""
        if msg is None:
            self._end_all()
            return
        kind = msg.get(protocol.BACKGROUND)
        if kind == "reply":
            self._answered(msg)
        elif kind == "proc":
            self._process_frame(msg)
        elif kind == "watch":
            self._watch_frame(msg)

    def _answered(self, msg: dict[str, Any]) -> None:
        pending = self._pending.pop(msg.get("rid"), None)  # type: ignore[arg-type]
        if pending is None or pending[0].done():
            return
        future, started = pending
        if started is not None and not msg.get("error") and isinstance(msg.get("pid"), int):
            # Registered before anything else is read: its output may be the next frame.
            spec, listener = started
            record = Record(ProcessInfo(msg["pid"], spec), {listener})
            self.processes[msg["pid"]] = record
        future.set_result(msg)

    def _process_frame(self, msg: dict[str, Any]) -> None:
        record = self.processes.get(msg.get("pid"))  # type: ignore[arg-type]
        if record is None:
            return
        end = msg.get("end")
        if isinstance(end, dict):
            del self.processes[record.info.pid]
            exited = _exited(end)
            for listener in record.listeners:
                listener.put(exited)
            return
        for stream in ("stdout", "stderr"):
            data = msg.get(stream)
            if isinstance(data, str):
                try:
                    chunk = base64.b64decode(data, validate=True)
                except (binascii.Error, ValueError):
                    return
                event = ProcessOutput(stream, chunk)
                for listener in record.listeners:
                    listener.put(event, len(chunk))

    def _watch_frame(self, msg: dict[str, Any]) -> None:
        listener = self.watches.get(msg.get("wid"))  # type: ignore[arg-type]
        if listener is None:
            return
        for item in msg.get("changes") or []:
            if (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], str)
                and item[1] in CHANGE_KINDS
            ):
                listener.put(FsChange(item[0], item[1]), len(item[0]))
        if msg.get("end"):
            self.watches.pop(msg["wid"], None)
            listener.put(None)

    def _end_all(self) -> None:
        self.gone = True
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(SandboxError(GONE))
        self._pending.clear()
        ended = Exited(-1, False, "signal: killed", GONE)
        for record in self.processes.values():
            for listener in record.listeners:
                listener.put(ended)
        self.processes.clear()
        for listener in self.watches.values():
            listener.put(None)
        self.watches.clear()

    # --- requests ---------------------------------------------------------------------------
    async def request(
        self, op: str, started: tuple[ProcessSpec, Listener] | None = None, **fields: Any
    ) -> dict[str, Any]:
        if self.gone:
            raise SandboxError(GONE)
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (future, started)
        try:
            await self.worker.send_service({protocol.SERVICE: op, "rid": rid, **fields})
            async with asyncio.timeout(REQUEST_TIMEOUT):
                reply = await future
        except TimeoutError:
            raise SandboxError("the sandbox did not answer in time") from None
        except SandbankError:
            raise
        except Exception as e:  # the worker's pipe closed under the request
            raise SandboxError(GONE) from e
        finally:
            self._pending.pop(rid, None)
        if reply.get("error"):
            raise _error_of(reply)
        return reply

    async def start(self, spec: ProcessSpec) -> AsyncIterator[ProcessEvent]:
        """Start a process; its events (`Started` first) once the sandbox has it running."""
        listener = Listener()
        reply = await self.request(
            protocol.SVC_START,
            started=(spec, listener),
            cmd=spec.cmd,
            args=list(spec.args),
            envs=dict(spec.envs),
            cwd=spec.cwd,
            stdin=spec.stdin,
            tag=spec.tag,
            timeout=spec.timeout,
        )
        pid = int(reply["pid"])
        return self._follow(pid, listener, self.processes.get(pid))

    def connect(self, pid: int) -> AsyncIterator[ProcessEvent]:
        """A running process's events from now on (`Started` first)."""
        record = self.processes.get(pid)
        if record is None:
            raise NotFound(f"process with pid {pid} not found")
        listener = Listener()
        record.listeners.add(listener)
        return self._follow(pid, listener, record)

    async def _follow(
        self, pid: int, listener: Listener, record: Record | None
    ) -> AsyncIterator[ProcessEvent]:
        try:
            yield Started(pid)
            # A quick process may have ended already: its events wait in the listener.
            while True:
                event = await listener.get()
                yield event
                if isinstance(event, Exited):
                    return
        finally:
            if record is not None:
                record.listeners.discard(listener)  # the process goes on

    def listing(self) -> list[ProcessInfo]:
        return [record.info for record in self.processes.values()]

    def known(self, pid: int) -> None:
        if pid not in self.processes:
            raise NotFound(f"process with pid {pid} not found")

    async def write(self, pid: int, data: bytes) -> None:
        self.known(pid)
        await self.request(protocol.SVC_INPUT, pid=pid, data=base64.b64encode(data).decode())

    async def close_stdin(self, pid: int) -> None:
        self.known(pid)
        await self.request(protocol.SVC_CLOSE_STDIN, pid=pid)

    async def signal(self, pid: int, sig: Signal) -> None:
        self.known(pid)
        await self.request(protocol.SVC_SIGNAL, pid=pid, signal=sig)

    async def watch(self, path: str, recursive: bool) -> AsyncIterator[FsChange]:
        """Changes under `path` (as the sandbox sees it), once the watch is in place."""
        reply = await self.request(protocol.SVC_WATCH, path=path, recursive=recursive)
        wid = int(reply["wid"])
        listener = Listener()
        self.watches[wid] = listener
        return self._changes(wid, listener)

    async def _changes(self, wid: int, listener: Listener) -> AsyncIterator[FsChange]:
        try:
            while (change := await listener.get()) is not None:
                listener.unread -= len(change.path)
                yield change
        finally:
            if self.watches.pop(wid, None) is not None and not self.gone:
                with contextlib.suppress(SandbankError):
                    await asyncio.shield(self.request(protocol.SVC_UNWATCH, wid=wid))


def _exited(end: dict[str, Any]) -> Exited:
    try:
        code = int(end.get("exit_code", -1))
    except (TypeError, ValueError):
        code = -1
    error = end.get("error")
    return Exited(
        code,
        bool(end.get("exited")),
        str(end.get("status") or "")[:200],
        str(error)[:1000] if error else None,
    )


def _error_of(reply: dict[str, Any]) -> SandbankError:
    message = str(reply.get("error"))[:2000]
    code = reply.get("code")
    if code == "not_found":
        return NotFound(message)
    if code == "invalid_argument":
        return BadRequest(message)
    if code == "failed_precondition":
        return Conflict(message)
    if code == "resource_exhausted":
        return AtCapacity(message, retry_after=1)
    return SandboxError(message)
