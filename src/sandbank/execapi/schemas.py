"""Requests of the code-execution protocol: strict on known fields, lenient on new ones.

Unknown fields anywhere are ignored (the contract grows additively); known fields that are
missing or of the wrong type are a 422 whose message names the field.
"""

from __future__ import annotations

from typing import Any

from ..egress.policy import NetworkPolicy, PolicyError
from ..errors import UnknownTool, Unprocessable
from ..sandbox.base import BashCall, EditorCall, PythonCall, ToolCall

RESULT_TYPES = {
    "code_execution": "code_execution_tool_result",
    "bash_code_execution": "bash_code_execution_tool_result",
    "text_editor_code_execution": "text_editor_code_execution_tool_result",
}
EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")


def _is_int(value: Any) -> bool:
    """An integer in JSON Schema's sense: 3 and 3.0 are, 3.5 and true are not."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def optional_positive_int(body: dict[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise Unprocessable(f"{where}{key} must be an integer >= 1")
    return int(value)


def _text(value: str, key: str, where: str) -> str:
    """Strings go to a sandbox as UTF-8: lone surrogates ("\\ud800") are not text."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Unprocessable(
            f"{where}{key} contains a lone surrogate (an escape such as \\ud800 that encodes "
            "no character): it must be valid Unicode text"
        ) from None
    return value


def optional_str(body: dict[str, Any], key: str, where: str = "") -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Unprocessable(f"{where}{key} must be a string")
    return _text(value, key, where)


def required_str(body: dict[str, Any], key: str, where: str, non_empty: bool = True) -> str:
    if key not in body or body[key] is None:
        raise Unprocessable(f"{where}{key} is required")
    value = body[key]
    if not isinstance(value, str):
        raise Unprocessable(f"{where}{key} must be a string")
    if non_empty and not value:
        raise Unprocessable(f"{where}{key} must not be empty")
    return _text(value, key, where)


def parse_create(body: Any) -> tuple[int | None, int | None]:
    if body is None:
        return None, None
    if not isinstance(body, dict):
        raise Unprocessable("the request body must be a JSON object")
    optional_str(body, "image")  # a hint: one runtime image serves every session
    return (
        optional_positive_int(body, "idle_timeout_seconds"),
        optional_positive_int(body, "max_lifetime_seconds"),
    )


MAX_NETWORK_ENTRIES = 100


def parse_network(body: Any) -> NetworkPolicy | None:
    """CreateSession's `network` hint (an addition): None when absent, the operator's default.

    `"none"`, or `{"allow": ["HOST:PORT", ...]}`; the runtime clamps it to the operator's ceiling.
    """
    value = body.get("network") if isinstance(body, dict) else None
    if value is None:
        return None
    if value == "none":
        return NetworkPolicy()
    allow = value.get("allow") if isinstance(value, dict) else None
    if not isinstance(allow, list) or not all(isinstance(x, str) and len(x) < 300 for x in allow):
        raise Unprocessable('network must be "none" or {"allow": ["HOST:PORT", ...]}')
    if len(allow) > MAX_NETWORK_ENTRIES:
        raise Unprocessable(f"network.allow has more than {MAX_NETWORK_ENTRIES} entries")
    try:
        return NetworkPolicy.parse(allow)
    except PolicyError as e:
        raise Unprocessable(f"network.allow: {e}") from None


class ExecRequest:
    """A parsed Execute: the tool kind, its call, timeout and correlation id."""

    def __init__(self, tool: str, call: ToolCall, timeout: int | None, tool_use_id: str | None):
        self.tool = tool
        self.call = call
        self.timeout = timeout
        self.tool_use_id = tool_use_id


def parse_exec(body: Any) -> ExecRequest:
    if not isinstance(body, dict):
        raise Unprocessable("the request body must be a JSON object")
    tool = required_str(body, "tool", "")
    if tool not in RESULT_TYPES:
        raise UnknownTool(
            f"unknown tool kind {tool!r}; this backend runs {', '.join(sorted(RESULT_TYPES))}"
        )
    timeout = optional_positive_int(body, "timeout_seconds")
    tool_use_id = optional_str(body, "tool_use_id")
    inp = body.get("input")
    if inp is None:
        raise Unprocessable("input is required")
    if not isinstance(inp, dict):
        raise Unprocessable("input must be an object")
    return ExecRequest(tool, _parse_input(tool, inp), timeout, tool_use_id)


def _parse_input(tool: str, inp: dict[str, Any]) -> ToolCall:
    if tool == "code_execution":
        return PythonCall(required_str(inp, "code", "input."))
    if tool == "bash_code_execution":
        return BashCall(required_str(inp, "command", "input."))
    command = required_str(inp, "command", "input.")
    if command not in EDITOR_COMMANDS:
        raise Unprocessable(f"input.command must be one of {', '.join(EDITOR_COMMANDS)}")
    path = required_str(inp, "path", "input.")
    where = f"input (command {command}): "
    file_text = old_str = new_str = None
    insert_line = None
    if command == "create":
        file_text = required_str(inp, "file_text", where, non_empty=False)
    elif command == "str_replace":
        old_str = required_str(inp, "old_str", where)
        new_str = required_str(inp, "new_str", where, non_empty=False)
    elif command == "insert":
        value = inp.get("insert_line")
        if value is None:
            raise Unprocessable(f"{where}insert_line is required")
        if not _is_int(value):
            raise Unprocessable(f"{where}insert_line must be an integer")
        insert_line = int(value)
        new_str = required_str(inp, "new_str", where, non_empty=False)
    view_range = None
    raw = inp.get("view_range")
    if raw is not None:
        if not (isinstance(raw, list) and len(raw) == 2 and all(_is_int(n) for n in raw)):
            raise Unprocessable("input.view_range must be a list of two integers")
        view_range = (int(raw[0]), int(raw[1]))
    return EditorCall(
        command=command,  # type: ignore[arg-type]
        path=path,
        file_text=file_text,
        old_str=old_str,
        new_str=new_str,
        insert_line=insert_line,
        view_range=view_range,
    )
