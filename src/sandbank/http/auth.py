"""Bearer credentials: reading `Authorization`, and the code-execution API's tokens as tenants."""

from __future__ import annotations

import hashlib
import hmac

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
    """The configured bearer tokens; each maps to a tenant id."""

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = [t.encode() for t in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def tenant(self, authorization: str | None) -> str:
        """The caller's tenant id; '' when no tokens are configured."""
        if not self._tokens:
            return ""
        token = bearer(authorization)
        if token is None:
            raise Unauthorized("a bearer token is required: Authorization: Bearer <token>")
        given = token.encode()
        match = None
        for known in self._tokens:  # compare with every token, so timing tells nothing
            if hmac.compare_digest(given, known):
                match = known
        if match is None:
            raise Unauthorized("the bearer token was not accepted")
        return hashlib.sha256(match).hexdigest()[:24]
