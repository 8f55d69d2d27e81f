"""The run queue in memory."""

from __future__ import annotations

import dataclasses
import time
from typing import Unpack

from sandbank.store.memory.state import MemoryState
from sandbank.store.records import (
    ACTIVE_RUN_STATES,
    CANCELLED,
    CancelOutcome,
    Message,
    ReleaseOutcome,
    Role,
    Run,
    RunState,
    SessionStatus,
    StartRefusal,
    StartTerms,
    posted_run,
    start_refusal,
    unattended,
)


class MemoryRunQueue:
    """The `RunQueue` of a `MemoryState`."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    async def start(
        self, session_id: str, content: str | None, **terms: Unpack[StartTerms]
    ) -> tuple[Message, Run] | StartRefusal:
        chat = self.state.chat(session_id)
        refusal = start_refusal(chat.status, chat.user_id, self.state.count_pending, terms)
        if refusal is not None:
            return refusal
        if content is None:
            asked = [m for m in self.state.messages.get(session_id, []) if m.role == "user"]
            if not asked:
                return "no_question"
            question = asked[-1]
        else:
            question = self.state.append(session_id, "user", content, False)
        self.state.set_status(session_id, "PENDING", "starting")
        replica = self.state.sandboxes.get(session_id, (None, None))[0]
        run = posted_run(question, chat.user_id, terms, sandbox_replica=replica)
        self.state.runs[run.id] = run
        return question, run

    async def claim(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        now = time.time()

        def claimable(r: Run) -> bool:
            if r.state == "running":
                return (r.lease_until or 0) < now
            mine_to_take = r.preferred in (None, owner) or r.created_at <= now - affinity_seconds
            return r.state == "queued" and mine_to_take

        waiting = sorted(filter(claimable, self.state.runs.values()), key=lambda r: r.created_at)
        claimed = []
        for run in waiting[: max(limit, 0)]:
            lease = now + lease_seconds
            run = dataclasses.replace(
                run, state="running", owner=owner, lease_until=lease, attempts=run.attempts + 1
            )
            self.state.runs[run.id] = run
            claimed.append(run)
        return claimed

    async def renew(self, owner: str, run_ids: list[str], lease_seconds: float) -> dict[str, bool]:
        renewed = {}
        for run_id in run_ids:
            current = self.state.runs.get(run_id)
            if current is not None and current.owner == owner and current.state == "running":
                lease = time.time() + lease_seconds
                self.state.runs[run_id] = dataclasses.replace(current, lease_until=lease)
                renewed[run_id] = current.cancel_requested
        return renewed

    async def add_message(self, run: Run, role: Role, content: str, internal: bool) -> Message:
        self.state.chat(run.session_id)
        self.state.hold(run)
        return self.state.append(run.session_id, role, content, internal)

    async def set_progress(self, run: Run, message: str) -> None:
        self.state.hold(run)
        self.state.set_status(run.session_id, "PENDING", message)

    async def finish(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        current = self.state.held(run)
        if current is None:
            return False
        ended = dataclasses.replace(current, state=state, lease_until=None, message=message)
        self.state.runs[run.id] = ended
        self.state.set_status(run.session_id, status, message)
        return True

    async def release(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        current = self.state.held(run)
        if current is None:
            return "lost"
        if any(
            m.timestamp > run.question_at and m.role == "assistant" and not m.internal
            for m in self.state.messages[run.session_id]
        ):
            self.state.runs[run.id] = dataclasses.replace(current, state="done", lease_until=None)
            self.state.set_status(run.session_id, "DONE", None)
            return "answered"
        self.state.runs[run.id] = dataclasses.replace(
            current, state="queued", owner=None, lease_until=None
        )
        self.state.set_status(run.session_id, "PENDING", status_message)
        return "released"

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        self.state.chat(session_id)
        run = self.state.active_run(session_id)
        if run is None:
            return "none"
        if unattended(run, time.time()):
            self.state.runs[run.id] = dataclasses.replace(
                run, state="cancelled", cancel_requested=True, lease_until=None, message=CANCELLED
            )
            self.state.set_status(session_id, "ERROR", CANCELLED)
            return "ended"
        self.state.runs[run.id] = dataclasses.replace(run, cancel_requested=True)
        return "requested"

    async def expire_leases(self) -> int:
        running = [r for r in self.state.runs.values() if r.state == "running"]
        for run in running:
            self.state.runs[run.id] = dataclasses.replace(run, lease_until=0.0)
        return len(running)

    async def fail_orphan_pending(self, message: str) -> list[str]:
        running = {r.session_id for r in self.state.runs.values() if r.state in ACTIVE_RUN_STATES}
        ids = [
            c.id for c in self.state.chats.values() if c.status == "PENDING" and c.id not in running
        ]
        for sid in ids:
            self.state.set_status(sid, "ERROR", message)
        return ids
