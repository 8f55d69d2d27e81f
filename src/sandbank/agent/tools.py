"""The tools offered to the model, how their arguments become sandbox calls, and results text."""

from __future__ import annotations

from typing import Any

from sandbank.agent.model import ToolCallRequest, ToolSpec
from sandbank.protocol.calls import BashCall, EditorCall, ExecResult, PythonCall, ToolCall

PYTHON_TOOL = "code_execution"
BASH_TOOL = "bash"
EDITOR_TOOL = "str_replace_based_edit_tool"

EDITOR_COMMANDS = ("view", "create", "str_replace", "insert")


def _arguments(
    optional: dict[str, dict[str, Any]] | None = None, **required: dict[str, Any]
) -> dict[str, Any]:
    """A tool's JSON schema: an object of these properties (the keyword ones required), and
    no others."""
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


TOOL_SPECS: list[ToolSpec] = [
    ToolSpec(
        name=PYTHON_TOOL,
        description=(
            "Run Python code in the session's persistent interpreter (variables and imports "
            "survive between calls; the working directory is /workspace). You see what it "
            "prints, errors, and the names of files it produced. Open matplotlib figures are "
            "saved as PNG files automatically."
        ),
        parameters=_arguments(code={"type": "string", "description": "Python code to run."}),
    ),
    ToolSpec(
        name=BASH_TOOL,
        description="Run a bash command in /workspace. There is no internet access.",
        parameters=_arguments(command={"type": "string", "description": "The command."}),
    ),
    ToolSpec(
        name=EDITOR_TOOL,
        description=(
            "View, create and edit text files. `view` shows a file with line numbers (or lists "
            "a directory); `create` writes `file_text`; `str_replace` replaces the one exact "
            "occurrence of `old_str` with `new_str`; `insert` puts `new_str` after line "
            "`insert_line` (0 = top)."
        ),
        parameters=_arguments(
            command={"type": "string", "enum": list(EDITOR_COMMANDS)},
            path={"type": "string", "description": "File path, e.g. /workspace/a.py."},
            optional={
                "file_text": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
                "insert_line": {"type": "integer", "minimum": 0},
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "[first, last] line to show; last -1 means to the end.",
                },
            },
        ),
    ),
]


class ToolArgumentError(ValueError):
    """The model's call cannot be run as asked; the message is shown to the model."""


def _optional(arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ToolArgumentError(f"argument `{name}` must be a string, got {type(value).__name__}")


def _required(arguments: dict[str, Any], name: str) -> str:
    value = _optional(arguments, name)
    if value is None:
        raise ToolArgumentError(f"missing required argument `{name}` (a string)")
    return value


def _editor_call(arguments: dict[str, Any]) -> EditorCall:
    command = _required(arguments, "command")
    if command not in EDITOR_COMMANDS:
        raise ToolArgumentError(f"`command` must be one of {', '.join(EDITOR_COMMANDS)}")
    path = _required(arguments, "path")
    if not path.strip():
        raise ToolArgumentError("`path` must not be empty")
    if command == "view":
        view_range = arguments.get("view_range")
        if view_range is None:
            return EditorCall(command="view", path=path)
        if (
            not isinstance(view_range, list)
            or len(view_range) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in view_range)
        ):
            raise ToolArgumentError("`view_range` must be a list of two integers [first, last]")
        return EditorCall(command="view", path=path, view_range=(view_range[0], view_range[1]))
    if command == "create":
        return EditorCall(command="create", path=path, file_text=_required(arguments, "file_text"))
    if command == "str_replace":
        old = _required(arguments, "old_str")
        new = _optional(arguments, "new_str")
        return EditorCall(command="str_replace", path=path, old_str=old, new_str=new or "")
    # insert: Anthropic's older editor spelled the text `new_str`, some models send `insert_text`
    line = arguments.get("insert_line")
    if not isinstance(line, int) or isinstance(line, bool) or line < 0:
        raise ToolArgumentError("`insert_line` must be a non-negative integer")
    text = _optional(arguments, "new_str")
    if text is None:
        text = _optional(arguments, "insert_text")
    if text is None:
        raise ToolArgumentError("missing required argument `new_str` (the text to insert)")
    return EditorCall(command="insert", path=path, insert_line=line, new_str=text)


def to_sandbox_call(request: ToolCallRequest) -> ToolCall:
    """Map a model's tool call to the runtime's vocabulary, or raise `ToolArgumentError`."""
    if request.parse_error is not None:
        raise ToolArgumentError(f"the arguments were not a JSON object: {request.parse_error}")
    arguments = request.arguments
    if request.name == PYTHON_TOOL:
        return PythonCall(code=_required(arguments, "code"))
    if request.name == BASH_TOOL:
        return BashCall(command=_required(arguments, "command"))
    if request.name == EDITOR_TOOL:
        return _editor_call(arguments)
    names = ", ".join(spec.name for spec in TOOL_SPECS)
    raise ToolArgumentError(f"there is no tool named `{request.name}`; the tools are {names}")


def clip(text: str, limit: int) -> str:
    """Cut `text` to about `limit` characters, keeping its head and tail, and say so."""
    if len(text) <= limit:
        return text
    head = max(limit * 2 // 3, 0)
    tail = max(limit - head, 0)
    cut = len(text) - head - tail
    marker = f"\n[... {cut} characters cut: the output was {len(text)} characters ...]\n"
    return text[:head] + marker + (text[-tail:] if tail else "")


def result_text(result: ExecResult, budget: int) -> str:
    """What the model sees of a result: stdout, stderr, a non-zero return code, new files."""
    stdout, stderr = result.stdout, result.stderr
    if len(stdout) + len(stderr) > budget:
        # Share the budget, but let a short stream keep all of it and give the rest away.
        half = budget // 2
        if len(stderr) <= half:
            stdout = clip(stdout, budget - len(stderr))
        elif len(stdout) <= half:
            stderr = clip(stderr, budget - len(stdout))
        else:
            stdout, stderr = clip(stdout, half), clip(stderr, half)
    parts: list[str] = []
    if stdout:
        parts.append(f"stdout:\n{stdout.rstrip()}")
    if stderr:
        parts.append(f"stderr:\n{stderr.rstrip()}")
    if result.return_code != 0:
        parts.append(f"return code: {result.return_code}")
    if result.files:
        parts.append("files produced: " + ", ".join(result.files))
    if result.displays:
        shown = [compact_display(b, budget // (4 * len(result.displays)) + 200)
                 for b in result.displays]  # fmt: skip
        parts.append("displayed:\n" + "\n".join(shown))
    return "\n".join(parts) if parts else "(no output)"


def compact_display(bundle: dict[str, Any], limit: int) -> str:
    """What the model is shown of a display: its Markdown or plain text; an image by kind."""
    data = bundle.get("data") or {}
    for media in ("text/markdown", "text/plain"):
        if media in data and not (media == "text/plain" and _is_image_only(data)):
            return clip(str(data[media]), limit)
    kinds = ", ".join(sorted(m for m in data if m.startswith("image/")))
    return f"[an image ({kinds}), shown to the user]"


def _is_image_only(data: dict[str, Any]) -> bool:
    return any(m.startswith("image/") for m in data) and str(data.get("text/plain", "")).startswith(
        "<Figure"
    )
