"""Where a new session goes: sample a few accepting nodes, take the least loaded; when none
accepts by its last report, ask the least loaded node that is up (the report is a moment old,
and a full node makes room by pausing an idle session: it answers 503 when it cannot)."""

from __future__ import annotations

import random

from .membership import Member


def load(member: Member) -> tuple[bool, float, int]:
    report = member.report
    assert report is not None
    full = member.used() >= report.max_sessions  # only idle sessions to reclaim there
    return (full, member.used() / report.max_sessions, -report.memory_available_bytes)


def choose(
    members: list[Member],
    sample: int,
    rng: random.Random,
    exclude: set[str],
    isolation: str | None = None,
) -> Member | None:
    """Power of `sample` choices among accepting nodes, else the least loaded node that may
    still take one, among those offering `isolation`; None when every such node is down,
    draining or excluded."""
    candidates = [m for m in members if m.name not in exclude and m.offers(isolation)]
    eligible = [m for m in candidates if m.accepting()]
    if not eligible:
        # Full by a report that predates this front's own placements (each counted busy), or
        # one health check late under load: the node itself decides.
        last_resort = [m for m in candidates if m.may_take()]
        return min(last_resort, key=lambda m: (m.missed, load(m)), default=None)
    picked = rng.sample(eligible, min(sample, len(eligible)))
    return min(picked, key=load)
