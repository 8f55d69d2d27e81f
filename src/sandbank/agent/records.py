"""The JSON content of the agent's internal `tool` and `trace` messages, and their schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["user", "assistant", "tool", "trace"]


class ToolOutput(BaseModel):
    """What the sandbox returned for a call (as stored; the model sees a shortened text)."""

    model_config = ConfigDict(extra="forbid")

    stdout: str = ""
    stderr: str = ""
    return_code: int = 0
    files: list[str] = Field(default_factory=list, description="Workspace files produced.")
    duration_ms: int = 0
    displays: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Display bundles, as a notebook shows them: "
        '{"data": {media type: text (base64 for images)}, "cut": [media types left out]}.',
    )


class ToolRecord(BaseModel):
    """Content of a `tool` message: one tool call of the agent."""

    model_config = ConfigDict(extra="forbid")

    tool: str = Field(description="Tool name as the model called it.")
    call_id: str = Field(description="The model's id for the call.")
    step: int = Field(description="Which model call (1-based) asked for it.")
    input: dict[str, Any] = Field(description="Arguments as the model sent them.")
    python_code: str | None = Field(
        default=None,
        description="For a Python call, its code again (as `input.code`): the field the "
        "interpreter spec's own web client shows.",
    )
    output: ToolOutput | None = Field(default=None, description="Absent when the call did not run.")
    error: str | None = Field(
        default=None,
        description="Why the call did not run or did not finish (bad arguments, limit).",
    )


class TraceRecord(BaseModel):
    """Content of a `trace` message: one model call."""

    model_config = ConfigDict(extra="forbid")

    model: str
    step: int
    input_tokens: int
    output_tokens: int
    latency_ms: int
    tool_calls: int = Field(description="How many tool calls the reply asked for.")


# Published by the interpreter API so clients can read `tool` and `trace` messages.
TOOL_RECORD_SCHEMA: dict[str, Any] = ToolRecord.model_json_schema()
TRACE_RECORD_SCHEMA: dict[str, Any] = TraceRecord.model_json_schema()
