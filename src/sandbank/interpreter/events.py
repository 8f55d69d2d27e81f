"""The live events of sessions: what a run here does, told at once to this replica's
listeners, and the stream that follows one session through the store.

A run on another replica is seen by reading the store every `POLL_S`; the model's text as it
is generated is told only to listeners on the replica that runs it (it is never stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from sandbank.errors import AtCapacity, TooManyStreams
from sandbank.store import ChatSession, Message, Store

POLL_S = 0.4  # how often a stream reads the store when nothing here woke it
HEARTBEAT_S = 15.0  # a comment line this often keeps idle proxies from closing the stream

EndReason = Literal["ended", "deleted", "timeout", "shutdown"]


@dataclass(eq=False)  # by identity: kept in sets
class Listener:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    texts: list[tuple[int, str]] = field(default_factory=list)  # (step, piece)

    def take(self) -> list[tuple[int, str]]:
        """The pieces told since the last take, those of one step joined."""
        joined: list[tuple[int, str]] = []
        for step, piece in self.texts:
            if joined and joined[-1][0] == step:
                joined[-1] = (step, joined[-1][1] + piece)
            else:
                joined.append((step, piece))
        self.texts = []
        return joined


class SessionEvents:
    """This replica's listeners, by session."""

    def __init__(self) -> None:
        self._listeners: dict[str, set[Listener]] = {}
        self.closed = False

    def changed(self, session_id: str) -> None:
        """Something of the session was stored: its listeners read the store now."""
        for listener in self._listeners.get(session_id, ()):
            listener.wake.set()

    def text(self, session_id: str, step: int, piece: str) -> None:
        for listener in self._listeners.get(session_id, ()):
            listener.texts.append((step, piece))
            listener.wake.set()

    @contextlib.contextmanager
    def listen(self, session_id: str) -> Iterator[Listener]:
        listener = Listener()
        self._listeners.setdefault(session_id, set()).add(listener)
        try:
            yield listener
        finally:
            listeners = self._listeners[session_id]
            listeners.discard(listener)
            if not listeners:
                del self._listeners[session_id]

    def close(self) -> None:
        """The server stops: every stream ends now."""
        self.closed = True
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.wake.set()


class StreamSlots:
    """The event streams open on this replica: each reads the store while its run goes, so
    there are at most `total`, and `per_user` of one user (their release is idempotent)."""

    def __init__(self, total: int, per_user: int) -> None:
        self.total = total
        self.per_user = per_user
        self.open: dict[str, int] = {}

    def take(self, user_id: str) -> Callable[[], None]:
        mine = self.open.get(user_id, 0)
        if mine >= self.per_user:
            raise TooManyStreams(
                f"you have {mine} event streams open, the most allowed "
                "(SANDBANK_MAX_EVENT_STREAMS_PER_USER): close one first"
            )
        if sum(self.open.values()) >= self.total:
            raise AtCapacity(
                f"the server has {self.total} event streams open, its most "
                "(SANDBANK_MAX_EVENT_STREAMS): retry shortly, or poll the session",
                retry_after=5,
            )
        self.open[user_id] = mine + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open[user_id] -= 1
                if not self.open[user_id]:
                    del self.open[user_id]

        return release


@dataclass(frozen=True)
class Event:
    kind: Literal["message", "text", "status", "end", "ping"]
    message: Message | None = None
    session: ChatSession | None = None
    step: int = 0
    text: str = ""
    reason: EndReason = "ended"


async def follow(
    store: Store, events: SessionEvents, session_id: str, after: float | None, max_s: float
) -> AsyncIterator[Event]:
    """The session's messages after `after` as they are stored, the model's text (each piece
    before the messages stored after it) and status changes, until the session is not PENDING
    (or is deleted, or `max_s` passed, or the server stops); then one `end`."""
    deadline = time.monotonic() + max_s
    quiet_since = time.monotonic()
    status: tuple[str, str | None] | None = None
    with events.listen(session_id) as listener:
        while True:
            listener.wake.clear()
            texts = listener.take()  # before the store is read: its messages come after them
            session = await store.chats.get(session_id)
            if session is None:
                yield Event("end", reason="deleted")
                return
            # The session is read before its messages: one seen ended comes with all of them.
            messages = await store.chats.messages(session_id, after)
            out = [Event("text", step=step, text=text) for step, text in texts]
            out += [Event("message", message=m) for m in messages]
            if (session.status, session.status_message) != status:
                status = (session.status, session.status_message)
                out.append(Event("status", session=session))
            for event in out:
                yield event
            if messages:
                after = messages[-1].timestamp
            if out:
                quiet_since = time.monotonic()
            if session.status != "PENDING":
                yield Event("end", reason="ended")
                return
            if events.closed or time.monotonic() >= deadline:
                yield Event("end", reason="shutdown" if events.closed else "timeout")
                return
            if time.monotonic() - quiet_since >= HEARTBEAT_S:
                quiet_since = time.monotonic()
                yield Event("ping")
            wait = min(POLL_S, max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.wake.wait(), wait)
