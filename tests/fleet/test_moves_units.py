"""Moving a snapshot between nodes (fleet/moves.py) over fake nodes and an in-memory object
store: the key, the export, the adoption claimed once, and what a node refuses."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import time
from pathlib import Path
from typing import Any, cast

import pytest

from sandbank.errors import AtCapacity, SnapshotDamaged
from sandbank.files.memory import MemoryObjectStore
from sandbank.fleet import sparse
from sandbank.fleet.moves import CLAIM, PACKED, PREFIX, MovedSnapshots, move_key
from sandbank.sandbox.durability import (
    CHECKPOINT,
    CKPT_DISK,
    CKPT_STATE,
    DISK,
    MANIFEST,
    PAUSED,
    STATE,
    Manifest,
    SnapshotStore,
)
from sandbank.sandbox.sessions import ExecSession

pytestmark = pytest.mark.anyio
TOKEN = "fleet-token-for-moves"
DISK_BYTES = b"a workspace disk" * 1000
STATE_BYTES = b"the worker's state"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeNode:
    """A node's sessions as moving sees them: a real snapshot store, no sandboxes."""

    def __init__(self, root: Path) -> None:
        self.store: SnapshotStore | None = SnapshotStore(root, b"this node's own key")
        self.store.prepare()
        self.held: dict[str, ExecSession] = {}
        self.forgotten: list[str] = []

    def sessions(self) -> list[ExecSession]:
        return list(self.held.values())

    def new_id(self) -> str:
        return secrets.token_urlsafe(18)

    def adopt(self, manifest: Manifest) -> ExecSession:
        session = ExecSession(
            id=manifest.session_id,
            tenant=manifest.tenant,
            sandbox=cast(Any, None),
            idle_timeout=manifest.idle_timeout,
            max_lifetime=manifest.max_lifetime,
            paused=True,
            origin=manifest.origin,
        )
        self.held[session.id] = session
        return session

    def forget(self, session_id: str) -> None:
        self.forgotten.append(session_id)
        self.held.pop(session_id)

    async def pause_all(self) -> None:
        pass  # every session here is paused already

    def paused(self, kind: str = PAUSED) -> ExecSession:
        """A paused (or checkpointed) session with its snapshot in the store, as a pause (or a
        checkpoint) leaves it."""
        assert self.store is not None
        session_id = self.new_id()
        d = self.store.dir(session_id)
        d.mkdir(mode=0o700)
        disk, state = (DISK, STATE) if kind == PAUSED else (CKPT_DISK, CKPT_STATE)
        (d / disk).write_bytes(DISK_BYTES)
        (d / state).write_bytes(STATE_BYTES)
        now = time.time()
        manifest = Manifest(
            session_id=session_id, tenant="", kind=kind, uid=1234, idle_timeout=600,
            max_lifetime=3600, created_at=now, last_activity_at=now, network=None,
            state_sha256=hashlib.sha256(STATE_BYTES).hexdigest(), state_bytes=len(STATE_BYTES),
        )  # fmt: skip
        self.store.commit(manifest)
        return self.adopt(manifest)


COUNTED: list[str] = []


def mover(node: FakeNode, objects: MemoryObjectStore, name: str, token: str = TOKEN) -> Any:
    return MovedSnapshots(token, node, objects, name, "0a1b2c3d", counted=COUNTED.append)


async def test_a_drained_nodes_session_is_adopted_once_under_the_key_its_public_id_gives(
    tmp_path: Path,
) -> None:
    objects = MemoryObjectStore()
    a, b, c = (FakeNode(tmp_path / n) for n in "abc")
    session = a.paused()
    COUNTED.clear()
    assert await mover(a, objects, "node-a").move_out() == (1, 1)
    assert a.forgotten == [session.id]
    # The key a front computes from the id it verified: the node's name and its tagged id.
    key = move_key("node-a", "0a1b2c3d" + session.id)
    assert await objects.size(PREFIX + key + "/" + MANIFEST) is not None

    local = await mover(b, objects, "node-b").adopt(key, claim=True)
    assert local is not None and local != session.id
    assert b.store is not None
    manifest = b.store.load(local)  # signed again with node b's own key
    assert manifest.origin == key and manifest.uid == 1234
    assert (b.store.dir(local) / DISK).read_bytes() == DISK_BYTES
    assert (b.store.dir(local) / STATE).read_bytes() == STATE_BYTES
    assert COUNTED == ["out", "in"]
    # Claimed once: removed from the object store, another node finds nothing...
    assert await objects.delete_prefix(PREFIX) == 0
    assert await mover(c, objects, "node-c").adopt(key, claim=True) is None
    # ... and the holder answers for it again.
    assert await mover(b, objects, "node-b").adopt(key, claim=False) == local
    # Drained in turn, it moves under the same key (the id the client holds is unchanged).
    assert await mover(b, objects, "node-b").move_out() == (1, 1)
    assert await mover(c, objects, "node-c").adopt(key, claim=True) is not None


async def test_a_snapshot_claimed_by_another_node_is_not_adopted_twice(tmp_path: Path) -> None:
    objects = MemoryObjectStore()
    a, b = FakeNode(tmp_path / "a"), FakeNode(tmp_path / "b")
    session = a.paused()
    await mover(a, objects, "node-a").move_out()
    key = move_key("node-a", "0a1b2c3d" + session.id)
    assert await objects.put_new(PREFIX + key + "/" + CLAIM, b"node-c")  # node c adopts now
    with pytest.raises(AtCapacity):
        await mover(b, objects, "node-b").adopt(key, claim=True)
    assert b.sessions() == []


async def test_a_snapshot_signed_with_another_fleets_token_or_changed_is_refused(
    tmp_path: Path,
) -> None:
    objects = MemoryObjectStore()
    a, b = FakeNode(tmp_path / "a"), FakeNode(tmp_path / "b")
    session = a.paused()
    await mover(a, objects, "node-a", token="another fleet").move_out()
    key = move_key("node-a", "0a1b2c3d" + session.id)
    with pytest.raises(SnapshotDamaged):
        await mover(b, objects, "node-b").adopt(key, claim=True)
    # Nothing adopted, nothing left behind, and the claim released for a later try.
    assert b.sessions() == [] and b.store is not None and b.store.scan() == []
    assert await objects.size(PREFIX + key + "/" + CLAIM) is None

    # Signed right, but its disk changed in storage.
    a2 = FakeNode(tmp_path / "a2")
    second = a2.paused()
    await mover(a2, objects, "node-a").move_out()
    key2 = move_key("node-a", "0a1b2c3d" + second.id)
    await objects.put(f"{PREFIX}{key2}/{PACKED}", io.BytesIO(b"changed"))
    with pytest.raises(SnapshotDamaged):
        await mover(b, objects, "node-b").adopt(key2, claim=True)
    assert b.sessions() == [] and b.store.scan() == []


async def test_a_checkpoint_is_adopted_only_once_its_node_is_lost(tmp_path: Path) -> None:
    objects = MemoryObjectStore()
    a, b = FakeNode(tmp_path / "a"), FakeNode(tmp_path / "b")
    session = a.paused(CHECKPOINT)
    moves_a = mover(a, objects, "node-a")
    await moves_a.export(session)  # as after each checkpoint
    assert session.exported
    key = move_key("node-a", "0a1b2c3d" + session.id)
    # Its node runs (drains, say): the session there is newer than its checkpoint.
    assert await mover(b, objects, "node-b").adopt(key, claim=True, lost=False) is None
    assert await objects.size(PREFIX + key + "/" + CLAIM) is None
    local = await mover(b, objects, "node-b").adopt(key, claim=True, lost=True)
    assert local is not None and b.store is not None
    assert b.store.load(local).kind == PAUSED  # resumed from it on its next call
    assert (b.store.dir(local) / DISK).read_bytes() == DISK_BYTES

    # A session ended for good takes its exported checkpoint with it.
    other = a.paused(CHECKPOINT)
    await moves_a.export(other)
    await moves_a.ended(other)
    assert await objects.delete_prefix(PREFIX) == 0


def test_the_key_depends_on_node_and_id_only() -> None:
    assert move_key("n0", "abc") == move_key("n0", "abc")
    assert len({move_key("n0", "abc"), move_key("n1", "abc"), move_key("n0", "abd")}) == 3


def test_a_sparse_disk_moves_as_its_data_and_comes_back_sparse(tmp_path: Path) -> None:
    image, packed, back = tmp_path / "disk.img", tmp_path / "packed", tmp_path / "back.img"
    with open(image, "wb") as f:
        f.truncate(256 << 20)  # a 256 MiB disk holding 2 small files' worth
        for at in (4096, 100 << 20):
            f.seek(at)
            f.write(os.urandom(70_000))
    sparse.pack(image, packed)
    assert packed.stat().st_size < 1 << 20
    sparse.unpack(packed, back)
    assert back.stat().st_size == image.stat().st_size
    assert back.stat().st_blocks * 512 < 4 << 20  # its holes stay holes
    with open(image, "rb") as a, open(back, "rb") as b:
        while chunk := a.read(1 << 22):
            assert b.read(1 << 22) == chunk
    packed.write_bytes(packed.read_bytes()[:-10])
    with pytest.raises(sparse.Malformed):
        sparse.unpack(packed, back)
