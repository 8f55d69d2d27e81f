"""The MCP tools as a model reads them: names, descriptions, input schemas, hints.

Schemas are written by hand for a model to read; the door validates every argument itself (the
low-level MCP server does not), with the code-execution API's own models where there are some.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from ..protocol.calls import EDITOR_COMMANDS

SESSION_ID: dict[str, Any] = {
    "type": "string",
    "description": (
        "The handle start_session returned. Omit it to work in your default session, which "
        "is made on first use and kept while you use it."
    ),
}
TIMEOUT: dict[str, Any] = {
    "type": "integer",
    "minimum": 1,
    "description": "Seconds the call may run before it is interrupted (the server caps it).",
}
PATH: dict[str, Any] = {
    "type": "string",
    "description": "A path in the session's workspace (/workspace), relative or absolute.",
}


def _schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


def _tool(
    name: str,
    title: str,
    description: str,
    schema: dict[str, Any],
    *,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    output: dict[str, Any] | None = None,
) -> types.Tool:
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema,
        output_schema=output,
        annotations=types.ToolAnnotations(
            title=title,
            read_only_hint=read_only,
            destructive_hint=destructive,
            idempotent_hint=idempotent,
            open_world_hint=False,
        ),
    )


TOOLS: list[types.Tool] = [
    _tool(
        "run_python",
        "Run Python",
        "Run Python code in a persistent interpreter, like a notebook cell: variables, imports "
        "and open files stay for the next call in the same session. You see what the code "
        "prints, the value of a bare last expression, and the traceback of an exception. "
        "numpy, pandas, matplotlib, scipy, scikit-learn and seaborn are installed; figures "
        "left open (or passed to plt.show()) come back as images and are saved as "
        "figure_N.png; display(obj) shows tables and images. Files are in /workspace, the "
        "working directory. A failing program is reported as an error result with its "
        "traceback.",
        _schema(
            {
                "code": {"type": "string", "description": "The Python source to run."},
                "session_id": SESSION_ID,
                "timeout_seconds": TIMEOUT,
            },
            ["code"],
        ),
    ),
    _tool(
        "run_bash",
        "Run bash",
        "Run a bash command in a persistent shell: the working directory, exports and "
        "functions stay for the next call in the same session. You see stdout, stderr and "
        "the exit status; a non-zero status is an error result. Commands read no input. "
        "Files are in /workspace.",
        _schema(
            {
                "command": {"type": "string", "description": "The bash command to run."},
                "session_id": SESSION_ID,
                "timeout_seconds": TIMEOUT,
            },
            ["command"],
        ),
    ),
    _tool(
        "text_editor",
        "Edit a text file",
        "View, create and edit text files in the workspace. Commands: view (a file with line "
        "numbers, or a directory; view_range [first, last] limits the lines, -1 meaning the "
        "end), create (file_text), str_replace (old_str must occur exactly once; new_str "
        "replaces it), insert (new_str after line insert_line; 0 inserts at the top), "
        "undo_edit (reverts the last edit of the file).",
        _schema(
            {
                "command": {"type": "string", "enum": list(EDITOR_COMMANDS)},
                "path": PATH,
                "file_text": {"type": "string", "description": "create: the file's content."},
                "old_str": {"type": "string", "description": "str_replace: the text to find."},
                "new_str": {
                    "type": "string",
                    "description": "str_replace: the replacement; insert: the text to insert.",
                },
                "insert_line": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "insert: the line after which new_str goes.",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "view: [first, last] line, 1-based; last -1 is the end.",
                },
                "session_id": SESSION_ID,
            },
            ["command", "path"],
        ),
    ),
    _tool(
        "list_files",
        "List files",
        "List a directory of the session's workspace: each entry's path, size in bytes and "
        "modification time; directories end with '/'.",
        _schema(
            {
                "path": {**PATH, "description": "The directory (default: the workspace)."},
                "session_id": SESSION_ID,
            }
        ),
        read_only=True,
        idempotent=True,
    ),
    _tool(
        "read_file",
        "Read a file",
        "Read a file of the session's workspace: text as text, images as images, anything "
        "else as base64 data.",
        _schema({"path": PATH, "session_id": SESSION_ID}, ["path"]),
        read_only=True,
        idempotent=True,
    ),
    _tool(
        "write_file",
        "Write a file",
        "Write a file into the session's workspace, replacing one of that name; missing "
        "directories are made. Give text as content, or binary data base64-encoded with "
        'encoding "base64".',
        _schema(
            {
                "path": PATH,
                "content": {"type": "string", "description": "The file's content."},
                "encoding": {
                    "type": "string",
                    "enum": ["utf-8", "base64"],
                    "description": 'How content is written: "utf-8" (default) or "base64".',
                },
                "session_id": SESSION_ID,
            },
            ["path", "content"],
        ),
        idempotent=True,
    ),
    _tool(
        "start_session",
        "Start a session",
        "Start a new, isolated session (its own Python interpreter, shell and workspace) and "
        "return its handle, session_id. Pass the handle to the other tools to work in it; it "
        "ends when you call end_session or after it has been idle for a while.",
        _schema(
            {
                "idle_timeout_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "End the session after this long unused (the server caps it).",
                }
            }
        ),
        output=_schema(
            {
                "session_id": {"type": "string"},
                "idle_timeout_seconds": {"type": "integer"},
                "max_lifetime_seconds": {"type": "integer"},
            },
            ["session_id"],
        ),
    ),
    _tool(
        "end_session",
        "End a session",
        "End a session: its interpreter, shell and files are gone. Without session_id, your "
        "default session ends (the next call starts a fresh one).",
        _schema({"session_id": SESSION_ID}),
        destructive=True,
        idempotent=True,
    ),
    _tool(
        "pause_session",
        "Pause a session",
        "Pause a session you will come back to later: its processes stop and it costs no "
        "memory, while its Python variables, shell state and files are kept on disk. Any later "
        "call with its session_id (or resume_session) resumes it; what could not be kept "
        "(threads, open connections, background processes) is named then. Without session_id, "
        "your default session is paused.",
        _schema({"session_id": SESSION_ID}),
        idempotent=True,
    ),
    _tool(
        "resume_session",
        "Resume a paused session",
        "Resume a paused session now (any other call on it does so too); a running one is "
        "left as it is. Without session_id, your default session.",
        _schema({"session_id": SESSION_ID}),
        idempotent=True,
    ),
]
SCHEMAS: dict[str, dict[str, Any]] = {t.name: t.input_schema for t in TOOLS}
