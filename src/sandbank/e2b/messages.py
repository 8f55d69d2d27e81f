"""envd's messages in the proto3 JSON mapping, both ways, and E2B's paths.

The messages are those of E2B's public `envd` specification (`spec/envd/process/process.proto`,
`spec/envd/filesystem/filesystem.proto`, Apache-2.0), written by hand: lowerCamelCase names
(snake_case accepted too, as proto3 JSON parsers do), bytes as base64, enums by name (numbers
accepted), int64 as strings, timestamps in RFC 3339.

Paths: E2B's user home, `/home/user`, is the session's workspace (a link to it inside the
sandbox); relative paths and `~` resolve there. Other paths are out of the files API's reach.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from typing import Any

from ..protocol.filesystem import FsChange, FsEntry
from ..protocol.processes import Exited, ProcessEvent, ProcessInfo, ProcessOutput, Started
from .connect import ConnectError

HOME = "/home/user"
WORKSPACE = "/workspace"
FILE_TYPES = {
    "file": "FILE_TYPE_FILE",
    "dir": "FILE_TYPE_DIRECTORY",
    "symlink": "FILE_TYPE_SYMLINK",
}
EVENT_TYPES = {
    "create": "EVENT_TYPE_CREATE", "write": "EVENT_TYPE_WRITE", "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME", "chmod": "EVENT_TYPE_CHMOD",
}  # fmt: skip
SIGNALS = {"SIGNAL_SIGTERM": "TERM", "SIGNAL_SIGKILL": "KILL", 15: "TERM", 9: "KILL"}


# --- reading requests --------------------------------------------------------------------------
def field(message: Mapping[str, Any], camel: str, snake: str | None = None) -> Any:
    if camel in message:
        return message[camel]
    return message.get(snake) if snake else None


def text(message: Mapping[str, Any], camel: str, snake: str | None = None) -> str:
    value = field(message, camel, snake)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{camel} must be a string")
    return value


def obj(message: Mapping[str, Any], camel: str, snake: str | None = None) -> dict[str, Any]:
    value = field(message, camel, snake)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", f"{camel} must be an object")
    return value


def strings(message: Mapping[str, Any], camel: str) -> dict[str, str]:
    value = obj(message, camel)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConnectError("invalid_argument", f"{camel} must map strings to strings")
    return value


def integer(message: Mapping[str, Any], camel: str, snake: str | None = None) -> int:
    value = field(message, camel, snake)
    if value is None:
        return 0
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConnectError("invalid_argument", f"{camel} must be an integer")


def flag(message: Mapping[str, Any], camel: str, snake: str | None = None) -> bool:
    value = field(message, camel, snake)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConnectError("invalid_argument", f"{camel} must be a boolean")
    return value


def data(message: Mapping[str, Any], camel: str) -> bytes:
    raw = text(message, camel)
    try:
        return base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=_alt(raw), validate=True)
    except (binascii.Error, ValueError):
        raise ConnectError("invalid_argument", f"{camel} is not base64") from None


def _alt(raw: str) -> bytes | None:
    return b"-_" if ("-" in raw or "_" in raw) else None


def pid_of(selector: Mapping[str, Any]) -> int | str:
    """A ProcessSelector: its pid, or its tag."""
    if "pid" in selector:
        return integer(selector, "pid")
    if "tag" in selector:
        return text(selector, "tag")
    raise ConnectError("invalid_argument", "a process is chosen by its pid or its tag")


def signal_of(message: Mapping[str, Any]) -> str:
    sig = SIGNALS.get(field(message, "signal"))
    if sig is None:
        raise ConnectError(
            "invalid_argument", "the signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL"
        )
    return sig


# --- paths ---------------------------------------------------------------------------------------
def workspace_path(path: str) -> str:
    """An E2B path as a workspace-relative one ('.' for the workspace itself)."""
    if "\x00" in path:
        raise ConnectError("invalid_argument", "the path contains a NUL byte")
    if path in ("", "~"):
        return "."
    if path.startswith("~/"):
        path = path[2:]
    for root in (HOME, WORKSPACE):
        if path == root:
            return "."
        if path.startswith(root + "/"):
            return path[len(root) + 1 :] or "."
    if path.startswith("/"):
        raise ConnectError(
            "permission_denied",
            f"{path!r} is outside {HOME}: only the sandbox's home (its workspace) is reachable",
        )
    return path


def sandbox_path(rel: str) -> str:
    """A workspace-relative path as E2B names it."""
    return HOME if rel in ("", ".") else f"{HOME}/{rel}"


def sandbox_cwd(path: str | None) -> str:
    """A process's or context's directory: absolute as given, relative under the home."""
    if not path:
        return HOME
    if path == "~" or path.startswith("~/"):
        return HOME + path[1:]
    return path if path.startswith("/") else f"{HOME}/{path}"


# --- writing answers -----------------------------------------------------------------------------
def timestamp(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def entry(e: FsEntry) -> dict[str, Any]:
    """An EntryInfo."""
    out: dict[str, Any] = {
        "name": e.name if e.path else "user",
        "type": FILE_TYPES.get(e.kind, "FILE_TYPE_UNSPECIFIED"),
        "path": sandbox_path(e.path),
        "size": str(e.size),
        "mode": e.mode,
        "permissions": e.permissions,
        "owner": e.owner,
        "group": e.group,
        "modifiedTime": timestamp(e.modified_at),
    }
    if e.kind == "symlink":
        out["isSymlink"] = True
        if e.target is not None:
            out["symlinkTarget"] = e.target
    return out


def change(c: FsChange) -> dict[str, Any]:
    return {"name": c.path, "type": EVENT_TYPES[c.kind]}


def process_event(event: ProcessEvent) -> dict[str, Any]:
    if isinstance(event, Started):
        return {"start": {"pid": event.pid}}
    if isinstance(event, ProcessOutput):
        return {"data": {event.stream: base64.b64encode(event.data).decode()}}
    end: dict[str, Any] = {
        "exitCode": event.exit_code,
        "exited": event.exited,
        "status": event.status,
    }
    if event.error:
        end["error"] = event.error
    return {"end": end}


def process_info(info: ProcessInfo) -> dict[str, Any]:
    spec = info.spec
    config: dict[str, Any] = {"cmd": spec.cmd, "args": list(spec.args), "envs": dict(spec.envs)}
    if spec.cwd is not None:
        config["cwd"] = spec.cwd
    out: dict[str, Any] = {"config": config, "pid": info.pid}
    if spec.tag is not None:
        out["tag"] = spec.tag
    return out


def is_end(event: ProcessEvent) -> bool:
    return isinstance(event, Exited)
