"""Tiers of the suite, from what a test uses.

A test is in a slow tier because a fixture it uses needs one: `root` (real sandboxes or a real
`sandbank serve`: root, cgroups, loop devices), `postgres` (Debian's PostgreSQL), `s3` (moto's
server), `chromium` (a real browser). Fixtures say so with `@needs(...)` under `@pytest.fixture`;
a parameter says so with `param(value, tier)`. Everything else is the fast tier
(`make test-fast`), and a guard fails a fast test that starts a server or a real backend anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

TIERS = ("root", "postgres", "s3", "chromium")
ATTRIBUTE = "__sandbank_tiers__"
F = TypeVar("F", bound=Callable[..., Any])


def needs(*tiers: str) -> Callable[[F], F]:
    """Declare the tiers a fixture needs (put it under `@pytest.fixture`)."""
    unknown = set(tiers) - set(TIERS)
    assert not unknown, f"unknown tiers {unknown}"

    def mark(fn: F) -> F:
        setattr(fn, ATTRIBUTE, frozenset(tiers))
        return fn

    return mark


def param(value: object, *tiers: str, id: str | None = None) -> Any:
    """A fixture or test parameter that needs these tiers (a real backend, PostgreSQL...)."""
    return pytest.param(value, marks=[getattr(pytest.mark, t) for t in tiers], id=id)


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers a collected test needs: its fixtures' (all of them, transitively) and its
    parameters'."""
    found = {m.name for m in item.iter_markers() if m.name in TIERS}
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return found
    for name in getattr(item, "fixturenames", ()):
        for definition in info.name2fixturedefs.get(name, ()):
            found |= getattr(definition.func, ATTRIBUTE, frozenset())
    return found
