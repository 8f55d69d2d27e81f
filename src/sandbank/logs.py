"""Logging: readable text or JSON lines, each with the request (and session) it serves."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from typing import Any

from .config import Settings

# Set by the access middleware for the duration of a request; "-" outside one.
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
session_id: contextvars.ContextVar[str] = contextvars.ContextVar("session_id", default="-")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(context)s]: %(message)s"
# Libraries that talk at INFO about things an operator need not see every start.
QUIET = ("alembic",)
# What would end a text log line or drive a terminal: C0 controls, DEL, C1 controls and
# Unicode's line and paragraph separators (what `str.splitlines` splits on, and more).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`text` on one line: each control character as `\\xNN` (or `\\uNNNN`)."""
    return CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class RequestIdFilter(logging.Filter):
    """Adds the request's id and session id to every log record made while serving it."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid, sid = request_id.get(), session_id.get()
        record.request_id = rid
        record.session_id = sid
        record.context = rid if sid == "-" else f"{rid} {sid}"
        return True


def _json_escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


class TextFormatter(logging.Formatter):
    """One line per record, whatever a client put in it.

    Messages carry client-controlled values (a path with `%0a`, a header): their control
    characters are escaped, so no client can forge a line or send a terminal escape. A
    traceback keeps its lines, each indented under the record it belongs to.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        lines = super().formatException(ei).split("\n")
        return "\n".join("  | " + escape_controls(line) for line in lines)

    def formatStack(self, stack_info: str) -> str:
        return "\n".join("  | " + escape_controls(line) for line in stack_info.split("\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per log line; a record's `fields` (the access line's method, path,
    status...) are fields of the object, never pieced into text."""

    def format(self, record: logging.LogRecord) -> str:
        item: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        sid = getattr(record, "session_id", "-")
        if sid != "-":
            item["session_id"] = sid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            item.update({k: v for k, v in fields.items() if k not in item})
        if record.exc_info:
            item["exception"] = self.formatException(record.exc_info)
        # JSON escapes C0 controls; C1 controls and Unicode's separators, which some readers
        # take for line ends, are escaped too.
        return JSON_UNSAFE.sub(_json_escaped, json.dumps(item, ensure_ascii=False))


def setup(settings: Settings) -> None:
    """Configure the root logger once per process, from the settings."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
    # No record here names its caller's file, thread or process: not looking them up saves
    # a stack walk per line (logging's documented optimisations; one access line per request).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    level = settings.log_level.upper()
    root.setLevel(level)
    for name in QUIET:
        # Their INFO lines (the migrations' seven) are shown at debug level only.
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
