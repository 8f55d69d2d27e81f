"""File records and pending upload forms in memory."""

from __future__ import annotations

import time

from sandbank.store.memory.state import MemoryState
from sandbank.store.records import FileRecord, Origin


class MemoryFileRecords:
    """The `FileRecords` of a `MemoryState`."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    async def upsert(self, session_id: str, filename: str, size: int, origin: Origin) -> FileRecord:
        self.state.chat(session_id)
        record = FileRecord(session_id, filename, size, origin, time.time())
        self.state.files[(session_id, filename)] = record
        return record

    async def get(self, session_id: str, filename: str) -> FileRecord | None:
        return self.state.files.get((session_id, filename))

    async def delete(self, session_id: str, filename: str) -> bool:
        self.state.chat(session_id)
        self.state.uploads.get(session_id, {}).pop(filename, None)
        return self.state.files.pop((session_id, filename), None) is not None

    async def of_session(self, session_id: str) -> list[FileRecord]:
        mine = (f for f in self.state.files.values() if f.session_id == session_id)
        return sorted(mine, key=lambda f: f.filename)

    async def stored_bytes(self, user_id: str) -> int:
        chats = self.state.chats
        return sum(
            f.size for f in self.state.files.values() if chats[f.session_id].user_id == user_id
        )

    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None:
        self.state.chat(session_id)
        self.state.uploads.setdefault(session_id, {})[filename] = expires_at

    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        return dict(self.state.uploads.get(session_id, {}))

    async def drop_upload(self, session_id: str, filename: str) -> None:
        self.state.uploads.get(session_id, {}).pop(filename, None)
