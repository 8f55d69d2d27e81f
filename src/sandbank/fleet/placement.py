"""Where a new session goes: sample a few accepting nodes, take the least loaded."""

from __future__ import annotations

import random

from .membership import Member


def load(member: Member) -> tuple[bool, float, int]:
    report = member.report
    assert report is not None
    full = member.used() >= report.max_sessions  # only idle sessions to reclaim there
    return (full, member.used() / report.max_sessions, -report.memory_available_bytes)


def choose(
    members: list[Member], sample: int, rng: random.Random, exclude: set[str]
) -> Member | None:
    """Power of `sample` choices among accepting nodes; None when no node accepts."""
    eligible = [m for m in members if m.name not in exclude and m.accepting()]
    if not eligible:
        return None
    picked = rng.sample(eligible, min(sample, len(eligible)))
    return min(picked, key=load)
