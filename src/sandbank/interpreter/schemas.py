"""Requests and responses of the interpreter API: strict parsing (every failure a 400), JSON out."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from sandbank.errors import BadRequest
from sandbank.files import validate_filename, validate_stored_name
from sandbank.http.bodies import is_json, parse_json
from sandbank.http.responses import sse
from sandbank.interpreter.events import Event
from sandbank.store import ChatSession, FileRecord, Message
from sandbank.store.records import TITLE_MAX


def session_id(raw: str) -> str:
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise BadRequest(f"session_id must be a UUID, got {raw[:100]!r}") from None


def after(raw: str | None, name: str = "from") -> float | None:
    """A timestamp bound from the query parameter `name` (`from`, `include_messages_from`)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"`{name}` must be a number (POSIX seconds), got {raw[:100]!r}") from None
    if not math.isfinite(value):
        raise BadRequest(f"`{name}` must be a finite number")
    return value


def upload_name(raw: str | None) -> str:
    if raw is None:
        raise BadRequest("the query parameter `filename` is required")
    return validate_filename(raw)


def stored_name(raw: str | None) -> str:
    """A file of the session: an upload's name or a produced file's workspace-relative path."""
    if raw is None:
        raise BadRequest("the query parameter `filename` is required")
    return validate_stored_name(raw)


def _json_body(raw: bytes, content_type: str) -> Any:
    """The body as JSON, every refusal a 400 (the interpreter API's way)."""
    # Requiring JSON keeps cross-site HTML forms (which cannot send it) from posting.
    if not is_json(content_type):
        raise BadRequest("the request body must be JSON (Content-Type: application/json)")
    return parse_json(raw, BadRequest)


def _unicode(text: str, name: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"`{name}` contains a lone surrogate: it must be valid Unicode") from None
    return text


def message_content(raw: bytes, content_type: str, max_chars: int) -> str:
    """The question of a `PostMessage` body: `{"content": "...", "role": "user"?}` and no more."""
    body = _json_body(raw, content_type)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    # Other fields of the Message schema (timestamp, internal) are the server's to set: ignored.
    if "role" in body and body["role"] != "user":
        raise BadRequest("`role` must be `user` when given")
    content = body.get("content")
    if not isinstance(content, str) or not content.strip():
        raise BadRequest("`content` must be a non-empty string")
    if len(content) > max_chars:
        raise BadRequest(f"`content` is longer than {max_chars} characters")
    return _unicode(content, "content")


def session_out(session: ChatSession, sandbox: str | None = None) -> dict[str, Any]:
    """The Session schema; `sandbox` (an addition) where the answer reads its state."""
    out: dict[str, Any] = {
        "session_id": session.id,
        "status": session.status,
        "ttl": int(session.ttl),
    }
    if session.status_message is not None:
        out["status_message"] = session.status_message
    if session.title is not None:
        out["title"] = session.title
    if sandbox is not None:
        out["sandbox"] = sandbox
    return out


def session_title(raw: bytes, content_type: str) -> str | None:
    """The body of RenameSession: `{"title": "..."}` (null or blank: back to the first
    question)."""
    body = _json_body(raw, content_type)
    if not isinstance(body, dict) or "title" not in body:
        raise BadRequest('the request body must be a JSON object with `title`: {"title": "..."}')
    title = body["title"]
    if title is None:
        return None
    if not isinstance(title, str):
        raise BadRequest("`title` must be a string or null")
    title = " ".join(title.split())  # one line: control characters and runs of blanks go
    if len(title) > TITLE_MAX:
        raise BadRequest(f"`title` is longer than {TITLE_MAX} characters")
    return _unicode(title, "title") or None


def message_out(message: Message) -> dict[str, Any]:
    return {
        "timestamp": message.timestamp,
        "role": message.role,
        "content": message.content,
        "internal": message.internal,
    }


def session_with_messages_out(
    session: ChatSession, sandbox: str | None, messages: list[Message]
) -> dict[str, Any]:
    """GetSession with `include_messages_from`: each message has only the fields the spec's
    own web client builds its messages from (it refuses any other)."""
    brief = [{"timestamp": m.timestamp, "role": m.role, "content": m.content} for m in messages]
    return {**session_out(session, sandbox), "messages": brief}


def file_out(record: FileRecord) -> dict[str, Any]:
    return {"filename": record.filename, "size": record.size, "origin": record.origin}


# The end of a stream whose server stops: the run goes on (another replica, or the next start).
RESTARTING = (
    "the server is restarting, retry: the answer goes on (on another replica, or once the "
    "server is back); reconnect with `from` set to the last message's timestamp"
)


def event_out(event: Event) -> bytes:
    """One event of the session's stream as Server-Sent Events; a message's id is its
    timestamp, so a reconnecting EventSource resumes after it (`Last-Event-ID`)."""
    if event.message is not None:
        m = event.message
        return sse("message", message_out(m), event_id=json.dumps(m.timestamp))
    if event.session is not None:
        return sse("status", session_out(event.session))
    if event.kind == "text":
        return sse("text", {"step": event.step, "text": event.text})
    if event.kind == "end":
        if event.reason == "shutdown":
            return sse("end", {"reason": event.reason, "message": RESTARTING})
        return sse("end", {"reason": event.reason})
    return b": ping\n\n"
