"""Who is calling: an API key (`Authorization: Bearer`), or a trusted proxy's user header."""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.requests import Request

from sandbank.config import Settings
from sandbank.errors import Forbidden, SandbankError
from sandbank.http.proxies import is_trusted, parse_networks
from sandbank.store import Store, User, hash_secret

log = logging.getLogger("sandbank.identity")
# A key's last use is written at most this often: a busy key must not write on every request.
KEY_USE_EVERY_S = 60.0


class KeyUse:
    """Records when keys are used, off the request's path and at most once a period per key."""

    def __init__(self, store: Store, every: float = KEY_USE_EVERY_S) -> None:
        self.store = store
        self.every = every
        self._written: dict[str, float] = {}  # secret hash -> monotonic time of the last write
        self._writes: set[asyncio.Task[None]] = set()

    def note(self, secret: str) -> None:
        digest = hash_secret(secret)
        now = time.monotonic()
        last = self._written.get(digest)
        if last is not None and now - last < self.every:
            return
        self._written[digest] = now
        write = asyncio.create_task(self._write(secret, time.time()))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def _write(self, secret: str, at: float) -> None:
        try:
            await self.store.accounts.key_used(secret, at)
        except SandbankError as error:
            # Bookkeeping only: the request it came from has long been answered.
            log.warning("could not record an API key's use: %s", error.message)

    async def settle(self) -> None:
        """Wait for the writes under way (before the store closes)."""
        while self._writes:
            await asyncio.wait(set(self._writes))


class Identity:
    """Who is calling the interpreter API."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.header = settings.trusted_user_header.strip().lower()
        self.proxies = parse_networks(settings.trusted_proxies)
        self.key_use = KeyUse(store)

    async def user(self, request: Request) -> User:
        """The authenticated user; `Forbidden` (403, as the spec says) otherwise."""
        client = request.client.host if request.client else None
        if self.header and is_trusted(client, self.proxies):
            claimed = request.headers.get(self.header)
            if claimed:
                # Proxies usually know the user's name; the id is accepted too.
                accounts = self.store.accounts
                user = await accounts.get_user(claimed) or await accounts.get_user_by_id(claimed)
                if user is None:
                    raise Forbidden(f"the proxy's user {claimed!r} is not a user here")
                return user
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Forbidden("an API key is required: Authorization: Bearer <key>")
        user = await self.store.accounts.authenticate(secret.strip())
        if user is None:
            raise Forbidden("the API key was not accepted")
        self.key_use.note(secret.strip())
        return user
