"""Earlier turns of a session, rebuilt as model messages and fitted into a character budget."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import ValidationError

from sandbank.agent.interfaces import HistoryMessage
from sandbank.agent.model import (
    AssistantMessage,
    ChatMessage,
    ToolCallRequest,
    ToolResultMessage,
    UserMessage,
)
from sandbank.agent.records import ToolRecord
from sandbank.agent.tools import result_text
from sandbank.protocol.calls import ExecResult

SHORTENED_KEEP = 200  # characters an old tool output keeps once shortened
SHORTENED_MARK = "\n[older output shortened]"

Turn = list[ChatMessage]


def _tool_result(record: ToolRecord, output_chars: int) -> ToolResultMessage:
    if record.output is not None:
        text = result_text(ExecResult(**record.output.model_dump()), output_chars)
        if record.error:
            text += f"\nerror: {record.error}"
    else:
        text = f"error: {record.error or 'the call did not run'}"
    return ToolResultMessage(tool_call_id=record.call_id, name=record.tool, content=text)


class _TurnBuilder:
    """Folds one turn's stored messages into assistant tool-call messages and their results."""

    def __init__(self, output_chars: int) -> None:
        self.output_chars = output_chars
        self.messages: Turn = []
        self.text = ""  # intermediate text waiting for the tool calls that follow it
        self.calls: list[ToolRecord] = []

    def flush(self) -> None:
        if self.calls:
            requests = tuple(
                ToolCallRequest(id=r.call_id, name=r.tool, arguments=r.input) for r in self.calls
            )
            self.messages.append(AssistantMessage(content=self.text, tool_calls=requests))
            self.messages += [_tool_result(r, self.output_chars) for r in self.calls]
        elif self.text:
            self.messages.append(AssistantMessage(content=self.text))
        self.text, self.calls = "", []

    def add(self, message: HistoryMessage) -> None:
        if message.role == "user":
            self.flush()
            self.messages.append(UserMessage(message.content))
        elif message.role == "assistant" and not message.internal:
            self.flush()
            if message.content:
                self.messages.append(AssistantMessage(content=message.content))
        elif message.role == "assistant":
            self.flush()
            self.text = message.content
        elif message.role == "tool":
            try:
                record = ToolRecord.model_validate_json(message.content)
            except ValidationError:
                return  # not ours (or damaged): the model can do without it
            if self.calls and self.calls[-1].step != record.step:
                self.flush()
            self.calls.append(record)
        # traces are for people, not for the model


def _turns(history: Sequence[HistoryMessage], output_chars: int) -> list[Turn]:
    turns: list[Turn] = []
    builder: _TurnBuilder | None = None
    for message in history:
        if message.role == "user" or builder is None:
            if builder is not None:
                builder.flush()
                turns.append(builder.messages)
            builder = _TurnBuilder(output_chars)
        builder.add(message)
    if builder is not None:
        builder.flush()
        turns.append(builder.messages)
    return turns


def message_chars(message: ChatMessage) -> int:
    size = len(message.content)
    if isinstance(message, AssistantMessage):
        size += sum(len(c.name) + len(json.dumps(c.arguments)) for c in message.tool_calls)
    return size


def _total(turns: list[Turn]) -> int:
    return sum(message_chars(m) for turn in turns for m in turn)


def replay(
    history: Sequence[HistoryMessage], *, budget_chars: int, tool_output_chars: int
) -> list[ChatMessage]:
    """Earlier turns as model messages, within `budget_chars`.

    Over budget, tool outputs are shortened oldest first; if that is not enough, the oldest
    whole turns are dropped (whole turns, so tool calls keep their results).
    """
    turns = _turns(history, tool_output_chars)
    total = _total(turns)
    for turn in turns:
        for index, message in enumerate(turn):
            if total <= budget_chars:
                break
            if isinstance(message, ToolResultMessage) and len(
                message.content
            ) > SHORTENED_KEEP + len(SHORTENED_MARK):
                short = message.content[:SHORTENED_KEEP] + SHORTENED_MARK
                total -= len(message.content) - len(short)
                turn[index] = ToolResultMessage(message.tool_call_id, message.name, short)
    while turns and total > budget_chars:
        total -= sum(message_chars(m) for m in turns.pop(0))
    return [message for turn in turns for message in turn]
