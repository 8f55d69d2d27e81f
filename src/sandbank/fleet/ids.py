"""Fleet session ids: the holding node's name and its own id, signed so clients cannot steer them.

A front hands out `<node>.<local id>.<mac>`; the MAC (HMAC-SHA256, keyed from the fleet token)
covers the caller's tenant too, so an altered, forged or another tenant's id verifies as unknown
and routing needs no shared lookup.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

from ..errors import SessionNotFound

MAC_BYTES = 16
# Node names are DNS labels (StatefulSet pod names); node-local ids are URL-safe base64.
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
LOCAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SessionIds:
    """Makes and checks the fleet's signed session ids (node name, node's id, HMAC)."""

    def __init__(self, fleet_token: str) -> None:
        # A key of its own, so the token itself is never used for two purposes.
        key = hmac.new(fleet_token.encode(), b"sandbank fleet session ids", "sha256").digest()
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)  # copied per id: no key setup

    def _mac(self, tenant: str, node: str, local: str) -> str:
        mac = self._keyed.copy()
        mac.update(f"{tenant}\0{node}\0{local}".encode())
        return _b64(mac.digest()[:MAC_BYTES])

    def sign(self, tenant: str, node: str, local: str) -> str:
        if not NODE_NAME.match(node) or not LOCAL_ID.match(local):
            raise ValueError(f"unexpected node name or session id from node {node!r}")
        return f"{node}.{local}.{self._mac(tenant, node, local)}"

    def verify(self, tenant: str, public: str) -> tuple[str, str]:
        """(node name, node-local id); `SessionNotFound` for anything not signed by the fleet."""
        node, _, rest = public.partition(".")
        local, _, mac = rest.partition(".")
        if (
            not NODE_NAME.match(node)
            or not LOCAL_ID.match(local)
            or not hmac.compare_digest(mac.encode(), self._mac(tenant, node, local).encode())
        ):
            raise SessionNotFound(f"no session {public!r}")
        return node, local
