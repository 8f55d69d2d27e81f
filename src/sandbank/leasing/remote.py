"""Sandboxes from any code-execution API at `sandbox_url` (this server's included), over httpx."""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from sandbank.config import Settings
from sandbank.errors import (
    AtCapacity,
    PayloadTooLarge,
    ProtocolError,
    SandboxError,
    SessionNotFound,
)
from sandbank.leasing.base import MAX_WALK_ENTRIES, FileEntry, visible
from sandbank.sandbox.base import BashCall, EditorCall, ExecResult, PythonCall, ToolCall

log = logging.getLogger(__name__)
# The backend answers a call at its deadline; this much more covers the trip and its restart.
HTTP_SLACK_S = 15.0
CONNECT_TIMEOUT_S = 10.0


def to_request(call: ToolCall, timeout_s: float) -> dict[str, Any]:
    """A call in the protocol's shape (`POST /sessions/{id}/exec`)."""
    timeout = max(1, round(timeout_s))
    if isinstance(call, PythonCall):
        return {"tool": "code_execution", "input": {"code": call.code}, "timeout_seconds": timeout}
    if isinstance(call, BashCall):
        return {
            "tool": "bash_code_execution",
            "input": {"command": call.command},
            "timeout_seconds": timeout,
        }
    assert isinstance(call, EditorCall)
    inp: dict[str, Any] = {"command": call.command, "path": call.path}
    for key in ("file_text", "old_str", "new_str", "insert_line"):
        value = getattr(call, key)
        if value is not None:
            inp[key] = value
    if call.view_range is not None:
        inp["view_range"] = list(call.view_range)
    return {"tool": "text_editor_code_execution", "input": inp, "timeout_seconds": timeout}


def from_response(body: Any, duration_ms: int) -> ExecResult:
    try:
        content = body["result_block"]["content"]
        return ExecResult(
            stdout=str(content.get("stdout") or ""),
            stderr=str(content.get("stderr") or ""),
            return_code=int(content.get("return_code") or 0),
            files=[str(f.get("filename") or f.get("file_id")) for f in content.get("content", [])],
            duration_ms=int(body.get("execution_time_ms") or duration_ms),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError("the sandbox backend sent a malformed exec result") from e


@contextlib.contextmanager
def _malformed(operation: str) -> Iterator[None]:
    """A reply missing or mistyping what the protocol promises is a `ProtocolError`."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"the sandbox backend sent a malformed {operation} reply") from e


class RemoteSandboxes:
    """A client of the code-execution protocol. `owner` is not sent: the token is the tenant."""

    def __init__(
        self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        token = settings.sandbox_token.get_secret_value()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = settings.sandbox_url.rstrip("/")
        self.put_max = settings.put_file_max_bytes
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(
                settings.exec_timeout_max + HTTP_SLACK_S, connect=CONNECT_TIMEOUT_S
            ),
        )

    async def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.client.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            raise SandboxError(
                f"the sandbox backend at {self.base_url} failed: {e.__class__.__name__}"
            ) from e
        _check(response)
        return response

    async def start(self) -> None:
        """Probe the optional file routes this client needs, on a fresh session."""
        sandbox_id = await self.create("")
        try:
            for route in (f"/sessions/{sandbox_id}/files/list", f"/sessions/{sandbox_id}/files"):
                try:
                    response = await self.client.get(route, params={"path": "."})
                except httpx.HTTPError as e:
                    raise SandboxError(f"the sandbox backend failed: {e!r}") from e
                # GetFile on the workspace directory answers 400 (a directory): served.
                if response.status_code in (404, 405, 501):
                    raise SandboxError(
                        f"the sandbox backend at {self.base_url} does not serve {route} "
                        f"(HTTP {response.status_code}); the interpreter needs its optional "
                        "file operations (ListFiles, GetFile, PutFile)"
                    )
        finally:
            await self.destroy(sandbox_id, "")
        log.info("sandbox backend %s serves the file operations", self.base_url)

    async def close(self) -> None:
        await self.client.aclose()

    async def create(self, owner: str) -> str:
        response = await self._request("POST", "/sessions", json={})
        with _malformed("CreateSession"):
            return str(response.json()["session_id"])

    async def exists(self, sandbox_id: str, owner: str) -> bool:
        try:
            await self._request("GET", f"/sessions/{sandbox_id}/files/list")
        except SessionNotFound:
            return False
        return True

    async def execute(
        self, sandbox_id: str, owner: str, call: ToolCall, timeout_s: float
    ) -> ExecResult:
        started = time.monotonic()
        response = await self._request(
            "POST", f"/sessions/{sandbox_id}/exec", json=to_request(call, timeout_s)
        )
        with _malformed("Execute"):
            body = response.json()
        return from_response(body, round((time.monotonic() - started) * 1000))

    async def destroy(self, sandbox_id: str, owner: str) -> None:
        with contextlib.suppress(SessionNotFound):
            await self._request("DELETE", f"/sessions/{sandbox_id}")

    async def list_files(self, sandbox_id: str, owner: str) -> list[FileEntry]:
        found: list[FileEntry] = []
        pending = ["."]
        while pending and len(found) < MAX_WALK_ENTRIES:
            directory = pending.pop()
            response = await self._request(
                "GET", f"/sessions/{sandbox_id}/files/list", params={"path": directory}
            )
            with _malformed("ListFiles"):
                for item in response.json().get("files", []):
                    path = str(item["path"])
                    if not visible(path):
                        continue
                    if item.get("is_dir"):
                        pending.append(path)
                    else:
                        found.append(
                            FileEntry(path, int(item["size_bytes"]), float(item["modified_at"]))
                        )
        return found

    async def read_file(
        self, sandbox_id: str, owner: str, path: str, dest: BinaryIO, max_bytes: int
    ) -> int:
        url = f"/sessions/{sandbox_id}/files"
        try:
            async with self.client.stream("GET", url, params={"path": path}) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _check(response)
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise PayloadTooLarge(f"{path!r} is larger than {max_bytes} bytes")
                    dest.write(chunk)
                return size
        except httpx.HTTPError as e:
            raise SandboxError(f"the sandbox backend failed: {e.__class__.__name__}") from e

    async def put_file(
        self, sandbox_id: str, owner: str, path: str, source: Path, read_only: bool
    ) -> None:
        with source.open("rb") as f:
            await self._request(
                "POST",
                f"/sessions/{sandbox_id}/files",
                data={"path": path},
                files={"file": (Path(path).name, f, "application/octet-stream")},
            )
        if read_only:
            # The protocol has no modes: the best a remote backend allows. The store keeps the
            # user's upload whatever the code does, since run outputs never replace uploads.
            await self.execute(sandbox_id, owner, BashCall(f"chmod 0444 {shlex.quote(path)}"), 30)


def _check(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = str(response.json().get("detail") or response.text)
    except ValueError:
        detail = response.text[:500]
    if response.status_code == 404:
        raise SessionNotFound(f"the sandbox backend has no such session: {detail}")
    if response.status_code == 503:
        retry = response.headers.get("retry-after", "5")
        raise AtCapacity(
            f"the sandbox backend is at capacity: {detail}",
            retry_after=int(retry) if retry.isdigit() else 5,
        )
    if response.status_code == 413:
        raise PayloadTooLarge(f"the sandbox backend refused a file: {detail}")
    raise SandboxError(f"the sandbox backend answered {response.status_code}: {detail}")
