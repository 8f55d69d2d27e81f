"""The interpreter API's service: sessions, messages and files of a user, with their limits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from sandbank.config import Settings
from sandbank.egress.credentials import CredentialError, CredentialInfo, parse_credential
from sandbank.errors import (
    BadRequest,
    Forbidden,
    QuotaExceeded,
    RunInProgress,
    SandbankError,
    SessionNotFound,
)
from sandbank.files import PresignedPost
from sandbank.interpreter.events import Event, StreamSlots, follow
from sandbank.interpreter.files import SessionFiles
from sandbank.interpreter.runs import Runs, SandboxState, owner_of
from sandbank.store import ChatSession, FileRecord, Message, Store, User

log = logging.getLogger(__name__)

# A session as the API shows it: the chat, and the state of its sandbox (None: not known here).
Seen = tuple[ChatSession, SandboxState | None]


class InterpreterService:
    """The interpreter API's operations for one user, with their limits."""

    def __init__(self, store: Store, files: SessionFiles, runs: Runs, settings: Settings) -> None:
        self.store = store
        self.files = files
        self.runs = runs
        self.settings = settings
        self.streams = StreamSlots(settings.max_event_streams, settings.max_event_streams_per_user)

    async def _owned(self, user: User, session_id: str) -> ChatSession:
        session = await self.store.chats.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id}")
        if session.user_id != user.id:
            raise Forbidden("this session belongs to another user")
        return session

    # --- credentials: what the egress proxy adds to the requests of the user's sandboxes ------
    async def store_credential(self, user: User, body: Any) -> CredentialInfo:
        try:
            credential = parse_credential(body, "user")
        except CredentialError as e:
            raise BadRequest(str(e)) from None
        return await self.runs.sandboxes.store_credential(owner_of(user.id), credential)

    async def list_credentials(self, user: User) -> list[CredentialInfo]:
        return await self.runs.sandboxes.list_stored_credentials(owner_of(user.id))

    async def delete_credential(self, user: User, credential_id: str) -> None:
        await self.runs.sandboxes.delete_stored_credential(owner_of(user.id), credential_id)

    # --- sessions ------------------------------------------------------------------------------
    async def create_session(self, user: User) -> ChatSession:
        limit = self.settings.max_sessions_per_user
        # Counted and created in one transaction: concurrent creations never pass the limit.
        chat = await self.store.chats.create_within(
            user.id, self.settings.session_ttl_seconds, limit
        )
        if chat is None:
            raise QuotaExceeded(f"you have {limit} sessions, the most allowed: delete some first")
        return chat

    async def list_sessions(self, user: User) -> list[Seen]:
        chats = await self.store.chats.of_user(user.id)
        states = await self.runs.sandbox_states(user.id, [c.id for c in chats])
        return [(c, states.get(c.id)) for c in chats]

    async def get_session(self, user: User, session_id: str) -> Seen:
        return await self._seen(user, await self._owned(user, session_id))

    async def session_with_messages(
        self, user: User, session_id: str, after: float
    ) -> tuple[Seen, list[Message]]:
        """The session, then its non-internal messages after `after` (read in that order, so a
        session seen DONE comes with every message of its run)."""
        seen = await self.get_session(user, session_id)
        messages = await self.store.chats.messages(session_id, after)
        return seen, [m for m in messages if not m.internal]

    async def _seen(self, user: User, chat: ChatSession) -> Seen:
        """The chat with the state of its sandbox (read without resuming or making one)."""
        return chat, (await self.runs.sandbox_states(user.id, [chat.id])).get(chat.id)

    async def delete_session(self, user: User, session_id: str) -> None:
        await self._owned(user, session_id)
        await self.remove(session_id)

    async def remove(self, session_id: str) -> None:
        """Stop its run and sandbox, then delete its messages, records and objects."""
        await self.runs.stop(session_id, None)
        await self.store.chats.delete(session_id)
        await self.files.forget(session_id)

    async def rename(self, user: User, session_id: str, title: str | None) -> Seen:
        await self._owned(user, session_id)
        await self.store.chats.rename(session_id, title)
        return await self.get_session(user, session_id)

    async def cancel(self, user: User, session_id: str) -> Seen:
        await self._owned(user, session_id)
        await self.runs.cancel(session_id)
        return await self.get_session(user, session_id)

    async def expire_forever(self) -> None:
        """The periodic task deleting expired sessions with everything they own."""
        while True:
            await asyncio.sleep(self.settings.session_expiry_interval_seconds)
            try:
                for session_id in await self.store.chats.expired(time.time()):
                    log.info("session %s expired: deleting it", session_id)
                    await self.remove(session_id)
            except SandbankError as e:
                log.error("expiring sessions failed: %s", e.message)

    # --- messages ------------------------------------------------------------------------------
    async def post_message(self, user: User, session_id: str, content: str) -> Message:
        return await self.runs.begin(await self._owned(user, session_id), content)

    async def ask_again(self, user: User, session_id: str) -> Message:
        """Run the session's latest question again, in place: no message is added."""
        return await self.runs.begin(await self._owned(user, session_id), None)

    async def messages(self, user: User, session_id: str, after: float | None) -> list[Message]:
        await self._owned(user, session_id)
        return await self.store.chats.messages(session_id, after)

    async def events(
        self, user: User, session_id: str, after: float | None
    ) -> tuple[AsyncIterator[Event], Callable[[], None]]:
        """The session's event stream (see `events.follow`), once the caller may read it and
        has a stream slot left; and the slot's release, for when the stream ends."""
        await self._owned(user, session_id)
        release = self.streams.take(user.id)
        max_s = self.settings.event_stream_max_seconds
        events = follow(self.store, self.runs.events, session_id, after, max_s)
        return _released_at_end(events, release), release

    # --- files ---------------------------------------------------------------------------------
    async def upload_form(self, user: User, session_id: str, filename: str) -> PresignedPost:
        await self._owned(user, session_id)
        return await self.files.upload_form(user.id, session_id, filename)

    async def download_url(self, user: User, session_id: str, filename: str) -> str:
        await self._owned(user, session_id)
        return await self.files.download_url(session_id, filename)

    async def delete_file(self, user: User, session_id: str, filename: str) -> None:
        session = await self._owned(user, session_id)
        if session.status == "PENDING":
            raise RunInProgress(
                "a run is in progress in this session: delete the file once it has ended "
                "(or cancel it)"
            )
        await self.files.delete(session_id, filename)

    async def list_files(self, user: User, session_id: str) -> list[FileRecord]:
        await self._owned(user, session_id)
        return await self.files.list(session_id)

    async def shutdown(self) -> None:
        with contextlib.suppress(SandbankError):
            await self.runs.shutdown()
        self.runs.events.close()  # after: streams show how the runs that finished here ended


async def _released_at_end(
    events: AsyncIterator[Event], release: Callable[[], None]
) -> AsyncIterator[Event]:
    try:
        async for event in events:
            yield event
    finally:
        release()
