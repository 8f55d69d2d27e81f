"""Picks the sandbox backend that `SANDBANK_ISOLATION` names."""

from __future__ import annotations

from ..config import Settings
from .backend import Backend


def backend_for(settings: Settings) -> Backend:
    if settings.isolation == "none":
        from .unisolated import UnisolatedBackend

        return UnisolatedBackend(settings)
    if settings.isolation == "fork":
        from .forked import ForkBackend

        return ForkBackend(settings)
    from .bwrap import BwrapBackend

    return BwrapBackend(settings)
