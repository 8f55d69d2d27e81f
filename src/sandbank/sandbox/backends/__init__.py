"""The backends, siblings, and the chooser that picks one by `SANDBANK_ISOLATION`."""

from __future__ import annotations

from ...config import Settings
from .base import Backend


def backend_for(settings: Settings) -> Backend:
    if settings.isolation == "none":
        from .unisolated import UnisolatedBackend

        return UnisolatedBackend(settings)
    if settings.isolation == "fork":
        from .fork import ForkBackend

        return ForkBackend(settings)
    from .bwrap import BwrapBackend

    return BwrapBackend(settings)
