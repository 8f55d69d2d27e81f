"""What keeps one session's traffic from saturating the host: counters, caps, a shared rate."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class EgressLimits:
    connections_per_session: int  # open at once
    bytes_per_session: int  # both directions, over the session's life
    rate_bytes: int  # per second, every session together; 0: no limit
    idle_seconds: float = 300.0  # a connection with no traffic either way is closed


@dataclass
class EgressStats:
    """One sandbox's traffic since it started (counted by the proxy, never by the sandbox)."""

    allowed: int = 0  # connections made
    refused: int = 0  # refused by the policy or a limit, before any connection
    failed: int = 0  # allowed, but the name did not resolve or the upstream did not answer
    bytes_out: int = 0  # sandbox to upstream
    bytes_in: int = 0  # upstream to sandbox
    open: int = 0
    intercepted: int = 0  # connections whose TLS the proxy ended (a credential's destination)
    injected: int = 0  # requests that went out with a credential added

    @property
    def bytes(self) -> int:
        return self.bytes_out + self.bytes_in


class RateLimiter:
    """A token bucket shared by every connection: at most `rate` bytes a second, bursts of one."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        async with self._lock:  # FIFO: a large reader cannot starve the others
            now = time.monotonic()
            self._tokens = min(float(self.rate), self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.rate)
