"""Paused sessions on disk: each snapshot's files, its signed manifest, written atomically.

A snapshot is a directory of the store (`DATA_DIR/paused/<session id>/`, root's alone):
- `disk.img`: the workspace's disk, trimmed, kept while paused (and mounted from here when the
  session runs again, so a second pause moves nothing);
- `state`: what the session's own worker wrote of itself (`inside/snapshot.py`): opaque bytes
  here, never unpickled by the server, only placed back into the session's own sandbox;
- `checkpoint.img` and `checkpoint.state`: the same, copied from a running session;
- `manifest.json`: the session (id, tenant, limits, network policy, clocks, what was lost) and
  the state's SHA-256, under an HMAC with the server's key. Written last (temporary file, fsync,
  rename), so a snapshot torn by a crash has no manifest or an old one; a manifest or state
  changed on disk fails its check and is refused with `SnapshotDamaged`, never half-restored.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SnapshotDamaged, StorageFull
from .host.disk import fsync_dir

log = logging.getLogger(__name__)

IN_WORKSPACE = ".sandbank-state"  # the worker's file, at the workspace's root, while in transit
DISK, STATE, MANIFEST = "disk.img", "state", "manifest.json"
CKPT_DISK, CKPT_STATE = "checkpoint.img", "checkpoint.state"
PAUSED, CHECKPOINT = "paused", "checkpoint"
VERSION = 1
_PURPOSE = b"sandbank-snapshot-v1\x00"
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_CHUNK = 1 << 20


@dataclass
class Manifest:
    """What the server keeps of a paused (or checkpointed) session beside its files."""

    session_id: str
    tenant: str
    kind: str  # PAUSED or CHECKPOINT
    uid: int  # who owned the workspace's files (they are given to the next sandbox's uid)
    idle_timeout: int
    max_lifetime: int
    created_at: float
    last_activity_at: float
    network: list[str] | None  # None: no network
    labels: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    state_sha256: str = ""
    state_bytes: int = 0
    lost: dict[str, str] = field(default_factory=dict)  # what the worker could not keep
    shared_root: bool = False  # files placed read-only: the workspace root is the server's
    origin: str = ""  # a fleet session moved here: the key it moves under (fleet/moves.py)
    saved_at: float = field(default_factory=time.time)
    version: int = VERSION

    @property
    def disk_name(self) -> str:
        return CKPT_DISK if self.kind == CHECKPOINT else DISK

    @property
    def state_name(self) -> str:
        return CKPT_STATE if self.kind == CHECKPOINT else STATE


class SnapshotStore:
    """The snapshots of this server's sessions, under `root` (mode 0700)."""

    def __init__(self, root: Path, key: bytes) -> None:
        self.root = root
        self._key = hmac.new(key, b"sandbank snapshots", hashlib.sha256).digest()

    def prepare(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def dir(self, session_id: str) -> Path:
        if not _ID.fullmatch(session_id):
            raise SnapshotDamaged(f"{session_id[:40]!r} is not a session id")
        return self.root / session_id

    def disk(self, session_id: str, name: str = DISK) -> Path:
        return self.dir(session_id) / name

    # --- the state, between the workspace and the store ---------------------------------------
    def take_state(self, session_id: str, workspace: Path, name: str) -> tuple[str, int]:
        """Move the worker's state file out of the workspace into the store as `name`: its
        SHA-256 and size. `StorageFull` when the store has no room (nothing is left behind)."""
        d = self.dir(session_id)
        d.mkdir(mode=0o700, exist_ok=True)
        tmp = d / f".{name}.{secrets.token_hex(4)}"
        digest = hashlib.sha256()
        size = 0
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            src = os.open(
                IN_WORKSPACE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=root,
            )  # fmt: skip
            try:
                if not stat.S_ISREG(os.fstat(src).st_mode):
                    raise SnapshotDamaged("the session's state is not a regular file")
                with open(tmp, "wb") as out:
                    os.fchmod(out.fileno(), 0o600)
                    while chunk := os.read(src, _CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                os.rename(tmp, d / name)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                _raise_if_full(e, f" ({size >> 20} MiB written when it ran out)")
                raise
            finally:
                os.close(src)
                with contextlib.suppress(OSError):
                    os.unlink(IN_WORKSPACE, dir_fd=root)
        finally:
            os.close(root)
        return digest.hexdigest(), size

    def place_state(self, manifest: Manifest, workspace: Path, uid: int) -> None:
        """Put a snapshot's state into the (new) workspace for the worker to load, once its
        digest is checked; `SnapshotDamaged` (and nothing placed) when it does not match."""
        src = self.dir(manifest.session_id) / manifest.state_name
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        tmp = f"{IN_WORKSPACE}.{secrets.token_hex(4)}"
        placed = False
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                dir_fd=root,
            )  # fmt: skip
            digest = hashlib.sha256()
            try:
                os.fchown(fd, uid, uid)
                with open(src, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view) :]
            except FileNotFoundError:
                raise SnapshotDamaged(
                    self._damaged(manifest, "its state file is missing")
                ) from None
            finally:
                os.close(fd)
            if not hmac.compare_digest(digest.hexdigest(), manifest.state_sha256):
                raise SnapshotDamaged(self._damaged(manifest, "its state was changed on disk"))
            os.rename(tmp, IN_WORKSPACE, src_dir_fd=root, dst_dir_fd=root)
            placed = True
        finally:
            if not placed:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=root)
            os.close(root)

    # --- manifests -----------------------------------------------------------------------------
    def commit(self, manifest: Manifest) -> None:
        """Write the manifest, signed, atomically: the snapshot is whole from this moment."""
        d = self.dir(manifest.session_id)
        body = json.dumps(asdict(manifest), sort_keys=True, separators=(",", ":"))
        signed = {"manifest": body, "mac": self._mac(body.encode())}
        tmp = d / f".{MANIFEST}.{secrets.token_hex(4)}"
        try:
            with open(tmp, "w") as f:
                os.fchmod(f.fileno(), 0o600)
                json.dump(signed, f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, d / MANIFEST)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            _raise_if_full(e)
            raise
        fsync_dir(d)

    def load(self, session_id: str) -> Manifest:
        """The session's manifest, checked; `SnapshotDamaged` when it fails its check."""
        path = self.dir(session_id) / MANIFEST
        try:
            signed = json.loads(path.read_text())
            body = str(signed["manifest"])
            mac = str(signed["mac"])
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SnapshotDamaged(
                f"the snapshot of session {session_id!r} is unreadable ({type(e).__name__}): "
                "it was not restored"
            ) from None
        if not hmac.compare_digest(mac, self._mac(body.encode())):
            raise SnapshotDamaged(
                f"the snapshot of session {session_id!r} fails its integrity check (it was "
                "changed on disk, or written with another key): it was not restored"
            )
        fields: dict[str, Any] = json.loads(body)
        manifest = Manifest(**fields)
        if manifest.session_id != session_id:
            raise SnapshotDamaged(f"the snapshot in {session_id!r} is another session's")
        return manifest

    def scan(self) -> list[str]:
        """Ids of the sessions with a manifest in the store."""
        if not self.root.exists():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if _ID.fullmatch(p.name) and (p / MANIFEST).exists()
        )

    def forget_manifest(self, session_id: str) -> None:
        """The session runs again: a later crash must not bring back this older state."""
        with contextlib.suppress(FileNotFoundError):
            (self.dir(session_id) / MANIFEST).unlink()
        for name in (STATE, CKPT_STATE, CKPT_DISK):
            with contextlib.suppress(FileNotFoundError):
                (self.dir(session_id) / name).unlink()

    def forget_checkpoint(self, session_id: str) -> None:
        """A pause supersedes the session's checkpoint."""
        for name in (CKPT_STATE, CKPT_DISK):
            with contextlib.suppress(FileNotFoundError):
                (self.dir(session_id) / name).unlink()

    def remove(self, session_id: str) -> None:
        shutil.rmtree(self.dir(session_id), ignore_errors=True)

    def size(self, session_id: str) -> int:
        """Bytes the snapshot holds on disk (its images counted as allocated, not as sized)."""
        d = self.dir(session_id)
        return sum(p.stat().st_blocks * 512 for p in d.iterdir()) if d.exists() else 0

    def _mac(self, data: bytes) -> str:
        return hmac.new(self._key, _PURPOSE + data, hashlib.sha256).hexdigest()

    @staticmethod
    def _damaged(manifest: Manifest, why: str) -> str:
        return (
            f"the snapshot of session {manifest.session_id!r} is damaged ({why}): "
            "it was not restored"
        )


def load_key(path: Path) -> bytes:
    """A key of the store's own (mode 0600), made once, when the server hands none in."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_bytes().strip()


def _raise_if_full(error: OSError, written: str = "") -> None:
    """`StorageFull` when a snapshot's write failed for want of room: the session runs on."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise StorageFull(
            f"the server's disk has no room for this session's snapshot{written}: "
            "the session keeps running"
        ) from None
