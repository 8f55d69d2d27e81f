"""The sandbox port: what every door (both APIs, the agent, the CLI) asks of sandboxes.

Implemented by `local.LocalSandboxes` (this machine's backend and pool; over the fake backend in
tests), `remote.RemoteSandboxes` (any code-execution API) and `fleet.sandboxes.FleetSandboxes`
(many nodes). Sessions are addressed by id and scoped by `tenant`: another tenant's session does
not exist for a caller. Every method raises `SessionNotFound` for an unknown session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Protocol

from ..egress.credentials import Credential, CredentialInfo
from ..errors import PayloadTooLarge, SessionNotFound
from ..protocol.calls import Event, ExecResult, ToolCall
from ..protocol.filesystem import FsChange, FsEntry
from ..protocol.processes import ContextInfo, ProcessEvent, ProcessInfo, ProcessSpec, Signal
from ..protocol.sessions import Download, FileEntry, FormPart, SessionInfo, SessionSpec

# Names under these never count as a user's or a run's files (staging, caches, configs).
HIDDEN_PREFIX = "."
MAX_WALK_ENTRIES = 5000  # a run that makes more files than this has them listed partly


class Sandboxes(Protocol):
    """Leased sandboxes, addressed by id and scoped by tenant."""

    async def start(self) -> None: ...

    async def close(self) -> None:
        """End every session this provider holds and give back what it holds."""
        ...

    def healthy(self) -> bool:
        """Whether a lease can be served now (False while shutting down)."""
        ...

    def status(self) -> dict[str, int]:
        """Figures for a health check (the warm pool's ready sandboxes, say)."""
        ...

    async def create(self, tenant: str, spec: SessionSpec | None = None) -> SessionInfo:
        """A new session; `AtCapacity` (with a retry delay) when there is no room."""
        ...

    async def get(self, session_id: str, tenant: str) -> SessionInfo: ...

    async def execute(
        self, session_id: str, tenant: str, call: ToolCall, timeout: float
    ) -> ExecResult:
        """Run one call within `timeout` seconds; a program's failure is a result."""
        ...

    def stream(
        self,
        session_id: str,
        tenant: str,
        call: ToolCall,
        timeout: float,
        *,
        cancel_on_close: bool = False,
    ) -> AsyncIterator[Event]:
        """The call's output and displays as they come, then `Done` with its result.

        The call runs on its own: closing the iterator early interrupts nothing, unless
        `cancel_on_close` (then the call is interrupted and the session kept in step).
        """
        ...

    async def destroy(self, session_id: str, tenant: str) -> None:
        """End the session (in the background); an unknown one is not an error."""
        ...

    async def list_files(
        self, session_id: str, tenant: str, path: str, limit: int
    ) -> tuple[list[FileEntry], bool]:
        """The entries of a workspace directory, and whether more than `limit` were left out."""
        ...

    async def read_file(self, session_id: str, tenant: str, path: str) -> Download: ...

    async def upload(
        self, session_id: str, tenant: str, form: AsyncIterator[FormPart], cap: int
    ) -> FileEntry:
        """PutFile: the form's `file` part at its `path` field (or its own name), whole or not
        at all; `PayloadTooLarge` past `cap` bytes."""
        ...

    async def write_file(
        self,
        session_id: str,
        tenant: str,
        path: str,
        chunks: AsyncIterator[bytes],
        *,
        read_only: bool = False,
    ) -> FileEntry:
        """Place a file, replacing one of that name. `read_only`: the session's code may read
        it but not change, replace or delete it (a remote provider can only set its mode)."""
        ...

    # --- sessions as a door lists and extends them -------------------------------------------
    async def list_sessions(self, tenant: str) -> list[SessionInfo]:
        """The tenant's sessions, oldest first, with their labels."""
        ...

    async def set_lifetime(self, session_id: str, tenant: str, seconds: int) -> SessionInfo:
        """End the session `seconds` from now (sooner or later than before), within the
        operator's ceiling on lifetimes."""
        ...

    # --- pauses: no process, the session's state on disk; any call resumes it ------------------
    async def pause(self, session_id: str, tenant: str) -> SessionInfo:
        """Pause the session after the calls before it (`state` "paused"); `PauseFailed` or
        `StorageFull` (the session running as before) when its state cannot be kept."""
        ...

    async def resume(self, session_id: str, tenant: str) -> SessionInfo:
        """Run the paused session again (a running one is left as it is)."""
        ...

    # --- the session's own credentials (added by the egress proxy, never in the sandbox) -----
    async def list_credentials(self, session_id: str, tenant: str) -> list[CredentialInfo]: ...

    async def remove_credential(self, session_id: str, tenant: str, credential_id: str) -> None:
        """Stop adding it (from the session's next request on); `NotFound` for an unknown one."""
        ...

    async def replace_credentials(
        self, session_id: str, tenant: str, credentials: Sequence[Credential]
    ) -> list[CredentialInfo]:
        """The session's own credentials become these."""
        ...

    # --- the tenant's stored credentials (every session of the tenant gets them) -------------
    async def store_credential(self, tenant: str, credential: Credential) -> CredentialInfo:
        """Kept sealed at rest; `Conflict` when the operator set no key to seal them."""
        ...

    async def list_stored_credentials(self, tenant: str) -> list[CredentialInfo]: ...

    async def delete_stored_credential(self, tenant: str, credential_id: str) -> None:
        """Stop adding it (from each session's next request on); `NotFound` if unknown."""
        ...

    # --- Python contexts: namespaces of their own beside the session's main one ---------------
    async def create_context(
        self, session_id: str, tenant: str, cwd: str | None = None
    ) -> ContextInfo:
        """A new context (`cwd` as the sandbox names it; None: the workspace)."""
        ...

    async def list_contexts(self, session_id: str, tenant: str) -> list[ContextInfo]: ...

    async def restart_context(self, session_id: str, tenant: str, context_id: str) -> None:
        """Empty the context's namespace; `NotFound` for an unknown one."""
        ...

    async def remove_context(self, session_id: str, tenant: str, context_id: str) -> None: ...

    # --- background processes, beside calls ---------------------------------------------------
    def start_process(
        self, session_id: str, tenant: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        """Start a process with the session's environment and `spec`'s; its events: `Started`,
        output as it comes, `Exited`. Closing the iterator early stops nothing."""
        ...

    def connect_process(
        self, session_id: str, tenant: str, pid: int
    ) -> AsyncIterator[ProcessEvent]:
        """A running process's events from now on (`Started` first); `NotFound` for none."""
        ...

    async def list_processes(self, session_id: str, tenant: str) -> list[ProcessInfo]: ...

    async def send_stdin(self, session_id: str, tenant: str, pid: int, data: bytes) -> None:
        """Write to the process's stdin (`Conflict` when it was started without one)."""
        ...

    async def close_stdin(self, session_id: str, tenant: str, pid: int) -> None: ...

    async def signal_process(self, session_id: str, tenant: str, pid: int, sig: Signal) -> None:
        """Signal the process and everything it started."""
        ...

    # --- the workspace's tree (paths workspace-relative, symlinks described, never followed) --
    async def stat(self, session_id: str, tenant: str, path: str) -> FsEntry: ...

    async def list_tree(self, session_id: str, tenant: str, path: str, depth: int) -> list[FsEntry]:
        """The entries under a directory, `depth` levels down (1: its own entries)."""
        ...

    async def make_dir(self, session_id: str, tenant: str, path: str) -> FsEntry:
        """Make a directory and its parents; `AlreadyExists` when it is there."""
        ...

    async def move(
        self, session_id: str, tenant: str, source: str, destination: str
    ) -> FsEntry: ...

    async def remove(self, session_id: str, tenant: str, path: str) -> None:
        """Remove a file or a whole directory; one that is not there is not an error."""
        ...

    async def watch(
        self, session_id: str, tenant: str, path: str, recursive: bool
    ) -> AsyncIterator[FsChange]:
        """Changes under a workspace directory, from the moment this returns."""
        ...

    async def create_watcher(self, session_id: str, tenant: str, path: str, recursive: bool) -> str:
        """A watch kept with the session, its changes collected until asked for (any door of a
        fleet may ask); its id."""
        ...

    async def watcher_changes(
        self, session_id: str, tenant: str, watcher_id: str
    ) -> list[FsChange]:
        """The watcher's changes since the last time; `NotFound` for an unknown watcher."""
        ...

    async def remove_watcher(self, session_id: str, tenant: str, watcher_id: str) -> None: ...


def visible(path: str) -> bool:
    return not any(part.startswith(HIDDEN_PREFIX) for part in path.split("/"))


async def exists(sandboxes: Sandboxes, session_id: str, tenant: str) -> bool:
    try:
        await sandboxes.get(session_id, tenant)
    except SessionNotFound:
        return False
    return True


async def walk(sandboxes: Sandboxes, session_id: str, tenant: str) -> list[FileEntry]:
    """Every visible regular file of the workspace, recursively (symlinks are never followed)."""
    found: list[FileEntry] = []
    pending = ["."]
    seen = 0
    while pending:
        entries, _ = await sandboxes.list_files(session_id, tenant, pending.pop(), MAX_WALK_ENTRIES)
        for entry in entries:
            if not visible(entry.path):
                continue
            seen += 1
            if seen > MAX_WALK_ENTRIES:
                return found
            if entry.is_dir:
                pending.append(entry.path)
            else:
                found.append(entry)
    return found


async def copy_out(
    sandboxes: Sandboxes, session_id: str, tenant: str, path: str, dest: IO[bytes], cap: int
) -> int:
    """Copy a workspace file into `dest`; `PayloadTooLarge` past `cap` bytes."""
    download = await sandboxes.read_file(session_id, tenant, path)
    too_large = PayloadTooLarge(f"{path!r} is larger than {cap} bytes")
    size = 0
    try:
        if download.size > cap:
            raise too_large
        async for chunk in download.chunks:
            size += len(chunk)
            if size > cap:
                raise too_large
            dest.write(chunk)
    finally:
        await _close(download.chunks)
    return size


async def chunks_of(path: Path, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    """A local file's bytes, read off the event loop."""
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, size):
            yield chunk


async def _close(chunks: AsyncIterator[bytes]) -> None:
    closer = getattr(chunks, "aclose", None)
    if closer is not None:
        await closer()
