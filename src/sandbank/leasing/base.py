"""The `Sandboxes` interface: what the interpreter service needs from a sandbox provider."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from sandbank.sandbox.base import ExecResult, ToolCall

# Names under these never count as a user's or a run's files (staging, caches, configs).
HIDDEN_PREFIX = "."
MAX_WALK_ENTRIES = 5000  # a run that makes more files than this has them listed partly


@dataclass(frozen=True)
class FileEntry:
    path: str  # workspace-relative, `/`-separated
    size: int
    modified_at: float


def visible(path: str) -> bool:
    return not any(part.startswith(HIDDEN_PREFIX) for part in path.split("/"))


class Sandboxes(Protocol):
    """Leased sandboxes, addressed by id; `owner` scopes them (a tenant of the provider).

    Every method raises `SessionNotFound` for an id the provider no longer has (reclaimed).
    """

    async def start(self) -> None:
        """Check the provider can serve us (the remote one probes its optional file routes)."""
        ...

    async def close(self) -> None: ...

    async def create(self, owner: str) -> str:
        """A new sandbox; returns its id."""
        ...

    async def exists(self, sandbox_id: str, owner: str) -> bool: ...

    async def execute(
        self, sandbox_id: str, owner: str, call: ToolCall, timeout_s: float
    ) -> ExecResult: ...

    async def destroy(self, sandbox_id: str, owner: str) -> None:
        """Kill its processes and remove it; a missing one is not an error."""
        ...

    async def list_files(self, sandbox_id: str, owner: str) -> list[FileEntry]:
        """Every visible regular file of the workspace, recursively (symlinks are skipped)."""
        ...

    async def read_file(
        self, sandbox_id: str, owner: str, path: str, dest: BinaryIO, max_bytes: int
    ) -> int:
        """Copy a workspace file into `dest`; `PayloadTooLarge` past `max_bytes`."""
        ...

    async def put_file(
        self, sandbox_id: str, owner: str, path: str, source: Path, read_only: bool
    ) -> None:
        """Place a file in the workspace, replacing one of that name.

        `read_only`: the sandbox's code may read but not change, replace or delete it (enforced
        by the local provider; a remote provider can only make it read-only by mode, see README).
        """
        ...
