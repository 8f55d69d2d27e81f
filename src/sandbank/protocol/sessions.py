"""Sessions as clients see them: what they ask for, their handles, and their files."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from ..egress.credentials import Credential, CredentialInfo
from ..egress.policy import NetworkPolicy

# How a front names a session to a node (a client's header never passes a front).
SESSION_NAME_HEADER = "x-sandbank-session-name"


@dataclass(frozen=True)
class SessionSpec:
    """What a client may ask of a new session: hints, clamped to the operator's ceilings."""

    idle_timeout: int | None = None
    max_lifetime: int | None = None
    network: NetworkPolicy | None = None  # None: the operator's default policy
    # A door's own name for the session, never a client's (an MCP caller's default session):
    # while the tenant's session of that name lives, creating it again gives it back.
    name: str | None = None
    # A door's own notes on the session (kept with it, listed with it, never interpreted).
    labels: Mapping[str, str] = field(default_factory=dict)
    # Environment variables of every call and process of the session.
    envs: Mapping[str, str] = field(default_factory=dict)
    # Added by the egress proxy to requests to their destinations; never in the sandbox.
    credentials: tuple[Credential, ...] = ()
    # The isolation asked for (an addition): a server runs only what it offers.
    isolation: str | None = None


@dataclass(frozen=True)
class SessionInfo:
    """A session's handle: its id, lifetimes in force and network policy."""

    id: str
    idle_timeout: int
    max_lifetime: int
    created_at: float
    last_activity_at: float
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    labels: Mapping[str, str] = field(default_factory=dict)
    credentials: tuple[CredentialInfo, ...] = ()  # the session's own, listed without values
    state: str = "running"  # or "paused": no process, its state on disk (an addition)
    isolation: str = ""  # what its sandbox runs under ("" where a remote did not say)

    @property
    def expires_at(self) -> float:
        """When its maximum lifetime ends it (it may end earlier, idle)."""
        return self.created_at + self.max_lifetime


@dataclass(frozen=True)
class FileEntry:
    """One entry of a workspace directory (`path` workspace-relative, `/`-separated)."""

    path: str
    size_bytes: int
    modified_at: float
    is_dir: bool = False


@dataclass
class Download:
    """A file being sent: its name, the size announced, and its bytes (at most that size)."""

    name: str
    size: int
    chunks: AsyncIterator[bytes]


# A multipart form as the door read it: (field name, file name, its bytes), in order.
FormPart = tuple[str, str | None, AsyncIterator[bytes]]
