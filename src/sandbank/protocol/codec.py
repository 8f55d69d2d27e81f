"""The code-execution protocol's JSON and the sandbox's types, both ways, in one place.

Requests are typed models: strict on known fields, lenient on new ones (unknown fields are
ignored, as the contract grows additively); a known field missing or mistyped is `Unprocessable`
(422) naming the field. Responses are built and read here too, so the routes, the remote and
fleet clients and `sandbank exec` all speak one shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError

from ..egress.credentials import (
    Credential,
    CredentialError,
    CredentialInfo,
    parse_credential,
    parse_credentials,
)
from ..egress.policy import NetworkPolicy, PolicyError
from ..errors import ProtocolError, UnknownTool, Unprocessable
from ..media import media_type
from .calls import (
    EDITOR_COMMANDS,
    BashCall,
    Bundle,
    CellError,
    EditorCall,
    ExecResult,
    PythonCall,
    ToolCall,
)
from .sessions import FileEntry, SessionInfo, SessionSpec

# The protocol's tool kinds and the result block type of each.
RESULT_TYPES = {
    "code_execution": "code_execution_tool_result",
    "bash_code_execution": "bash_code_execution_tool_result",
    "text_editor_code_execution": "text_editor_code_execution_tool_result",
}
MAX_NETWORK_ENTRIES = 100


# --- field types: each validator's message completes "<field> ..." ---------------------------
def _integer(value: Any) -> int:
    """An integer in JSON Schema's sense: 3 and 3.0 are, 3.5 and true are not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("must be an integer")
    return int(value)


def _positive(value: Any) -> int:
    try:
        number = _integer(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError("must be an integer >= 1")
    return number


def _text(value: Any) -> str:
    """Strings go to a sandbox as UTF-8: lone surrogates ("\\ud800") are not text."""
    if not isinstance(value, str):
        raise ValueError("must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "contains a lone surrogate (an escape such as \\ud800 that encodes no character): "
            "it must be valid Unicode text"
        ) from None
    return value


def _non_empty(value: Any) -> str:
    text = _text(value)
    if not text:
        raise ValueError("must not be empty")
    return text


def _command(value: Any) -> str:
    if _text(value) not in EDITOR_COMMANDS:
        raise ValueError(f"must be one of {', '.join(EDITOR_COMMANDS)}")
    return str(value)


def _view_range(value: Any) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("must be a list of two integers")
    first, last = (_integer(n) for n in value)
    return first, last


def _network(value: Any) -> NetworkPolicy:
    """CreateSession's `network` hint (an addition): `"none"` or `{"allow": ["HOST:PORT"]}`."""
    if value == "none":
        return NetworkPolicy()
    allow = value.get("allow") if isinstance(value, dict) else None
    if not isinstance(allow, list) or not all(isinstance(x, str) and len(x) < 300 for x in allow):
        raise ValueError('must be "none" or {"allow": ["HOST:PORT", ...]}')
    if len(allow) > MAX_NETWORK_ENTRIES:
        raise ValueError(f".allow has more than {MAX_NETWORK_ENTRIES} entries")
    try:
        return NetworkPolicy.parse(allow)
    except PolicyError as e:
        raise ValueError(f".allow: {e}") from None


def _credentials(value: Any) -> tuple[Credential, ...]:
    """CreateSession's `credentials` (an addition): what the egress proxy adds to requests."""
    try:
        return parse_credentials(value, "session", where="", accept_id=True)
    except CredentialError as e:
        raise ValueError(str(e).removeprefix(" ")) from None


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be an object")
    return value


def _labels(value: Any) -> dict[str, str]:
    from .additions import MAX_LABEL_CHARS, MAX_LABELS, strings

    try:
        return strings(value, "", MAX_LABELS, MAX_LABEL_CHARS)
    except Unprocessable as e:
        raise ValueError(e.message.strip()) from None


def _envs(value: Any) -> dict[str, str]:
    from .additions import MAX_ENV_CHARS, MAX_ENVS, strings

    try:
        return strings(value, "", MAX_ENVS, MAX_ENV_CHARS)
    except Unprocessable as e:
        raise ValueError(e.message.strip()) from None


Integer = Annotated[int, PlainValidator(_integer)]
PositiveInt = Annotated[int, PlainValidator(_positive)]
Text = Annotated[str, PlainValidator(_text)]
NonEmpty = Annotated[str, PlainValidator(_non_empty)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class CreateSessionBody(_Body):
    """CreateSession's body."""

    image: Text | None = None  # a hint: one runtime image serves every session
    idle_timeout_seconds: PositiveInt | None = None
    max_lifetime_seconds: PositiveInt | None = None
    network: Annotated[NetworkPolicy, PlainValidator(_network)] | None = None
    labels: Annotated[dict[str, str], PlainValidator(_labels)] | None = None  # an addition
    envs: Annotated[dict[str, str], PlainValidator(_envs)] | None = None  # an addition
    # an addition: a credential's values go to the egress proxy, never to the sandbox
    credentials: Annotated[tuple[Credential, ...], PlainValidator(_credentials)] | None = None
    isolation: Literal["fork", "bwrap", "gvisor", "none"] | None = None  # an addition


class ExecBody(_Body):
    """Execute's body; `input` is checked against its tool's model."""

    tool: NonEmpty
    input: Annotated[dict[str, Any], PlainValidator(_object)]
    timeout_seconds: PositiveInt | None = None
    tool_use_id: Text | None = None


class PythonInput(_Body):
    """The input of `code_execution` (context, envs, notebook: additions)."""

    code: NonEmpty
    context: Text | None = None
    envs: Annotated[dict[str, str], PlainValidator(_envs)] | None = None
    notebook: bool = False


class BashInput(_Body):
    """The input of `bash_code_execution`."""

    command: NonEmpty


class EditorInput(_Body):
    """The input of `text_editor_code_execution` (what each command needs: `EDITOR_NEEDS`)."""

    command: Annotated[str, PlainValidator(_command)]
    path: NonEmpty
    file_text: Text | None = None
    old_str: Text | None = None
    new_str: Text | None = None
    insert_line: Integer | None = None
    view_range: Annotated[tuple[int, int], PlainValidator(_view_range)] | None = None


# What each command needs beyond `command` and `path`: (field, may it be empty).
EDITOR_NEEDS: dict[str, tuple[tuple[str, bool], ...]] = {
    "create": (("file_text", True),),
    "str_replace": (("old_str", False), ("new_str", True)),
    "insert": (("insert_line", True), ("new_str", True)),
}


def _validated(model: type[_Body], data: Any, where: str = "") -> Any:
    """`model` from `data`, or `Unprocessable` naming the first field that is wrong."""
    if not isinstance(data, dict):
        what = where.rstrip(".") or "the request body"
        raise Unprocessable(f"{what} must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        field = where + ".".join(str(part) for part in error["loc"])
        if error["type"] == "missing":
            raise Unprocessable(f"{field} is required") from None
        cause = str(error.get("ctx", {}).get("error") or error["msg"])
        # A message about a part of the field (".allow: ...", "[0].x ...") names that part.
        joined = "" if cause.startswith((".", "[", ":")) else " "
        raise Unprocessable(f"{field}{joined}{cause}") from None


# --- requests ----------------------------------------------------------------------------------
def parse_create(body: Any) -> SessionSpec:
    """CreateSession's body (`{}` or none at all) as a session spec."""
    if body is None:
        return SessionSpec()
    parsed: CreateSessionBody = _validated(CreateSessionBody, body)
    return SessionSpec(
        idle_timeout=parsed.idle_timeout_seconds,
        max_lifetime=parsed.max_lifetime_seconds,
        network=parsed.network,
        labels=parsed.labels or {},
        envs=parsed.envs or {},
        credentials=parsed.credentials or (),
        isolation=parsed.isolation,
    )


def parse_credential_body(body: Any) -> Credential:
    """A credential a tenant or user stores (`POST /credentials`); ids are the server's."""
    try:
        return parse_credential(body, "tenant")
    except CredentialError as e:
        raise Unprocessable(str(e)) from None


def parse_credential_list(body: Any) -> tuple[Credential, ...]:
    """`{"credentials": [...]}`: a session's credentials, replacing its own."""
    if not isinstance(body, dict):
        raise Unprocessable("the request body must be a JSON object")
    try:
        return parse_credentials(body.get("credentials"), "session", accept_id=True)
    except CredentialError as e:
        raise Unprocessable(str(e)) from None


def encode_credentials(found: list[CredentialInfo]) -> dict[str, Any]:
    return {"credentials": [c.to_json() for c in found]}


def decode_credentials(body: Any) -> list[CredentialInfo]:
    with malformed("the credentials listing"):
        return [CredentialInfo.from_json(c) for c in body["credentials"]]


class ExecRequest:
    """A parsed Execute: the tool kind, its call, timeout and correlation id."""

    def __init__(self, tool: str, call: ToolCall, timeout: int | None, tool_use_id: str | None):
        self.tool = tool
        self.call = call
        self.timeout = timeout
        self.tool_use_id = tool_use_id


def parse_exec(body: Any) -> ExecRequest:
    parsed: ExecBody = _validated(ExecBody, body)
    if parsed.tool not in RESULT_TYPES:
        runs = ", ".join(sorted(RESULT_TYPES))
        raise UnknownTool(f"unknown tool kind {parsed.tool!r}; this backend runs {runs}")
    call = tool_call(parsed.tool, parsed.input, "input.")
    return ExecRequest(parsed.tool, call, parsed.timeout_seconds, parsed.tool_use_id)


def tool_call(tool: str, data: Mapping[str, Any], where: str = "") -> ToolCall:
    """One tool's input as a call; `Unprocessable` naming the field (prefixed by `where`)."""
    if tool == "code_execution":
        py: PythonInput = _validated(PythonInput, dict(data), where)
        return PythonCall(py.code, py.context, py.envs, py.notebook)
    if tool == "bash_code_execution":
        return BashCall(_validated(BashInput, dict(data), where).command)
    edit: EditorInput = _validated(EditorInput, dict(data), where)
    for name, may_be_empty in EDITOR_NEEDS.get(edit.command, ()):
        value = getattr(edit, name)
        if value is None:
            raise Unprocessable(f"{where}{name} is required for the command {edit.command}")
        if value == "" and not may_be_empty:
            raise Unprocessable(f"{where}{name} must not be empty")
    return EditorCall(
        command=edit.command,  # type: ignore[arg-type]
        path=edit.path,
        file_text=edit.file_text,
        old_str=edit.old_str,
        new_str=edit.new_str,
        insert_line=edit.insert_line,
        view_range=edit.view_range,
    )


def encode_call(call: ToolCall, timeout_s: float | None) -> dict[str, Any]:
    """A call in the protocol's shape (`POST /sessions/{id}/exec`), for clients; no timeout:
    the server's default."""
    body: dict[str, Any]
    if isinstance(call, PythonCall):
        py: dict[str, Any] = {"code": call.code}
        if call.context is not None:
            py["context"] = call.context
        if call.envs:
            py["envs"] = dict(call.envs)
        if call.notebook:
            py["notebook"] = True
        body = {"tool": "code_execution", "input": py}
    elif isinstance(call, BashCall):
        body = {"tool": "bash_code_execution", "input": {"command": call.command}}
    else:
        body = {"tool": "text_editor_code_execution", "input": encode_edit(call)}
    if timeout_s is not None:
        body["timeout_seconds"] = max(1, round(timeout_s))
    return body


def encode_edit(call: EditorCall) -> dict[str, Any]:
    """An editor call as JSON: its command, its path and the fields it sets (the protocol's
    `input`, and a worker's edit request)."""
    edit: dict[str, Any] = {"command": call.command, "path": call.path}
    for key in ("file_text", "old_str", "new_str", "insert_line"):
        value = getattr(call, key)
        if value is not None:
            edit[key] = value
    if call.view_range is not None:
        edit["view_range"] = list(call.view_range)
    return edit


def encode_create(spec: SessionSpec) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if spec.idle_timeout is not None:
        body["idle_timeout_seconds"] = spec.idle_timeout
    if spec.max_lifetime is not None:
        body["max_lifetime_seconds"] = spec.max_lifetime
    if spec.network is not None:
        body["network"] = network_hint(spec.network)
    if spec.labels:
        body["labels"] = dict(spec.labels)
    if spec.envs:
        body["envs"] = dict(spec.envs)
    if spec.credentials:  # their values: to the server that runs the sandbox, nowhere else
        body["credentials"] = [c.to_request() for c in spec.credentials]
    if spec.isolation is not None:
        body["isolation"] = spec.isolation
    return body


# --- responses ---------------------------------------------------------------------------------
def network_hint(policy: NetworkPolicy) -> str | dict[str, list[str]]:
    """A network policy in the form of CreateSession's hint (an addition)."""
    return "none" if policy.is_none else {"allow": policy.entries()}


def encode_handle(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.id,
        "idle_timeout_seconds": info.idle_timeout,
        "max_lifetime_seconds": info.max_lifetime,
        "created_at": info.created_at,
        "last_activity_at": info.last_activity_at,
        "network": network_hint(info.network),
        "labels": dict(info.labels),
        "credentials": [c.to_json() for c in info.credentials],
        "state": info.state,
        "isolation": info.isolation,
    }


def decode_handle(body: Any) -> SessionInfo:
    with malformed("CreateSession"):
        network = body.get("network")
        return SessionInfo(
            id=str(body["session_id"]),
            idle_timeout=int(body.get("idle_timeout_seconds") or 0),
            max_lifetime=int(body.get("max_lifetime_seconds") or 0),
            created_at=float(body.get("created_at") or 0.0),
            last_activity_at=float(body.get("last_activity_at") or 0.0),
            network=_network(network) if network is not None else NetworkPolicy(),
            labels={str(k): str(v) for k, v in (body.get("labels") or {}).items()},
            credentials=tuple(CredentialInfo.from_json(c) for c in body.get("credentials") or ()),
            state=str(body.get("state") or "running"),
            isolation=str(body.get("isolation") or ""),
        )


def encode_result(tool: str, tool_use_id: str, result: ExecResult) -> dict[str, Any]:
    content: dict[str, Any] = {
        "type": "code_execution_result",
        "stdout": result.stdout,
        "stderr": result.stderr,
        "return_code": result.return_code,
        "content": [
            {"type": "code_execution_output", "file_id": f, "filename": f} for f in result.files
        ],
    }
    if result.displays:
        content["display_outputs"] = result.displays
    if result.main is not None:
        content["main"] = result.main
    if result.error is not None:
        e = result.error
        content["error"] = {"name": e.name, "value": e.value, "traceback": e.traceback}
    if result.execution_count:
        content["execution_count"] = result.execution_count
    if result.not_restored:
        content["not_restored"] = dict(result.not_restored)
    return {
        "tool_use_id": tool_use_id,
        "execution_time_ms": result.duration_ms,
        "result_block": {
            "type": RESULT_TYPES[tool],
            "tool_use_id": tool_use_id,
            "content": content,
        },
    }


def decode_result(body: Any, duration_ms: int = 0) -> ExecResult:
    with malformed("Execute"):
        content = body["result_block"]["content"]
        displays = content.get("display_outputs") or []
        main, error = content.get("main"), content.get("error")
        return ExecResult(
            stdout=str(content.get("stdout") or ""),
            stderr=str(content.get("stderr") or ""),
            return_code=int(content.get("return_code") or 0),
            files=[str(f.get("filename") or f.get("file_id")) for f in content.get("content", [])],
            duration_ms=int(body.get("execution_time_ms") or duration_ms),
            displays=[decode_bundle(b) for b in displays],
            main=decode_bundle(main) if main is not None else None,
            error=decode_cell_error(error),
            execution_count=int(content.get("execution_count") or 0),
            not_restored={str(k): str(v) for k, v in (content.get("not_restored") or {}).items()},
        )


def decode_bundle(value: Any) -> Bundle:
    """A display bundle kept to its shape: {"data": {str: str}, "cut": [str]}."""
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, dict):
        raise TypeError("not a display bundle")
    bundle: Bundle = {"data": {text(k): text(v) for k, v in data.items()}}
    cut = value.get("cut")
    if isinstance(cut, list):
        bundle["cut"] = [text(c) for c in cut]
    return bundle


def decode_cell_error(value: Any) -> CellError | None:
    """A notebook call's exception as both the protocol and a worker send it: {"name", "value",
    "traceback"}; None for none."""
    if value is None:
        return None
    return CellError(text(value["name"]), text(value["value"]), text(value["traceback"]))


def text(value: Any) -> str:
    """Text from a peer, with anything that cannot be UTF-8 (lone surrogates) replaced."""
    if not isinstance(value, str):
        raise TypeError("not text")
    return value.encode("utf-8", "replace").decode("utf-8")


def encode_listing(entries: list[FileEntry], truncated: bool) -> dict[str, Any]:
    files: list[dict[str, Any]] = []
    for e in entries:
        item: dict[str, Any] = {
            "path": e.path,
            "size_bytes": e.size_bytes,
            "mime_type": None if e.is_dir else media_type(e.path),
            "modified_at": e.modified_at,
        }
        if e.is_dir:
            item["is_dir"] = True
        files.append(item)
    return {"files": files, "truncated": truncated}


def decode_listing(body: Any) -> tuple[list[FileEntry], bool]:
    with malformed("ListFiles"):
        entries = [
            FileEntry(
                path=str(item["path"]),
                size_bytes=int(item["size_bytes"]),
                modified_at=float(item["modified_at"]),
                is_dir=bool(item.get("is_dir")),
            )
            for item in body.get("files", [])
        ]
        return entries, bool(body.get("truncated"))


def encode_file(entry: FileEntry) -> dict[str, Any]:
    return {"path": entry.path, "size_bytes": entry.size_bytes}


def decode_file(body: Any) -> FileEntry:
    with malformed("PutFile"):
        return FileEntry(str(body["path"]), int(body["size_bytes"]), 0.0)


@contextlib.contextmanager
def malformed(operation: str) -> Iterator[None]:
    """A reply missing or mistyping what the protocol promises is a `ProtocolError`."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"the sandbox backend sent a malformed {operation} reply") from e
