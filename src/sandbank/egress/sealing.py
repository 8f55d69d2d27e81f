"""Credentials sealed at rest: AES-256-GCM under the operator's key, bound to what they are.

A stored credential keeps its destination, kind and names in the clear (they are listed) and its
values sealed. The sealed text names the key that sealed it (`v1.<key id>.<nonce+ciphertext>`),
and its associated data is the credential's owner, id, destination, kind and names: a sealed
value moved to another owner's record, or under another destination, does not open.
`SANDBANK_CREDENTIALS_KEY` holds one or more keys (base64 of 32 bytes, comma-separated): the
first seals, every one opens, so a key is replaced by putting the new one first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .credentials import Credential, CredentialError, Destination, Kind, Scope, Secret

VERSION = "v1"
NONCE_BYTES = 12
KEY_BYTES = 32


class SealError(ValueError):
    """A sealed value that does not open: another key, or a record that was altered."""


def parse_keys(text: str) -> list[bytes]:
    """The keys of the setting; ValueError saying what is wrong (never echoing a key)."""
    keys = []
    for n, item in enumerate((x.strip() for x in text.split(",") if x.strip()), start=1):
        try:
            key = base64.b64decode(item + "=" * (-len(item) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise ValueError(
                f"key #{n} is not base64 of {KEY_BYTES} bytes (make one with "
                "`openssl rand -base64 32`)"
            )
        keys.append(key)
    return keys


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"sandbank-credentials-key\0" + key).hexdigest()[:8]


class Sealer:
    """Seals with the first key, opens with any."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a sealer needs a key")
        self._keys = {key_id(k): AESGCM(k) for k in keys}
        self._sealing = key_id(keys[0])

    @classmethod
    def from_setting(cls, text: str) -> Sealer | None:
        keys = parse_keys(text)
        return cls(keys) if keys else None

    def seal(self, plaintext: bytes, context: bytes) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._keys[self._sealing].encrypt(nonce, plaintext, context)
        text = base64.urlsafe_b64encode(nonce + sealed).decode("ascii")
        return f"{VERSION}.{self._sealing}.{text}"

    def open(self, sealed: str, context: bytes) -> bytes:
        version, _, rest = sealed.partition(".")
        kid, _, text = rest.partition(".")
        if version != VERSION:
            raise SealError("not sealed by this version of Sandbank")
        aead = self._keys.get(kid)
        if aead is None:
            raise SealError(f"sealed with a key not configured (key id {kid[:8]})")
        try:
            data = base64.urlsafe_b64decode(text.encode("ascii"))
            return aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], context)
        except (InvalidTag, binascii.Error, ValueError):
            raise SealError("does not open: altered, or sealed for another record") from None


@dataclass(frozen=True)
class SealedCredential:
    """A credential as it is stored: its listing in the clear, its values sealed."""

    id: str
    owner: str  # the tenant or user it belongs to
    destination: str
    kind: Kind
    names: tuple[str, ...]
    created_at: float
    sealed: str


def _context(
    owner: str, credential_id: str, destination: str, kind: str, names: Sequence[str]
) -> bytes:
    parts = ["sandbank-credential", VERSION, owner, credential_id, destination, kind, *names]
    return "\0".join(parts).encode()


def seal(sealer: Sealer, owner: str, credential: Credential) -> SealedCredential:
    destination = str(credential.destination)
    context = _context(owner, credential.id, destination, credential.kind, credential.names)
    return SealedCredential(
        id=credential.id,
        owner=owner,
        destination=destination,
        kind=credential.kind,
        names=credential.names,
        created_at=credential.created_at,
        sealed=sealer.seal(credential.secret.to_bytes(), context),
    )


def unseal(sealer: Sealer, record: SealedCredential, scope: Scope) -> Credential:
    """The credential of a stored record; `SealError` when it does not open."""
    context = _context(record.owner, record.id, record.destination, record.kind, record.names)
    secret = Secret.from_bytes(sealer.open(record.sealed, context))
    try:
        destination = Destination.parse(record.destination)
    except CredentialError as e:
        raise SealError(str(e)) from None
    return Credential(
        id=record.id,
        destination=destination,
        kind=record.kind,
        names=record.names,
        secret=secret,
        scope=scope,
        created_at=record.created_at,
    )
