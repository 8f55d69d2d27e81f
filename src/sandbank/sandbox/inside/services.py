"""Services beside calls: one reader of the channel, serving processes and watches at once.

The worker's main thread runs one call at a time; a call may run for minutes. A reader thread
takes every frame off the channel: a call goes to the main thread (in order), a service
request (`{"svc": ...}`) is served here and answered `{"bg": "reply", "rid": ...}` at once, so
a process can be started, fed or killed while a cell runs.
"""

from __future__ import annotations

import base64
import binascii
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from . import protocol as p
from .processes import Processes, ServiceError
from .watch import Watches

WORKSPACE = os.environ.get("SANDBANK_WORKSPACE", "/workspace")


class Channel(Protocol):
    def recv(self) -> dict[str, Any]: ...
    def send(self, msg: dict[str, Any]) -> None: ...


class Services:
    """The reader thread and what it serves."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.processes = Processes(channel.send)
        self.watches = Watches(channel.send)
        self._calls: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def split(self) -> Callable[[], dict[str, Any]]:
        """Start reading; the returned function gives the next call (EOFError at the end)."""
        threading.Thread(target=self._read, daemon=True).start()
        return self._next_call

    def _next_call(self) -> dict[str, Any]:
        msg = self._calls.get()
        if msg is None:
            raise EOFError
        return msg

    def _read(self) -> None:
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError, p.ProtocolViolation):
                self._calls.put(None)
                return
            if p.SERVICE in msg:
                self._serve(msg)
            else:
                self._calls.put(msg)

    def _serve(self, msg: dict[str, Any]) -> None:
        rid = msg.get("rid")

        def reply(body: dict[str, Any]) -> None:
            self.channel.send({p.BACKGROUND: "reply", "rid": rid, **body})

        try:
            answer = self._handle(msg, reply)
        except ServiceError as e:
            answer = {"error": str(e), "code": e.code}
        except Exception as e:  # never die of a request: say what broke
            answer = {"error": f"the request failed inside the sandbox: {e!r}", "code": "internal"}
        if answer is not None:
            reply(answer)

    def _handle(
        self, msg: dict[str, Any], reply: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any] | None:
        """The answer, or None when the request answers itself later (`reply`)."""
        op = msg[p.SERVICE]
        if op == p.SVC_START:
            self.processes.start(msg, reply)
            return None
        if op == p.SVC_LIST:
            return {"processes": self.processes.listing()}
        if op == p.SVC_INPUT:
            try:
                data = base64.b64decode(str(msg.get("data") or ""), validate=True)
            except (binascii.Error, ValueError):
                raise ServiceError("invalid_argument", "the input is not base64") from None
            self.processes.write(msg.get("pid"), data, reply)
            return None
        if op == p.SVC_CLOSE_STDIN:
            self.processes.write(msg.get("pid"), None, reply)
            return None
        if op == p.SVC_SIGNAL:
            self.processes.signal(msg.get("pid"), str(msg.get("signal")))
            return {}
        if op == p.SVC_WATCH:
            path = os.path.join(WORKSPACE, str(msg.get("path")))  # relative: the workspace's
            return {"wid": self.watches.watch(path, bool(msg.get("recursive")))}
        if op == p.SVC_UNWATCH:
            self.watches.unwatch(msg.get("wid"))
            return {}
        raise ServiceError("invalid_argument", f"unknown service {op!r}")
