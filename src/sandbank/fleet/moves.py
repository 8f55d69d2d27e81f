"""Sessions moving between fleet nodes, through the object store: a drained node's paused
sessions, and the checkpoints a lost node left.

A moved snapshot lives under `snapshots/<key>/` of the deployment's object store (S3, or
DATA_DIR/objects), where `key` is derived from what the session's public id names (node, the
node's tagged id): the front computes it from an id it has verified for the caller's tenant (the
id's MAC covers the tenant, so no other tenant reaches the key), the node from the session it
holds, and a moved session keeps its key (`origin`) for its next move. The manifest travels
signed with a key every node derives from the fleet token; the adopting node checks it and the
files' digests, and claims the snapshot with a conditional write, so that of two fronts (or
nodes) racing exactly one adopts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import io
import json
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ..errors import AtCapacity, SandbankError, SnapshotDamaged
from ..files import ObjectStore
from ..sandbox.durability import (
    CHECKPOINT,
    DISK,
    MANIFEST,
    PAUSED,
    STATE,
    Manifest,
    SnapshotStore,
)
from ..sandbox.sessions import ExecSession
from . import sparse

log = logging.getLogger(__name__)
PREFIX = "snapshots/"
CLAIM = "claim"
PACKED = "disk.packed"  # the disk image's data extents (sparse.py)
_PURPOSE = b"sandbank fleet moved snapshots"
_CHUNK = 1 << 20


def move_key(node: str, tagged: str) -> str:
    """Where the session a public id names moves to (its node, the node's tagged id)."""
    return hashlib.sha256(f"sandbank moved session\0{node}\0{tagged}".encode()).hexdigest()


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class Sessions(Protocol):
    """What moving uses of a node's sessions (`LocalSandboxes`)."""

    store: SnapshotStore | None

    def sessions(self) -> list[ExecSession]: ...
    def new_id(self) -> str: ...
    def adopt(self, manifest: Manifest) -> ExecSession: ...
    def forget(self, session_id: str) -> None: ...
    async def pause_all(self) -> None: ...


class MovedSnapshots:
    """A node's side of moving: export its paused sessions, adopt another node's."""

    def __init__(
        self,
        fleet_token: str,
        local: Sessions,
        objects: ObjectStore,
        node: str,
        instance: str,
        counted: Callable[[str], None] = lambda direction: None,
    ) -> None:
        self.counted = counted  # out, checkpoint, in (the metrics listen)
        # A key of its own: the token is never used for two purposes.
        self._key = hmac.new(fleet_token.encode(), _PURPOSE, hashlib.sha256).digest()
        self.local = local
        self.objects = objects
        self.node = node
        self.instance = instance
        # One adoption of a key at a time here; a lock lives while a call holds or awaits it.
        self._adopting: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    @property
    def possible(self) -> bool:
        """Only a durable backend keeps snapshots to move."""
        return self.local.store is not None

    def _store(self) -> SnapshotStore:
        store = self.local.store
        if store is None:
            raise SandbankError("this node's isolation keeps no snapshots: nothing moves")
        return store

    def key_of(self, session: ExecSession) -> str:
        return session.origin or move_key(self.node, self.instance + session.id)

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    # --- out: a draining node -------------------------------------------------------------------
    async def move_out(self) -> tuple[int, int]:
        """Pause every session, export each paused one, forget what moved: (moved, of)."""
        if not self.possible:
            return 0, len(self.local.sessions())
        await self.local.pause_all()
        sessions = self.local.sessions()
        moved = 0
        for session in sessions:
            if not session.paused:
                continue  # its pause failed: it ends with the drain, as before
            try:
                await self.export(session)
            except Exception:
                log.exception("a paused session could not be moved: it ends with the drain")
                continue
            self.local.forget(session.id)
            self.counted("out")
            moved += 1
        log.info("drain: %d of %d sessions moved to the object store", moved, len(sessions))
        return moved, len(sessions)

    async def export(self, session: ExecSession) -> None:
        """Copy a session's snapshot (paused, or its checkpoint) to the object store, replacing
        the one there: its manifest removed first and written last, so it is never mixed."""
        store = self._store()
        manifest = await asyncio.to_thread(store.load, session.id)
        key = self.key_of(session)
        base = PREFIX + key + "/"
        d = store.dir(session.id)
        packed = d / PACKED
        await self.objects.delete(base + MANIFEST)
        try:
            # Its data, not its holes.
            await asyncio.to_thread(sparse.pack, d / manifest.disk_name, packed)
            disk_sha256 = await asyncio.to_thread(_digest, packed)
            # A claim left by an adopter that failed would keep this snapshot from being adopted.
            await self.objects.delete(base + CLAIM)
            await self.objects.put(base + PACKED, packed)
            await self.objects.put(base + STATE, d / manifest.state_name)
        finally:
            await asyncio.to_thread(packed.unlink, True)
        moved = dataclasses.replace(manifest, origin=key)
        body = json.dumps(
            {"key": key, "manifest": asdict(moved), "disk_sha256": disk_sha256},
            sort_keys=True,
            separators=(",", ":"),
        )
        signed = json.dumps({"body": body, "mac": self._sign(body)}).encode()
        await self.objects.put(base + MANIFEST, io.BytesIO(signed), len(signed))
        session.exported = True
        if manifest.kind == CHECKPOINT:
            self.counted("checkpoint")

    async def ended(self, session: ExecSession) -> None:
        """A session with an exported checkpoint ended for good: the copy goes too (a call
        with its id must never bring it back)."""
        await self.objects.delete_prefix(PREFIX + self.key_of(session) + "/")

    # --- in: the node a front picked -------------------------------------------------------------
    def holding(self, key: str) -> ExecSession | None:
        return next((s for s in self.local.sessions() if s.origin == key), None)

    async def adopt(self, key: str, claim: bool, lost: bool = False) -> str | None:
        """The local id of the moved session `key`: one this node holds, or (with `claim`)
        imported now from the object store; None when neither. A checkpoint is taken only when
        the node that made it is `lost` (while it runs, the session runs there, newer)."""
        lock = self._adopting.get(key)
        if lock is None:
            lock = self._adopting[key] = asyncio.Lock()
        async with lock:
            held = self.holding(key)
            if held is not None:
                return held.id
            if not claim or not self.possible:
                return None
            return await self._claim(key, lost)

    async def _claim(self, key: str, lost: bool) -> str | None:
        base = PREFIX + key + "/"
        if await self.objects.size(base + MANIFEST) is None:
            return None
        if not await self.objects.put_new(base + CLAIM, self.node.encode()):
            # Another node adopts it now (another front chose otherwise): soon found there.
            raise AtCapacity("the session is moving to another node: retry shortly", retry_after=1)
        try:
            doc = await self._read_manifest(base, key)
            try:
                manifest = Manifest(**doc["manifest"])
            except TypeError:  # fields this version does not know
                raise SnapshotDamaged(f"the moved snapshot {key} is unreadable here") from None
            if manifest.kind not in (PAUSED, CHECKPOINT):
                raise SnapshotDamaged(f"the moved snapshot {key} is of no known kind")
            if manifest.kind == CHECKPOINT and not lost:
                await self.objects.delete(base + CLAIM)
                return None
            session_id = await self._import(base, manifest, str(doc["disk_sha256"]))
        except BaseException:
            await self.objects.delete(base + CLAIM)  # another try may succeed
            raise
        # The manifest first: from then on no node finds it; the claim last.
        for name in (MANIFEST, PACKED, STATE, CLAIM):
            with contextlib.suppress(SandbankError):
                await self.objects.delete(base + name)
        log.info("adopted a session moved from another node")
        self.counted("in")
        return session_id

    async def _read_manifest(self, base: str, key: str) -> dict[str, Any]:
        raw = b"".join([c async for c in await self.objects.open(base + MANIFEST)])
        try:
            signed = json.loads(raw)
            body, mac = str(signed["body"]), str(signed["mac"])
        except (ValueError, KeyError, TypeError):
            raise SnapshotDamaged(f"the moved snapshot {key} is unreadable") from None
        if not hmac.compare_digest(mac, self._sign(body)):
            raise SnapshotDamaged(
                f"the moved snapshot {key} fails its integrity check (changed in storage, or "
                "signed with another fleet's token): it was not adopted"
            )
        doc: dict[str, Any] = json.loads(body)
        if doc.get("key") != key:
            raise SnapshotDamaged(f"the snapshot under {key} is another session's")
        return doc

    async def _import(self, base: str, manifest: Manifest, disk_sha256: str) -> str:
        """Into this node's store under a new local id; the paused session known here."""
        store = self._store()
        session_id = self.local.new_id()
        d = store.dir(session_id)
        await asyncio.to_thread(d.mkdir, 0o700)
        try:
            await self.objects.copy_to(base + PACKED, d / PACKED)
            await self.objects.copy_to(base + STATE, d / STATE)
            disk_ok = hmac.compare_digest(await asyncio.to_thread(_digest, d / PACKED), disk_sha256)
            state_ok = hmac.compare_digest(
                await asyncio.to_thread(_digest, d / STATE), manifest.state_sha256
            )
            if not (disk_ok and state_ok):
                raise SnapshotDamaged("a moved snapshot's files were changed in storage")
            try:
                await asyncio.to_thread(sparse.unpack, d / PACKED, d / DISK)
            except sparse.Malformed as e:
                raise SnapshotDamaged(f"a moved snapshot's disk is unreadable: {e}") from None
            await asyncio.to_thread((d / PACKED).unlink)
            for name in (DISK, STATE):
                os.chmod(d / name, 0o600)
            here = dataclasses.replace(manifest, session_id=session_id, kind=PAUSED)
            await asyncio.to_thread(store.commit, here)
        except BaseException:
            await asyncio.to_thread(store.remove, session_id)
            raise
        self.local.adopt(here)
        return session_id
