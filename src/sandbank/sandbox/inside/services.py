"""Services beside calls: background processes and directory watches.

The worker's main thread runs one call at a time; a call may run for minutes. Service requests
(`{"svc": ...}`) come on the interrupt channel instead, whose thread serves them here and
answers `{"bg": "reply", "rid": ...}` on the reply pipe at once, so a process can be started,
fed or killed while a cell runs.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable
from typing import Any, Protocol

from . import protocol as p
from .processes import Processes, ServiceError
from .watch import Watches

WORKSPACE = os.environ.get("SANDBANK_WORKSPACE", "/workspace")


class Channel(Protocol):
    def send(self, msg: dict[str, Any]) -> None: ...


class Services:
    """What the interrupt channel's thread serves."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.processes = Processes(channel.send)
        self.watches = Watches(channel.send)

    def serve(self, msg: dict[str, Any]) -> None:
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
