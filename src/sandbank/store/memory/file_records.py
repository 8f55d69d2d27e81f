"""File records and pending upload forms in memory."""

from __future__ import annotations

import time

from sandbank.store.memory.state import MemoryState, Reservation
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
        return self._stored(user_id)

    def _stored(self, user_id: str, replaced: tuple[str, str] | None = None) -> int:
        """The size of the user's recorded files, less the file at `replaced` (chat, name)."""
        chats = self.state.chats
        return sum(
            f.size
            for key, f in self.state.files.items()
            if chats[f.session_id].user_id == user_id and key != replaced
        )

    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None:
        self.state.chat(session_id)
        self.state.uploads.setdefault(session_id, {})[filename] = expires_at

    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        return dict(self.state.uploads.get(session_id, {}))

    async def drop_upload(self, session_id: str, filename: str) -> None:
        self.state.uploads.get(session_id, {}).pop(filename, None)

    async def reserve(
        self,
        reservation_id: str,
        session_id: str,
        filename: str,
        size: int,
        quota: int,
        expires_at: float,
    ) -> bool:
        user_id = self.state.chat(session_id).user_id
        now = time.time()
        state = self.state
        state.reservations = {
            k: r
            for k, r in state.reservations.items()
            if not (r.user_id == user_id and r.expires_at < now)
        }
        stored = self._stored(user_id, replaced=(session_id, filename))
        reserved = sum(
            r.size
            for k, r in state.reservations.items()
            if r.user_id == user_id and k != reservation_id
        )
        if stored + reserved + size > quota:
            return False  # the reservation of this id, if any, stays as it was
        state.reservations[reservation_id] = Reservation(
            user_id, session_id, filename, size, expires_at
        )
        return True

    async def release(self, reservation_id: str) -> None:
        self.state.reservations.pop(reservation_id, None)

    async def commit(
        self, reservation_id: str, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord:
        record = await self.upsert(session_id, filename, size, origin)
        self.state.reservations.pop(reservation_id, None)
        return record
