"""Earlier turns replayed to the model within a budget: old tool outputs shortened first."""

from __future__ import annotations

from collections.abc import Sequence

from sandbank.agent.history import SHORTENED_MARK, replay
from sandbank.agent.interfaces import HistoryMessage
from sandbank.agent.model import AssistantMessage, ToolResultMessage, UserMessage
from sandbank.agent.records import ToolOutput, ToolRecord, TraceRecord


def one_turn(n: int, output: str) -> list[HistoryMessage]:
    tool = ToolRecord(
        tool="code_execution",
        call_id=f"c{n}",
        step=1,
        input={"code": "print(x)"},
        output=ToolOutput(stdout=output),
    )
    trace = TraceRecord(
        model="m", step=1, input_tokens=1, output_tokens=1, latency_ms=1, tool_calls=1
    )
    return [
        HistoryMessage("user", f"question {n}", False),
        HistoryMessage("trace", trace.model_dump_json(), True),
        HistoryMessage("assistant", "Looking.", True),
        HistoryMessage("tool", tool.model_dump_json(), True),
        HistoryMessage("assistant", f"answer {n}", False),
    ]


def results(messages: Sequence[object]) -> list[str]:
    return [m.content for m in messages if isinstance(m, ToolResultMessage)]


def test_history_within_budget_is_replayed_whole() -> None:
    history = one_turn(1, "a" * 1000) + one_turn(2, "b" * 1000)
    messages = replay(history, budget_chars=100_000, tool_output_chars=20_000)
    assert messages[0] == UserMessage("question 1")
    assert isinstance(messages[1], AssistantMessage) and messages[1].tool_calls[0].id == "c1"
    assert results(messages) == ["stdout:\n" + "a" * 1000, "stdout:\n" + "b" * 1000]
    assert messages[-1] == AssistantMessage("answer 2")


def test_older_tool_outputs_are_shortened_first() -> None:
    history = one_turn(1, "a" * 5000) + one_turn(2, "b" * 5000) + one_turn(3, "c" * 5000)
    messages = replay(history, budget_chars=11_000, tool_output_chars=20_000)
    first, second, third = results(messages)
    assert first.endswith(SHORTENED_MARK) and len(first) < 300
    assert second == "stdout:\n" + "b" * 5000 and third == "stdout:\n" + "c" * 5000
    assert UserMessage("question 1") in messages  # shortened, not dropped


def test_oldest_turns_are_dropped_when_shortening_is_not_enough() -> None:
    history = [*one_turn(1, "a" * 5000), HistoryMessage("user", "q" * 3000, False)]
    history += one_turn(2, "b" * 5000)
    messages = replay(history, budget_chars=1000, tool_output_chars=20_000)
    assert UserMessage("question 1") not in messages
    assert messages[0] == UserMessage("question 2")  # the newest turn fits once shortened


def test_tool_outputs_are_cut_to_the_tool_output_budget() -> None:
    messages = replay(one_turn(1, "z" * 50_000), budget_chars=100_000, tool_output_chars=1000)
    (text,) = results(messages)
    assert len(text) < 1200 and "characters cut" in text


def test_damaged_tool_records_are_skipped() -> None:
    history = [
        HistoryMessage("user", "q", False),
        HistoryMessage("tool", "{not json", True),
        HistoryMessage("assistant", "a", False),
    ]
    assert replay(history, budget_chars=1000, tool_output_chars=100) == [
        UserMessage("q"),
        AssistantMessage("a"),
    ]
