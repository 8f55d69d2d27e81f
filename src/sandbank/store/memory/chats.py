"""Chats and their messages in memory."""

from __future__ import annotations

import dataclasses

from sandbank.errors import NotFound
from sandbank.store.memory.state import MemoryState
from sandbank.store.records import TITLE_MAX, ChatSession, Message, new_chat


class MemoryChats:
    """The `Chats` of a `MemoryState`."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    async def create_within(
        self, user_id: str, ttl_seconds: float, limit: int
    ) -> ChatSession | None:
        # No await between counting and creating: one step of the event loop.
        if user_id in self.state.users and await self.count(user_id) >= limit:
            return None
        return await self.create(user_id, ttl_seconds)

    async def create(self, user_id: str, ttl_seconds: float) -> ChatSession:
        if user_id not in self.state.users:
            raise NotFound(f"no user with id {user_id!r}")
        chat = new_chat(user_id, ttl_seconds)
        self.state.chats[chat.id] = chat
        self.state.messages[chat.id] = []
        return chat

    async def get(self, session_id: str) -> ChatSession | None:
        chat = self.state.chats.get(session_id)
        return None if chat is None else self._titled(chat)

    async def of_user(self, user_id: str) -> list[ChatSession]:
        mine = [self._titled(c) for c in self.state.chats.values() if c.user_id == user_id]
        return sorted(mine, key=lambda c: c.created_at, reverse=True)

    async def rename(self, session_id: str, title: str | None) -> None:
        chat = self.state.chat(session_id)
        self.state.chats[session_id] = dataclasses.replace(chat, title=title)

    def _titled(self, chat: ChatSession) -> ChatSession:
        if chat.title is not None:
            return chat
        asked = (m for m in self.state.messages.get(chat.id, []) if m.role == "user")
        first = next(asked, None)
        return chat if first is None else dataclasses.replace(chat, title=first.content[:TITLE_MAX])

    async def count(self, user_id: str) -> int:
        return sum(1 for c in self.state.chats.values() if c.user_id == user_id)

    async def delete(self, session_id: str) -> bool:
        if session_id not in self.state.chats:
            return False
        self.state.drop_chat(session_id)
        return True

    async def expired(self, now: float) -> list[str]:
        return [c.id for c in self.state.chats.values() if c.ttl <= now]

    async def messages(self, session_id: str, after: float | None = None) -> list[Message]:
        log = self.state.messages.get(session_id, [])
        return [m for m in log if after is None or m.timestamp > after]

    async def note_sandbox(self, session_id: str, replica: str, sandbox_id: str) -> None:
        if session_id in self.state.chats:
            self.state.sandboxes[session_id] = (replica, sandbox_id)

    async def sandbox(self, session_id: str) -> tuple[str | None, str | None]:
        return self.state.sandboxes.get(session_id, (None, None))

    async def sandboxes_of(self, user_id: str) -> dict[str, tuple[str, str]]:
        mine = {c.id for c in self.state.chats.values() if c.user_id == user_id}
        return {sid: where for sid, where in self.state.sandboxes.items() if sid in mine}
