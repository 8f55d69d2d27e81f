"""The wire protocol between the server and a sandbox's worker: frames, caps, message kinds.

Standard library only. The server imports it as `sandbank.sandbox.inside.protocol`, the worker
as `sandbank_inside.protocol`: one module, so both ends agree on every number below.

A frame is a 4-byte big-endian length and that many bytes of JSON (ASCII: lone surrogates and
control characters are escaped, so any text survives the trip). The server sends one request
and reads one reply; the worker never sends anything else. A reply that breaks these rules
(too large, not JSON, not an object) means the worker is broken: the server treats it like a
dead worker, restarts it, and the session stays usable.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct(">I")

# A request carries code or a file's text: the HTTP layer caps bodies at 16 MiB, which JSON
# escaping can at most sextuple.
MAX_REQUEST = 100 * 1024 * 1024
# Everything a reply may carry, all fields together. The worker fits its replies under it.
MAX_REPLY = 16 * 1024 * 1024
MAX_FILES = 1000  # produced files listed in one result; more are counted, not listed
MAX_PATH_CHARS = 4096  # a listed path longer than this is not listed

# Request kinds (`op`) and their fields.
OP_PYTHON = "python"  # code
OP_BASH = "bash"  # command
OP_EDIT = "edit"  # command, path, file_text, old_str, new_str, insert_line, view_range
OP_PING = "ping"
# A pause (snapshot.py): the worker writes its state to the workspace file at `path`, or loads
# one; both reply {"ok": bool, "lost": {name: reason}, "error": text when not ok}.
OP_SAVE, OP_RESTORE = "save_state", "restore_state"
PATH, LOST = "path", "lost"
LIMIT = "limit"  # bytes of output kept per stream
STREAM = "stream"  # true: send the call's output as it comes, in event frames, before the reply

# While a streamed call runs, the worker may send event frames {"event": kind, "data": ...}:
EVENT = "event"
EVENT_STDOUT, EVENT_STDERR, EVENT_DISPLAY = "stdout", "stderr", "display"

# The worker's first frame says it is ready: {"ready": true, "pid": N}.
READY = "ready"

# Python calls (OP_PYTHON) may also carry (see `contexts.py`):
CONTEXT = "context"  # a context's id: a namespace of its own (absent: the main namespace)
CWD = "cwd"  # the context's working directory when it is first used
ENVS = "envs"  # {name: value} set for the call only
NOTEBOOK = "notebook"  # true: the last value is `main`, an exception `error` (not text)
OP_DROP_CONTEXT = "drop_context"  # context: forget that namespace
# ...and their replies, when NOTEBOOK was asked for:
MAIN = "main"  # the last expression's display bundle
ERROR = "error"  # {"name", "value", "traceback"} of the exception that ended the call

# The interrupt channel (server to worker, read beside a running call) carries single bytes: an
# interrupt (SIGINT the call), a hard one (SIGKILL its processes), or a service request, which a
# frame follows.
CONTROL_INTERRUPT, CONTROL_KILL, CONTROL_SERVICE = b"i", b"k", b"s"

# Services beside calls (`services.py`): background processes and directory watches. They are
# served while a call runs, so their frames are tagged apart from a call's:
SERVICE = "svc"  # a request {"svc": op, "rid": n, ...}, answered {"bg": "reply", "rid": n, ...}
BACKGROUND = "bg"  # what a frame from the worker is for: "reply", "proc" or "watch"
SVC_START, SVC_LIST, SVC_INPUT, SVC_CLOSE_STDIN, SVC_SIGNAL = (
    "start", "list", "input", "close_stdin", "signal",
)  # fmt: skip
SVC_WATCH, SVC_UNWATCH = "watch", "unwatch"
MAX_CHUNK = 64 * 1024  # bytes of a process's output in one frame

# Reply fields: every reply to a call has all of them.
STDOUT, STDERR, RETURN_CODE, FILES = "stdout", "stderr", "return_code", "files"
FILES_CUT = "files_cut"  # how many produced files were not listed (absent when none)
DISPLAYS = "displays"  # display bundles: [{"data": {media type: text}, "cut": [...]}]
DISPLAYS_CUT = "displays_cut"  # how many bundles were left out for the reply's size


class ProtocolViolation(Exception):
    """A frame broke the protocol: too large, not JSON, or not an object."""


def encode(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg, separators=(",", ":")).encode("ascii")
    return HEADER.pack(len(data)) + data


def decode(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ProtocolViolation("not JSON") from e
    if not isinstance(msg, dict):
        raise ProtocolViolation("not a JSON object")
    return msg


def next_frame(buf: bytearray, read: Callable[[int], bytes], cap: int) -> dict[str, Any]:
    """The next frame of a stream: from `buf` (what was read past the last frame, consumed
    here) and `read(n)`, which reads ahead as much as it is given; EOFError at the end."""
    while True:
        if len(buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(buf)
            check_size(size, cap)
            end = HEADER.size + size
            if len(buf) >= end:
                body = bytes(buf[HEADER.size : end])
                del buf[:end]
                return decode(body)
            want = min(max(65536, end - len(buf)), 1 << 20)
        else:
            want = 65536
        chunk = read(want)
        if not chunk:
            raise EOFError
        buf += chunk


def check_size(size: int, cap: int) -> None:
    if size > cap:
        raise ProtocolViolation(f"a frame of {size} bytes, over the cap of {cap}")


def result(
    stdout: str = "",
    stderr: str = "",
    return_code: int = 0,
    files: list[str] | None = None,
    displays: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A reply to a call, with the produced files capped in number and path length."""
    listed: list[str] = []
    cut = 0
    for path in files or []:
        if len(listed) < MAX_FILES and len(path) <= MAX_PATH_CHARS:
            listed.append(path)
        else:
            cut += 1
    reply: dict[str, Any] = {
        STDOUT: stdout, STDERR: stderr, RETURN_CODE: return_code, FILES: listed,
    }  # fmt: skip
    if cut:
        reply[FILES_CUT] = cut
    if displays:
        reply[DISPLAYS] = displays
    return fit(reply)


def fit(reply: dict[str, Any]) -> dict[str, Any]:
    """Shorten stdout and stderr until the encoded reply fits MAX_REPLY, saying so."""
    rough = sum(len(str(reply.get(k) or "")) for k in (STDOUT, STDERR))
    rough += sum(len(f) + 8 for f in reply.get(FILES) or [])
    rough += sum(len(str(b)) for b in reply.get(DISPLAYS) or [])
    if rough * 6 + 4096 < MAX_REPLY:  # escaping grows text at most 6x: surely fits
        return reply
    size = len(encode(reply))
    if size <= MAX_REPLY:
        return reply
    displays = reply.get(DISPLAYS) or []
    while displays and size > MAX_REPLY:  # rich outputs give way first, the last ones first
        displays.pop()
        reply[DISPLAYS_CUT] = reply.get(DISPLAYS_CUT, 0) + 1
        size = len(encode(reply))
    if size <= MAX_REPLY:
        return reply
    # Escaping can grow text up to 6x: cut by the encoded excess, then check again.
    for _ in range(8):
        excess = size - MAX_REPLY + 4096
        for key in (STDOUT, STDERR):
            text = str(reply.get(key) or "")
            keep = max(0, len(text) - excess)
            if keep < len(text):
                reply[key] = text[:keep] + "\n[output truncated: the reply was too large]\n"
        size = len(encode(reply))
        if size <= MAX_REPLY:
            return reply
    reply[STDOUT] = reply[STDERR] = ""
    reply[FILES] = reply[FILES][:10]
    return reply


# --- file names --------------------------------------------------------------------------
# Names on disk are bytes; a name that is not valid UTF-8 is shown with each undecodable byte
# as `\xNN`, the same way in produced files, ListFiles and GetFile (which accepts that form).


def display_name(name: str) -> str:
    """A file name from os.* (undecodable bytes as surrogates) as text safe to send anywhere."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def disk_name(shown: str) -> str | None:
    """The on-disk name (os.* form) of a name shown with `\\xNN` escapes, if it has any."""
    if "\\x" not in shown:
        return None
    out = bytearray()
    i = 0
    raw = shown.encode("utf-8", "surrogatepass")
    while i < len(raw):
        if raw[i : i + 2] == b"\\x" and len(raw) >= i + 4:
            try:
                out.append(int(raw[i + 2 : i + 4], 16))
                i += 4
                continue
            except ValueError:
                pass
        out.append(raw[i])
        i += 1
    return bytes(out).decode("utf-8", "surrogateescape")
