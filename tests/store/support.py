"""What the store's contract tests share: a chat of a user, a run of a chat."""

from __future__ import annotations

from sandbank.store import Run, Store

LEASE = 30.0


async def new_chat(store: Store, name: str = "alice", ttl: float = 3600) -> str:
    """A new chat of the user `name` (created when missing); its id."""
    user = await store.accounts.get_user(name) or await store.accounts.create_user(name)
    return (await store.chats.create(user.id, ttl)).id


async def started(
    store: Store, sid: str, owner: str | None = None, content: str = "why?", **limits: int
) -> Run:
    """The run of a question posted to the chat: held by `owner`, or queued."""
    outcome = await store.runs.start(
        sid,
        content,
        max_per_user=limits.get("max_per_user", 100),
        max_total=limits.get("max_total", 1000),
        owner=owner,
        lease_seconds=LEASE,
    )
    assert not isinstance(outcome, str), outcome
    return outcome[1]


async def held_run(store: Store, name: str = "alice", content: str = "why?") -> Run:
    """A run that replica `r1` holds, in a new chat: what writes its messages."""
    return await started(store, await new_chat(store, name), owner="r1", content=content)
