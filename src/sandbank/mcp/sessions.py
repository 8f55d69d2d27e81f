"""Who calls the MCP door, and the default session each caller works in without a handle.

A caller is a tenant (its bearer token, as on the code-execution API) and a client identity:
- stdio: the process (one default session per `sandbank mcp`);
- HTTP, handshake era: the MCP session (`Mcp-Session-Id`), one default session each;
- HTTP, 2026-07-28: the token and the client's declared `clientInfo` (name and version), since
  the protocol has no connection to hang state on.

A default session is a session named after its caller (`SessionSpec.name`): asking the port
for it again gives the same session back while it lives, from any replica (on a fleet the name
belongs to one node, the same for every front). `DefaultSessions` remembers, in this process,
the ones it has seen, so a warm call makes one port call, not two.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import SessionNotFound
from ..protocol.sessions import SessionInfo

MAX_REMEMBERED = 10_000  # callers whose default session is remembered (least recently used go)


@dataclass(frozen=True)
class Caller:
    """The tenant of a request and the identity its default session is kept under."""

    tenant: str
    identity: str


class DefaultGone(SessionNotFound):
    """A caller's default session ended (reclaimed after being idle, or its machine went)."""


class DefaultSessions:
    """Each caller's default session id as this process last knew it.

    A default session ends like any session (idle reclaim, lifetime, end_session); the call
    that finds it gone says so and forgets it, and the next call asks the port again, which
    makes a fresh one.
    """

    def __init__(self) -> None:
        self._ids: OrderedDict[Caller, str] = OrderedDict()
        self._making: dict[Caller, asyncio.Future[str]] = {}

    def get(self, caller: Caller) -> str | None:
        session_id = self._ids.get(caller)
        if session_id is not None:
            self._ids.move_to_end(caller)
        return session_id

    async def get_or_create(
        self, caller: Caller, create: Callable[[], Awaitable[SessionInfo]]
    ) -> tuple[str, bool]:
        """(the caller's default session id, whether it was made now); concurrent first calls
        of one caller share one new session."""
        known = self.get(caller)
        if known is not None:
            return known, False
        making = self._making.get(caller)
        if making is not None:
            return await asyncio.shield(making), False
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._making[caller] = future
        try:
            info = await create()
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiters get it, nobody else must
            raise
        finally:
            self._making.pop(caller, None)
        future.set_result(info.id)
        self._ids[caller] = info.id
        while len(self._ids) > MAX_REMEMBERED:
            self._ids.popitem(last=False)
        return info.id, True

    def forget(self, caller: Caller, session_id: str | None = None) -> bool:
        """Forget the caller's default (only if it is `session_id`, when given)."""
        if session_id is not None and self._ids.get(caller) != session_id:
            return False
        return self._ids.pop(caller, None) is not None
