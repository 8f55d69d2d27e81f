"""A session's file tree as doors see it beyond the protocol's files: entries and changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

EntryKind = Literal["file", "dir", "symlink", "other"]
ChangeKind = Literal["create", "write", "remove", "rename", "chmod"]
CHANGE_KINDS: tuple[ChangeKind, ...] = get_args(ChangeKind)


@dataclass(frozen=True)
class FsEntry:
    """One entry (`path` workspace-relative, '' for the workspace itself); a symlink is
    described, never followed (`target` is what it points at)."""

    path: str
    kind: EntryKind
    size: int
    mode: int  # permission bits (st_mode & 0o7777)
    permissions: str  # as ls shows them: "-rw-r--r--"
    owner: str
    group: str
    modified_at: float
    target: str | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class FsChange:
    """A change under a watched directory (`path` relative to it)."""

    path: str
    kind: ChangeKind
