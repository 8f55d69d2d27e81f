"""`ScriptedModel`: a fake `Model` that replays scripted replies or asks a function, for tests."""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import anyio

from sandbank.agent.model import (
    ChatMessage,
    ModelReply,
    TextSink,
    ToolCallRequest,
    ToolSpec,
    Usage,
)
from sandbank.errors import ModelUnavailable

ReplyFunction = Callable[[list[ChatMessage], list[ToolSpec]], ModelReply | Awaitable[ModelReply]]

_ids = itertools.count(1)
_PIECES = re.compile(r"\s*\S+\s*|\s+")  # words with their spaces: they join back exactly
DEFAULT_USAGE = Usage(input_tokens=10, output_tokens=5)


def answer(text: str, *, usage: Usage = DEFAULT_USAGE) -> ModelReply:
    """A reply without tool calls: the run's final answer."""
    return ModelReply(text=text, usage=usage)


def call_tool(
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    text: str = "",
    usage: Usage = DEFAULT_USAGE,
    parse_error: str | None = None,
) -> ModelReply:
    """A reply asking for one tool call (with optional intermediate text)."""
    request = ToolCallRequest(
        id=f"call_{next(_ids)}", name=name, arguments=arguments or {}, parse_error=parse_error
    )
    return ModelReply(text=text, tool_calls=(request,), usage=usage)


def run_python(code: str, *, text: str = "", usage: Usage = DEFAULT_USAGE) -> ModelReply:
    return call_tool("code_execution", {"code": code}, text=text, usage=usage)


class ScriptedModel:
    """Replies from a list, in order, or from a function of the conversation.

    Every call's messages and tools are kept in `calls` so tests can assert what the loop
    sent. `delay` makes each reply slow (for run-time limits and cancellation). Given
    `on_text`, it streams the reply's text word by word, `chunk_delay` apart.
    """

    def __init__(
        self,
        script: Sequence[ModelReply] | ReplyFunction,
        *,
        name: str = "scripted",
        delay: float = 0.0,
        chunk_delay: float = 0.0,
    ) -> None:
        self._script = script
        self.name = name
        self.delay = delay
        self.chunk_delay = chunk_delay
        self.calls: list[tuple[list[ChatMessage], list[ToolSpec]]] = []

    async def complete(
        self, messages: list[ChatMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ModelReply:
        index = len(self.calls)
        self.calls.append((list(messages), list(tools)))
        if self.delay:
            await anyio.sleep(self.delay)
        if callable(self._script):
            produced = self._script(list(messages), list(tools))
            reply = await produced if inspect.isawaitable(produced) else produced
        elif index < len(self._script):
            reply = self._script[index]
        else:
            raise ModelUnavailable(f"ScriptedModel: the script has no reply for call {index + 1}")
        if on_text is not None:
            for piece in _PIECES.findall(reply.text):
                on_text(piece)
                await anyio.sleep(self.chunk_delay)  # a checkpoint even at 0: others see it
        return reply if reply.model else replace(reply, model=self.name)
