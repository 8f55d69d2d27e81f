"""Bearer credentials: reading `Authorization`, and the code-execution API's tokens as tenants."""

from __future__ import annotations

import hashlib

from ..config import Settings
from ..errors import Unauthorized


def bearer(authorization: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <credential>` header, None without one."""
    scheme, _, credential = (authorization or "").partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None
    return credential


def load_tokens(settings: Settings) -> list[str]:
    tokens = [t.strip() for t in settings.exec_tokens.get_secret_value().split(",")]
    if settings.exec_tokens_file is not None:
        tokens += [t.strip() for t in settings.exec_tokens_file.read_text().splitlines()]
    return [t for t in tokens if t and not t.startswith("#")]


class TokenAuth:
    """The configured bearer tokens; each maps to a tenant id.

    A token is found by its SHA-256 digest, one lookup whatever the number of tokens (comparing
    with every token cost ~60 us a request at 1,000 tokens, ~0.6 ms at 10,000). Its timing
    tells a client nothing: it depends on the digest of what the client sent, never on a
    token's bytes, and a digest does not give its token back.
    """

    def __init__(self, tokens: list[str]) -> None:
        self._tenants = {digest: _tenant(digest) for digest in map(_digest, tokens)}

    @property
    def enabled(self) -> bool:
        return bool(self._tenants)

    def tenant(self, authorization: str | None) -> str:
        """The caller's tenant id; '' when no tokens are configured."""
        if not self._tenants:
            return ""
        token = bearer(authorization)
        if token is None:
            raise Unauthorized("a bearer token is required: Authorization: Bearer <token>")
        tenant = self._tenants.get(_digest(token))
        if tenant is None:
            raise Unauthorized("the bearer token was not accepted")
        return tenant


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _tenant(digest: bytes) -> str:
    """A token's tenant id: its digest's first 96 bits, in hex (as it always was)."""
    return digest.hex()[:24]
