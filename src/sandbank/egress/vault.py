"""Tenants' stored credentials: sealed, in one file of the data directory, readable by root only.

The code-execution API's tenants keep their credentials here (`/credentials`); every session of
the tenant on this server gets them. The file (`<data>/egress/credentials.json`, mode 0600) holds
each credential's listing in the clear and its values sealed (`sealing.py`); it is rewritten
whole, atomically, on each change. Opened credentials stay in the server's memory, where the
proxy reads them on each request: a deleted one stops applying at the next request.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from ..errors import QuotaExceeded
from .credentials import MAX_PER_OWNER, Credential, CredentialError, best
from .sealing import SealedCredential, Sealer, SealError, seal, unseal

log = logging.getLogger(__name__)
FILE_NAME = "credentials.json"


class Vault:
    """Every tenant's credentials on this server."""

    def __init__(self, path: Path, sealer: Sealer) -> None:
        self.path = path
        self.sealer = sealer
        self._records: dict[str, SealedCredential] = {}  # by id
        # By owner, then id; an owner's dict is replaced whole on each change, never changed.
        self._open: dict[str, dict[str, Credential]] = {}
        self._lock = threading.Lock()  # writes come from threads (the file is rewritten)

    def load(self) -> None:
        """Read the file; a record that does not open is kept, skipped and named in the log.
        `CredentialError` when the file is not one of stored credentials."""
        try:
            raw = json.loads(self.path.read_text())
            records = [
                SealedCredential(
                    id=str(item["id"]),
                    owner=str(item["owner"]),
                    destination=str(item["destination"]),
                    kind=item["kind"],
                    names=tuple(str(n) for n in item["names"]),
                    created_at=float(item["created_at"]),
                    sealed=str(item["sealed"]),
                )
                for item in raw["credentials"]
            ]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CredentialError(
                f"{self.path} is not a file of stored credentials ({type(e).__name__}): move it "
                "away to start with none"
            ) from None
        for record in records:
            self._records[record.id] = record
            try:
                opened = unseal(self.sealer, record, "tenant")
            except SealError as e:
                log.warning("stored credential %s is not used: %s", record.id, e)
                continue
            self._open.setdefault(record.owner, {})[record.id] = opened

    def add(self, owner: str, credential: Credential) -> Credential:
        with self._lock:
            mine = self._open.get(owner, {})
            if len(mine) >= MAX_PER_OWNER:
                raise QuotaExceeded(
                    f"this client has {MAX_PER_OWNER} stored credentials, the most allowed: "
                    "delete one first"
                )
            record = seal(self.sealer, owner, credential)
            self._records[record.id] = record
            try:
                self._write()
            except BaseException:
                del self._records[record.id]
                raise
            # A new dict, never one changed in place: the proxy reads these on the event loop
            # while writes come from a thread.
            self._open[owner] = {**mine, credential.id: credential}
        log.info("stored credential %s for %s", credential.id, credential.destination)
        return credential

    def list(self, owner: str) -> list[Credential]:
        return sorted(self._open.get(owner, {}).values(), key=lambda c: c.created_at)

    def remove(self, owner: str, credential_id: str) -> bool:
        with self._lock:
            record = self._records.get(credential_id)
            if record is None or record.owner != owner:
                return False
            # Out of use first: the next request goes without it even if the write fails.
            mine = self._open.get(owner, {})
            self._open[owner] = {k: c for k, c in mine.items() if k != credential_id}
            del self._records[credential_id]
            self._write()
        log.info("deleted credential %s", credential_id)
        return True

    def find(self, owner: str, name: str, port: int) -> Credential | None:
        mine = self._open.get(owner)
        return best(mine.values(), name, port) if mine else None

    def of(self, owner: str) -> Owned:
        return Owned(self, owner)

    def _write(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        items = [
            {
                "id": r.id,
                "owner": r.owner,
                "destination": r.destination,
                "kind": r.kind,
                "names": list(r.names),
                "created_at": r.created_at,
                "sealed": r.sealed,
            }
            for r in self._records.values()
        ]
        data = json.dumps({"version": 1, "credentials": items}, indent=1).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Owned:
    """One tenant's share of the vault, as a link of a session's chain."""

    def __init__(self, vault: Vault, owner: str) -> None:
        self.vault = vault
        self.owner = owner

    def find(self, name: str, port: int) -> Credential | None:
        return self.vault.find(self.owner, name, port)

    def listed(self) -> list[Credential]:
        return self.vault.list(self.owner)
