"""`sandbank exec`: one call through a running server's code-execution API, from a terminal."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx

from .config import Settings
from .errors import SandbankError
from .http.auth import load_tokens
from .protocol.calls import BashCall, ExecResult, PythonCall
from .protocol.client import ExecClient, HttpxTransport
from .protocol.http1 import TransportFailed

# The server answers every call within its timeout + 5 s; leave room for the network.
CALL_SLACK_S = 15.0


def default_url(settings: Settings) -> str:
    if settings.exec_api == "separate":
        host, port = settings.exec_api_host, settings.exec_api_port
    else:
        host, port = settings.host, settings.port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def default_token(settings: Settings) -> str | None:
    tokens = load_tokens(settings)
    return tokens[0] if tokens else None


def _check(response: httpx.Response, what: str) -> Any:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail") or response.json().get("message")
        except ValueError:
            detail = response.text[:200]
        raise SandbankError(f"{what} failed: HTTP {response.status_code}: {detail}")
    return response.json() if response.content else None


def run_in_sandbox(
    settings: Settings,
    *,
    url: str | None,
    token: str | None,
    session: str | None,
    keep: bool,
    tool: str,
    text: str,
    timeout: int | None,
) -> int:
    """Run `text` with `tool`; print stdout and stderr; return the call's return code."""
    base = (url or default_url(settings)).rstrip("/")
    token = token or default_token(settings)
    budget = (timeout or settings.exec_timeout_max) + CALL_SLACK_S
    call = PythonCall(text) if tool == "code_execution" else BashCall(text)
    created = session is None

    async def run() -> tuple[str, ExecResult]:
        transport = HttpxTransport(base, budget)
        client = ExecClient(transport, f"Bearer {token}" if token else None)
        try:
            sid = session or (await _step("creating a session", client.create())).id
            try:
                return sid, await _step("running the code", client.execute(sid, call, timeout))
            finally:
                if created and not keep:
                    await client.destroy(sid)
        except TransportFailed as error:
            raise SandbankError(f"cannot reach the server at {base}: {error}") from None
        finally:
            await transport.close()

    session, result = asyncio.run(run())
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    for name in result.files:
        print(f"[file] {name}", file=sys.stderr)
    if created and keep:
        print(f"[session] {session}", file=sys.stderr)
    return result.return_code


async def _step(what: str, operation: Any) -> Any:
    try:
        return await operation
    except SandbankError as e:
        raise SandbankError(f"{what} failed: {e.message}") from None


def exec_sessions(settings: Settings, url: str | None, token: str | None) -> list[dict[str, Any]]:
    """The code-execution sessions a running server holds (its admin endpoint)."""
    base = (url or default_url(settings)).rstrip("/")
    token = token or settings.admin_token.get_secret_value()
    if not token:
        raise SandbankError(
            "listing a server's code-execution sessions needs its admin token: set "
            "SANDBANK_ADMIN_TOKEN (on the server and here) or pass --token"
        )
    try:
        response = httpx.get(
            f"{base}/admin/sessions", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
    except httpx.HTTPError as error:
        raise SandbankError(f"cannot reach the server at {base}: {error}") from None
    sessions: list[dict[str, Any]] = _check(response, "listing sessions")["sessions"]
    return sessions
