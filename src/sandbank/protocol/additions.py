"""The code-execution API's additions beside calls and files, as JSON, both ways.

Sessions listed and extended, Python contexts, background processes (their events as
newline-delimited JSON), the workspace tree and its watches: what a fleet's fronts ask of
their nodes for the E2B door, documented in `execapi/additions.yaml`. Requests are checked as
strictly as the contract's own (`Unprocessable` naming the field); a reply outside these
shapes is a `ProtocolError`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from ..errors import Unprocessable
from .codec import malformed
from .filesystem import CHANGE_KINDS, EntryKind, FsChange, FsEntry
from .processes import (
    SIGNALS,
    ContextInfo,
    Exited,
    ProcessEvent,
    ProcessInfo,
    ProcessOutput,
    ProcessSpec,
    Signal,
    Started,
)

MAX_LABELS, MAX_ENVS = 64, 256
MAX_LABEL_CHARS, MAX_ENV_CHARS = 64 * 1024, 32 * 1024
MAX_ARGS, MAX_ARG_CHARS = 4096, 128 * 1024
KINDS: tuple[EntryKind, ...] = ("file", "dir", "symlink", "other")


# --- checks of requests --------------------------------------------------------------------------
def strings(value: Any, name: str, most: int, longest: int) -> dict[str, str]:
    """A JSON object of strings (labels, environment variables), bounded."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise Unprocessable(f"{name} must be an object of strings")
    if len(value) > most:
        raise Unprocessable(f"{name} has more than {most} entries")
    if any(len(k) + len(v) > longest for k, v in value.items()):
        raise Unprocessable(f"{name} has an entry longer than {longest} characters")
    return value


def body_of(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise Unprocessable("the request body must be a JSON object")
    return body


def text_of(body: Mapping[str, Any], name: str, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise Unprocessable(f"{name} is required (a string)")
    return value


def positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Unprocessable(f"{name} must be a number >= 0")
    return int(value)


# --- sessions, contexts ----------------------------------------------------------------------
def encode_context(c: ContextInfo) -> dict[str, Any]:
    return {"id": c.id, "cwd": c.cwd, "language": c.language}


def decode_context(body: Any) -> ContextInfo:
    with malformed("context"):
        return ContextInfo(str(body["id"]), str(body["cwd"]), str(body.get("language") or "python"))


# --- processes ---------------------------------------------------------------------------------
def encode_spec(spec: ProcessSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "cmd": spec.cmd, "args": list(spec.args), "envs": dict(spec.envs), "stdin": spec.stdin,
    }  # fmt: skip
    if spec.cwd is not None:
        body["cwd"] = spec.cwd
    if spec.tag is not None:
        body["tag"] = spec.tag
    if spec.timeout is not None:
        body["timeout_seconds"] = spec.timeout
    return body


def parse_spec(body: Any) -> ProcessSpec:
    body = body_of(body)
    args = body.get("args") or []
    if (
        not isinstance(args, list)
        or len(args) > MAX_ARGS
        or not all(isinstance(a, str) and len(a) <= MAX_ARG_CHARS for a in args)
    ):
        raise Unprocessable("args must be a list of strings")
    timeout = body.get("timeout_seconds")
    return ProcessSpec(
        cmd=str(text_of(body, "cmd")),
        args=tuple(args),
        envs=strings(body.get("envs"), "envs", MAX_ENVS, MAX_ENV_CHARS),
        cwd=text_of(body, "cwd", required=False),
        stdin=bool(body.get("stdin")),
        tag=text_of(body, "tag", required=False),
        timeout=None if timeout is None else float(positive(timeout, "timeout_seconds")),
    )


def encode_info(info: ProcessInfo) -> dict[str, Any]:
    return {"pid": info.pid, **encode_spec(info.spec)}


def decode_info(body: Any) -> ProcessInfo:
    with malformed("process listing"):
        return ProcessInfo(int(body["pid"]), parse_spec(body))


def parse_signal(body: Any) -> Signal:
    value = body_of(body).get("signal")
    if value not in SIGNALS:
        raise Unprocessable(f"signal must be one of {', '.join(SIGNALS)}")
    return value  # type: ignore[no-any-return]


def encode_event(event: ProcessEvent) -> bytes:
    """One line of a process's stream."""
    line: dict[str, Any]
    if isinstance(event, Started):
        line = {"started": event.pid}
    elif isinstance(event, ProcessOutput):
        line = {event.stream: base64.b64encode(event.data).decode()}
    else:
        line = {
            "exited": {
                "exit_code": event.exit_code,
                "exited": event.exited,
                "status": event.status,
                "error": event.error,
            }
        }
    return (json.dumps(line) + "\n").encode()


def decode_event(line: Any) -> ProcessEvent:
    with malformed("process stream"):
        if "started" in line:
            return Started(int(line["started"]))
        for stream in ("stdout", "stderr"):
            if stream in line:
                try:
                    data = base64.b64decode(str(line[stream]), validate=True)
                except binascii.Error as e:
                    raise ValueError("not base64") from e
                return ProcessOutput(stream, data)
        end = line["exited"]
        error = end.get("error")
        return Exited(
            int(end["exit_code"]),
            bool(end["exited"]),
            str(end.get("status") or ""),
            None if error is None else str(error),
        )


def error_line(status: int, code: str, detail: str) -> bytes:
    """A stream's failure after its answer began."""
    return (
        json.dumps({"error": {"status": status, "code": code, "detail": detail}}) + "\n"
    ).encode()


# --- the tree ----------------------------------------------------------------------------------
def encode_entry(e: FsEntry) -> dict[str, Any]:
    return {
        "path": e.path, "kind": e.kind, "size": e.size, "mode": e.mode,
        "permissions": e.permissions, "owner": e.owner, "group": e.group,
        "modified_at": e.modified_at, "target": e.target,
    }  # fmt: skip


def decode_entry(body: Any) -> FsEntry:
    with malformed("tree entry"):
        kind = body["kind"]
        if kind not in KINDS:
            raise ValueError(kind)
        target = body.get("target")
        return FsEntry(
            path=str(body["path"]),
            kind=kind,
            size=int(body["size"]),
            mode=int(body["mode"]),
            permissions=str(body["permissions"]),
            owner=str(body["owner"]),
            group=str(body["group"]),
            modified_at=float(body["modified_at"]),
            target=None if target is None else str(target),
        )


def encode_change(c: FsChange) -> dict[str, Any]:
    return {"path": c.path, "kind": c.kind}


def decode_change(body: Any) -> FsChange:
    with malformed("watch"):
        if body["kind"] not in CHANGE_KINDS:
            raise ValueError(body["kind"])
        return FsChange(str(body["path"]), body["kind"])
