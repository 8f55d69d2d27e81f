"""Background processes of a session, as doors see them: what starts one, and what it does.

A process runs beside the session's calls, with pipes of its own: started with a command,
its environment and working directory, streamed (`Started`, then its output as it comes, then
`Exited`), listed, written to, signalled; a client that stops listening does not stop it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Signal = Literal["TERM", "KILL"]
SIGNALS: tuple[Signal, ...] = ("TERM", "KILL")


@dataclass(frozen=True)
class ProcessSpec:
    """What starts a process: argv, environment (added to the session's), directory, stdin.

    `cwd` is a path as the sandbox sees it (relative, or None: the workspace's). `timeout` is
    its lifetime in seconds (None: until it exits or is signalled); `tag` a client's name.
    """

    cmd: str
    args: tuple[str, ...] = ()
    envs: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bool = False
    tag: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """A running process: its pid in the sandbox and what started it."""

    pid: int
    spec: ProcessSpec


@dataclass(frozen=True)
class Started:
    """The process runs (always the first event of a stream)."""

    pid: int


@dataclass(frozen=True)
class ProcessOutput:
    """Bytes the process wrote, as they came."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class Exited:
    """The process ended (always the last event): `exited` false when a signal ended it
    (`exit_code` -1 then); `status` as Go's os.ProcessState says it ("exit status 2",
    "signal: killed"); `error` when the sandbox itself ended it."""

    exit_code: int
    exited: bool
    status: str
    error: str | None = None


ProcessEvent = Started | ProcessOutput | Exited


@dataclass(frozen=True)
class ContextInfo:
    """A Python context of a session: a namespace of its own, with its working directory."""

    id: str
    cwd: str
    language: str = "python"
