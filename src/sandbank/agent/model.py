"""The `Model` interface the agent loop talks to, and the small message types it speaks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# Receives the reply's text as it is generated, piece by piece (their concatenation is the
# reply's `text`). It must not block: it only hands the pieces on.
TextSink = Callable[[str], None]


@dataclass(frozen=True)
class SystemMessage:
    content: str


@dataclass(frozen=True)
class UserMessage:
    content: str


@dataclass(frozen=True)
class ToolCallRequest:
    """One tool call the model asked for.

    `parse_error` is set (and `arguments` empty) when the model's arguments were not a JSON
    object; the loop answers such a call with a tool result naming the problem.
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    parse_error: str | None = None


@dataclass(frozen=True)
class AssistantMessage:
    content: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()


@dataclass(frozen=True)
class ToolResultMessage:
    tool_call_id: str
    name: str
    content: str


ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ModelReply:
    text: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()
    usage: Usage = Usage()
    model: str = ""

    def as_message(self) -> AssistantMessage:
        return AssistantMessage(content=self.text, tool_calls=self.tool_calls)


class Model(Protocol):
    """A chat model with tools. Failures raise errors from `sandbank.errors` (AgentError).

    With `on_text`, a model that can stream hands its text over as it is generated; one that
    cannot may call it once with the whole text, or never. The reply is the same either way.
    """

    async def complete(
        self, messages: list[ChatMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ModelReply: ...
