"""E2B sandbox ids and the per-sandbox access tokens.

The SDKs name a sandbox alone on most in-sandbox requests (envd and the code interpreter carry
no API key), so the id says whose session it is: `<tenant>.<session id>` (the session id alone
without tokens). The port then checks that the session is that tenant's (another tenant's is
unknown), and the session id (144 random bits, or a fleet's signed id) cannot be guessed.
The access token is an HMAC of the id, so any front of a fleet checks it without state.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time

from ..errors import SessionNotFound

TENANT = re.compile(r"^[0-9a-f]{24}$")
SESSION = re.compile(r"^[A-Za-z0-9_.-]{1,300}$")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SandboxIds:
    """Public ids and access tokens; `tenants`: whether API keys are tenants (tokens set)."""

    def __init__(self, tenants: bool, secret: str = "") -> None:
        self.tenants = tenants
        # A fleet's fronts share the fleet token, so a token made by one is checked by another;
        # a single server's sessions die with it, and so may its key.
        seed = secret.encode() if secret else secrets.token_bytes(32)
        self._key = hmac.new(seed, b"sandbank e2b access tokens", "sha256").digest()

    def public(self, tenant: str, session_id: str) -> str:
        return f"{tenant}.{session_id}" if self.tenants else session_id

    def parse(self, public: str) -> tuple[str, str]:
        """(tenant, session id) of a public id; `SessionNotFound` for a malformed one."""
        if self.tenants:
            tenant, _, session = public.partition(".")
            if not TENANT.match(tenant) or not SESSION.match(session):
                raise SessionNotFound(f"sandbox {public!r} not found")
            return tenant, session
        if not SESSION.match(public):
            raise SessionNotFound(f"sandbox {public!r} not found")
        return "", public

    def token(self, public: str) -> str:
        """The sandbox's access token (envd's X-Access-Token)."""
        mac = hmac.new(self._key, f"access\0{public}".encode(), "sha256").digest()
        return "ea_" + _b64(mac[:24])

    def token_ok(self, public: str, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(
            given.encode(), self.token(public).encode()
        )

    def signature_ok(
        self, public: str, path: str, op: str, user: str, signature: str, expiration: str | None
    ) -> bool:
        """A presigned /files URL's signature (the SDKs' download_url and upload_url)."""
        raw = f"{path}:{op}:{user}:{self.token(public)}"
        if expiration is not None:
            if not expiration.isdigit() or int(expiration) < time.time():
                return False
            raw += f":{expiration}"
        digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
        return hmac.compare_digest(f"v1_{digest}".encode(), signature.encode())
