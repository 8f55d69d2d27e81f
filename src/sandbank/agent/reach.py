"""Whether the model can be reached: checked at start, on a failure and when asked (at most
every few seconds), by opening a connection to its endpoint (no request, so nothing is spent).

The page shows what this says within a second or two, and a question posted while the model
cannot be reached is refused at once, in words naming what the operator must set.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from sandbank.config import Settings

CONNECT_TIMEOUT_S = 1.5
FRESH_S = 5.0  # a verdict this recent is not checked again
OLLAMA_DEFAULT_URL = "http://127.0.0.1:11434/v1"

State = Literal["ok", "unreachable", "unknown", "off"]
OFF = (
    "The assistant is off: no model is configured. The operator must set SANDBANK_LLM_MODEL "
    "(e.g. openai:gpt-4.1-mini) and its key (SANDBANK_LLM_API_KEY), or SANDBANK_LLM_BASE_URL "
    "for a local model server, then restart Sandbank."
)
UNREACHABLE = (
    "The assistant's model cannot be reached, so questions cannot be answered now. The "
    "operator must check that the model's server is running and reachable from Sandbank, and "
    "that SANDBANK_LLM_BASE_URL points at it."
)


@dataclass(frozen=True)
class Verdict:
    state: State
    message: str | None = None  # for people: what is wrong and what the operator must set

    def public(self) -> dict[str, object]:
        return {"state": self.state, "available": self.state in ("ok", "unknown"),
                "message": self.message}  # fmt: skip


def endpoint(settings: Settings) -> tuple[str, int] | None:
    """(host, port) of the model's endpoint, when it is known."""
    url = settings.llm_base_url.strip()
    provider = settings.llm_model.strip().partition(":")[0]
    if not url and provider == "ollama":
        url = OLLAMA_DEFAULT_URL
    if not url and provider:
        with contextlib.suppress(Exception):  # an unknown provider: stopped at start anyway
            from any_llm import AnyLLM

            url = AnyLLM.get_provider_class(provider).API_BASE or ""
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname, port


class ModelReach:
    """The latest verdict on the model's endpoint, and how to refresh it."""

    def __init__(self, settings: Settings, configured: bool) -> None:
        self.target = endpoint(settings) if configured else None
        self.verdict = Verdict("unknown") if configured else Verdict("off", OFF)
        self.checked = 0.0  # monotonic time of the last check; 0: never
        self._checking: asyncio.Task[Verdict] | None = None

    async def check(self) -> Verdict:
        """Connect to the endpoint now (one check at a time; callers share it)."""
        if self.verdict.state == "off" or self.target is None:
            return self.verdict
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._connect(self.target))
        self.verdict = await asyncio.shield(self._checking)
        self.checked = time.monotonic()
        return self.verdict

    async def current(self) -> Verdict:
        """The verdict, checked again when it is older than a few seconds."""
        if self.checked and time.monotonic() - self.checked < FRESH_S:
            return self.verdict
        return await self.check()

    def failed(self) -> None:
        """A request to the model could not connect: unreachable until a check says otherwise."""
        if self.verdict.state != "off":
            self.verdict = Verdict("unreachable", UNREACHABLE)
            self.checked = time.monotonic()

    @staticmethod
    async def _connect(target: tuple[str, int]) -> Verdict:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(*target), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            return Verdict("unreachable", UNREACHABLE)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return Verdict("ok")
