"""Logging: readable text or JSON lines, each with the request (and session) it serves."""

from __future__ import annotations

import contextvars
import json
import logging
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


class RequestIdFilter(logging.Filter):
    """Adds the request's id and session id to every log record made while serving it."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid, sid = request_id.get(), session_id.get()
        record.request_id = rid
        record.session_id = sid
        record.context = rid if sid == "-" else f"{rid} {sid}"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per log line."""

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
        if record.exc_info:
            item["exception"] = self.formatException(record.exc_info)
        return json.dumps(item, ensure_ascii=False)


def setup(settings: Settings) -> None:
    """Configure the root logger once per process, from the settings."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    level = settings.log_level.upper()
    root.setLevel(level)
    for name in QUIET:
        # Their INFO lines (the migrations' seven) are shown at debug level only.
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
