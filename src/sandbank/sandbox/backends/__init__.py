"""The backends, siblings, and the chooser that makes the ones a server offers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import Settings
from .base import Backend

if TYPE_CHECKING:
    from ..host.machine import IsolatedHost


def backend_for(settings: Settings, isolation: str | None = None) -> Backend:
    """The backend of `isolation` (default: `SANDBANK_ISOLATION`)."""
    return backends_for(settings, [isolation or settings.isolation])[0]


def backends_for(settings: Settings, isolations: list[str] | None = None) -> list[Backend]:
    """One backend per isolation offered (default: `Settings.isolations()`, the default first),
    the isolated ones over one shared host."""
    host: IsolatedHost | None = None
    made: list[Backend] = []
    for isolation in isolations or settings.isolations():
        if isolation == "none":
            from .unisolated import UnisolatedBackend

            made.append(UnisolatedBackend(settings))
            continue
        if isolation == "fork":
            from .fork import ForkBackend as Isolated
        elif isolation == "gvisor":
            from .gvisor import GvisorBackend as Isolated  # type: ignore[assignment]
        else:
            from .bwrap import BwrapBackend as Isolated  # type: ignore[assignment]
        backend = Isolated(settings, host)
        host = backend.host
        made.append(backend)
    return made
