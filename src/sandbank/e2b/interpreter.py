"""E2B's code interpreter (its port 49999): `/execute` streaming newline-delimited JSON, and
`/contexts`, over the port's notebook calls and Python contexts. Its errors are plain text."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..config import Settings
from ..errors import NotFound, SandbankError
from ..protocol.calls import RC_KILLED, RC_TIMEOUT, Bundle, Display, Done, Event, Output, PythonCall
from ..protocol.processes import ContextInfo
from ..sandbox.port import Sandboxes
from ..streams import gather
from . import messages as m
from .connect import with_keepalive
from .envd import Target

MAX_BODY = 16 * 1024 * 1024
DEFAULT_CONTEXT = "default"  # the session's main namespace, as a context id
KEEPALIVE = 5.0  # seconds of silence before a keepalive line, as E2B's server sends them
# Media types of a display bundle, and the field of E2B's result each fills.
FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf",
    "text/latex": "latex", "application/json": "json", "application/javascript": "javascript",
}  # fmt: skip
UNSUPPORTED = (
    'Failed to create context: {{"message": "The \'{0}\' kernel is not available. Please pick '
    'another suitable kernel instead, or install that kernel.", "short_message": "{0} not found"}}'
)


def language_of(given: Any) -> str:
    lang = (given if isinstance(given, str) else "python").strip().lower() or "python"
    return {"js": "javascript", "ts": "typescript"}.get(lang, lang)


def result_line(bundle: Bundle, main: bool) -> dict[str, Any]:
    """A display bundle as E2B's `result` line."""
    line: dict[str, Any] = {"type": "result"}
    extra: dict[str, Any] = {}
    for media, value in (bundle.get("data") or {}).items():
        name = FIELDS.get(media)
        if name is None:
            extra[media] = value
        elif name == "json":
            try:
                line["json"] = json.loads(value)
            except ValueError:
                extra[media] = value
        else:
            line[name] = value
    text = line.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        line["text"] = text[1:-1]  # as E2B shows a string's repr
    if extra:
        line["extra"] = extra
    line["is_main_result"] = main
    return line


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


class CodeInterpreter:
    """`/execute` and `/contexts` for one request's sandbox."""

    def __init__(self, sandboxes: Sandboxes, settings: Settings) -> None:
        self.sandboxes = sandboxes
        self.settings = settings

    async def execute(self, t: Target, request: Request) -> Response:
        try:
            body = json.loads(await _read(request))
        except (ValueError, RecursionError):
            return PlainTextResponse("the body must be a JSON object", 422)
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return PlainTextResponse("code is required", 422)
        context, language = body.get("context_id"), body.get("language")
        if context and language:
            return PlainTextResponse("Only one of context_id or language can be provided", 400)
        if language is not None and language_of(language) != "python":
            return PlainTextResponse(UNSUPPORTED.format(language_of(language)), 500)
        envs = body.get("env_vars") or {}
        if not isinstance(envs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
        ):
            return PlainTextResponse("env_vars must map strings to strings", 422)
        if context is not None and not isinstance(context, str):
            return PlainTextResponse("context_id must be a string", 422)
        call = PythonCall(
            body["code"],
            context=None if context in (None, "", DEFAULT_CONTEXT) else context,
            envs=envs or None,
            notebook=True,
        )
        # The client going away interrupts the cell, as a kernel's does.
        events = self.sandboxes.stream(
            t.session, t.tenant, call, self.settings.exec_timeout_max, cancel_on_close=True
        )
        try:
            first = await anext(events)
        except NotFound as e:
            await events.aclose()  # type: ignore[attr-defined]
            return PlainTextResponse(e.message if "Context" in e.message else str(e), 404)
        return StreamingResponse(_ndjson(first, events), media_type="application/x-ndjson")

    async def contexts(self, t: Target, request: Request) -> Response:
        if request.method == "GET":
            found = await self.sandboxes.list_contexts(t.session, t.tenant)
            listed = [{"id": DEFAULT_CONTEXT, "language": "python", "cwd": m.HOME}]
            return JSONResponse(listed + [_context(c) for c in found])
        try:
            raw = await _read(request)
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return PlainTextResponse("the body must be a JSON object", 422)
        if not isinstance(body, dict):
            return PlainTextResponse("the body must be a JSON object", 422)
        language = language_of(body.get("language"))
        if language != "python":
            return PlainTextResponse(UNSUPPORTED.format(language), 500)
        cwd = body.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            return PlainTextResponse("cwd must be a string", 422)
        made = await self.sandboxes.create_context(t.session, t.tenant, m.sandbox_cwd(cwd))
        return JSONResponse(_context(made))

    async def context(self, t: Target, request: Request, context_id: str, op: str) -> Response:
        if context_id == DEFAULT_CONTEXT:
            return JSONResponse(None)  # the main namespace is kept (E2B's default stays too)
        try:
            if op == "restart":
                await self.sandboxes.restart_context(t.session, t.tenant, context_id)
            else:
                await self.sandboxes.remove_context(t.session, t.tenant, context_id)
        except NotFound:
            return PlainTextResponse(f"Context {context_id} not found", 404)
        return JSONResponse(None)


def _context(c: ContextInfo) -> dict[str, str]:
    return {"id": c.id, "language": c.language, "cwd": c.cwd}


async def _read(request: Request) -> bytes:
    return await gather(
        request.stream(), MAX_BODY, lambda: SandbankError("the request body is too large")
    )


async def _ndjson(first: Event, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """The cell's events as E2B's lines: output and displays as they come, then the main
    result or the error, the execution count, and the end."""

    async def all_events() -> AsyncIterator[Any]:
        yield first
        async for event in events:
            yield event

    try:
        async for event in with_keepalive(all_events(), KEEPALIVE, {"keepalive": True}):
            if isinstance(event, dict):
                yield _line({"type": "keepalive"})
            elif isinstance(event, Output):
                yield _line({"type": event.stream, "text": event.text, "timestamp": _now()})
            elif isinstance(event, Display):
                yield _line(result_line(event.bundle, main=False))
            elif isinstance(event, Done):
                result = event.result
                if result.main is not None:
                    yield _line(result_line(result.main, main=True))
                if result.error is not None:
                    e = result.error
                    yield _line(
                        {
                            "type": "error",
                            "name": e.name,
                            "value": e.value,
                            "traceback": e.traceback,
                        }
                    )
                elif result.return_code in (RC_TIMEOUT, RC_KILLED):
                    name = "TimeoutError" if result.return_code == RC_TIMEOUT else "SandboxError"
                    value = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
                    yield _line(
                        {"type": "error", "name": name, "value": value, "traceback": result.stderr}
                    )
                count = {"type": "number_of_executions", "execution_count": result.execution_count}
                yield _line(count)
                yield _line({"type": "end_of_execution"})
    finally:
        await events.aclose()  # type: ignore[attr-defined]
