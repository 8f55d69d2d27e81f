"""The agent loop driven by ScriptedModel against the in-process FakeWorkbench."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest

from sandbank.agent import loop
from sandbank.agent.interfaces import HistoryMessage
from sandbank.agent.loop import RunLimits, TurnResult, run_turn
from sandbank.agent.model import (
    ChatMessage,
    ModelReply,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from sandbank.agent.records import TOOL_RECORD_SCHEMA, TRACE_RECORD_SCHEMA, ToolRecord
from sandbank.agent.scripted import ScriptedModel, answer, call_tool, run_python
from sandbank.errors import RunCancelled, RunLimitReached
from tests.agent.fakes import FakeWorkbench, HangingWorkbench, RecordingSink

pytestmark = pytest.mark.anyio


async def turn(
    model: ScriptedModel,
    workbench: FakeWorkbench,
    sink: RecordingSink,
    question: str = "What is in my data?",
    **options: Any,
) -> TurnResult:
    return await run_turn(
        model=model,
        workbench=workbench,
        recorder=sink,
        question=question,
        inspect_root=str(workbench.root),
        **options,
    )


def tool_results(messages: list[ChatMessage]) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


async def test_a_tool_call_then_an_answer_records_every_step(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel(
        [run_python("print(6 * 7)", text="Let me compute."), answer("The answer is **42**.")]
    )
    result = await turn(model, workbench, sink)

    assert result.status == "done"
    assert result.answer == "The answer is **42**."
    assert sink.roles() == [
        ("trace", True),
        ("assistant", True),
        ("tool", True),
        ("trace", True),
        ("assistant", False),
    ]
    assert sink.messages[1].content == "Let me compute."
    tool = ToolRecord.model_validate_json(sink.of("tool")[0].content)
    assert (tool.tool, tool.step, tool.input) == ("code_execution", 1, {"code": "print(6 * 7)"})
    assert tool.python_code == "print(6 * 7)"  # the field the spec's own web client reads
    assert tool.output is not None and tool.output.stdout == "42\n"
    traces = [m.json() for m in sink.of("trace")]
    assert [t["step"] for t in traces] == [1, 2]
    assert traces[0]["model"] == "scripted" and traces[0]["input_tokens"] == 10
    assert (result.steps, result.input_tokens, result.output_tokens) == (2, 20, 10)
    # the model saw the tool's output on its second call
    second_call = model.calls[1][0]
    assert tool_results(second_call)[0].content == "stdout:\n42"
    assert sink.statuses == ["looking at the files", "thinking", "running code", "thinking"]


async def test_records_match_the_published_schemas(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel([run_python("print(1)"), call_tool("bash", {}), answer("done")])
    await turn(model, workbench, sink)
    for message in sink.of("tool"):
        jsonschema.validate(message.json(), TOOL_RECORD_SCHEMA)
    for message in sink.of("trace"):
        jsonschema.validate(message.json(), TRACE_RECORD_SCHEMA)
    assert len(sink.of("tool")) == 2


async def test_the_interpreter_persists_and_errors_reach_the_model(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel([run_python("x = 5"), run_python("print(x); 1 / 0"), answer("x was 5")])
    result = await turn(model, workbench, sink)
    assert result.status == "done"
    seen = tool_results(model.calls[2][0])[-1].content
    assert seen.startswith("stdout:\n5\nstderr:\nTraceback")
    assert "ZeroDivisionError" in seen and seen.endswith("return code: 1")


async def test_produced_files_are_recorded_and_named_to_the_model(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    code = "with open(WORKSPACE + '/figure_1.png', 'wb') as f: f.write(b'png')"
    model = ScriptedModel([run_python(code), answer("![chart](figure_1.png)")])
    result = await turn(model, workbench, sink)
    assert result.files == ["figure_1.png"]
    record = ToolRecord.model_validate_json(sink.of("tool")[0].content)
    assert record.output is not None and record.output.files == ["figure_1.png"]
    assert tool_results(model.calls[1][0])[0].content == "files produced: figure_1.png"


async def test_bash_and_editor_calls_are_mapped_to_the_runtime(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel(
        [
            call_tool(
                "str_replace_based_edit_tool",
                {"command": "create", "path": "/workspace/a.txt", "file_text": "hello\n"},
            ),
            call_tool("bash", {"command": "cat a.txt"}),
            answer("ok"),
        ]
    )
    result = await turn(model, workbench, sink)
    assert result.status == "done"
    # (an empty workspace needs no file preview, so these are the only calls)
    assert [type(c).__name__ for c in workbench.calls] == ["EditorCall", "BashCall"]
    assert tool_results(model.calls[2][0])[-1].content == "stdout:\nhello"
    assert "editing files" in sink.statuses and "running a command" in sink.statuses
    tools = [ToolRecord.model_validate_json(m.content) for m in sink.of("tool")]
    assert [t.python_code for t in tools] == [None, None]  # only Python calls carry it


@pytest.mark.parametrize(
    ("reply", "complaint"),
    [
        (call_tool("code_execution", {"cod": "print(1)"}), "missing required argument `code`"),
        (call_tool("code_execution", {"code": 3}), "argument `code` must be a string"),
        (call_tool("web_search", {"q": "x"}), "there is no tool named `web_search`"),
        (call_tool("code_execution", parse_error="Expecting value"), "not a JSON object"),
        (
            call_tool("str_replace_based_edit_tool", {"command": "delete", "path": "a"}),
            "`command` must be one of view, create, str_replace, insert",
        ),
        (
            call_tool(
                "str_replace_based_edit_tool",
                {"command": "view", "path": "a", "view_range": [1]},
            ),
            "`view_range` must be a list of two integers",
        ),
    ],
)
async def test_bad_tool_arguments_become_a_tool_result_not_a_crash(
    workbench: FakeWorkbench, sink: RecordingSink, reply: ModelReply, complaint: str
) -> None:
    model = ScriptedModel([reply, answer("sorry")])
    result = await turn(model, workbench, sink)
    assert result.status == "done"
    seen = tool_results(model.calls[1][0])[0].content
    assert seen.startswith("Error: ") and complaint in seen
    record = ToolRecord.model_validate_json(sink.of("tool")[0].content)
    assert record.output is None and record.error is not None and complaint in record.error
    assert workbench.calls == []  # nothing ran


def always_python(messages: list[ChatMessage], tools: list[ToolSpec]) -> ModelReply:
    return run_python("print('again')", usage=Usage(input_tokens=400, output_tokens=200))


async def test_the_step_limit_ends_the_run_as_an_error_naming_it(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    result = await turn(
        ScriptedModel(always_python), workbench, sink, limits=RunLimits(max_steps=3)
    )
    assert result.status == "error"
    assert isinstance(result.error, RunLimitReached) and result.error.limit == "agent_max_steps"
    assert (
        "step limit" in result.error.message and "SANDBANK_AGENT_MAX_STEPS" in result.error.message
    )
    assert len(sink.of("tool")) == 3 and len(sink.of("trace")) == 3  # what was done is kept
    assert sink.statuses[-1] == f"error: {result.error.message}"


async def test_the_token_limit_ends_the_run_as_an_error_naming_it(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    limits = RunLimits(max_tokens=1000)
    result = await turn(ScriptedModel(always_python), workbench, sink, limits=limits)
    assert isinstance(result.error, RunLimitReached) and result.error.limit == "agent_max_tokens"
    assert "token limit" in result.error.message and "1200 tokens" in result.error.message
    assert result.steps == 2 and len(sink.of("tool")) == 1  # the second reply's call never ran


async def test_the_run_time_limit_ends_the_run_as_an_error_naming_it(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel(always_python, delay=0.15)
    limits = RunLimits(run_timeout_s=0.5)
    started = time.monotonic()
    result = await turn(model, workbench, sink, limits=limits)
    assert time.monotonic() - started < 2
    assert isinstance(result.error, RunLimitReached)
    assert result.error.limit == "agent_run_timeout_seconds"
    assert "run time limit" in result.error.message
    assert sink.of("tool")  # steps before the deadline were kept


async def test_the_tool_call_time_limit_ends_the_run_as_an_error_naming_it(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel([run_python("import time; time.sleep(1.5)"), answer("never")])
    result = await turn(model, workbench, sink, limits=RunLimits(tool_timeout_s=0.3))
    assert isinstance(result.error, RunLimitReached)
    assert result.error.limit == "agent_tool_timeout_seconds"
    assert "tool-call time limit" in result.error.message
    record = ToolRecord.model_validate_json(sink.of("tool")[0].content)
    assert record.error == result.error.message
    assert len(model.calls) == 1


async def test_a_users_own_exit_code_124_is_not_a_timeout(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel([call_tool("bash", {"command": "exit 124"}), answer("fine")])
    result = await turn(model, workbench, sink, limits=RunLimits(tool_timeout_s=30))
    assert result.status == "done"


async def test_a_workbench_that_ignores_its_timeout_is_abandoned(
    tmp_path: Any, sink: RecordingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "TOOL_TIMEOUT_GRACE_S", 0.1)
    model = ScriptedModel([run_python("print(1)"), answer("never")])
    result = await turn(
        model, HangingWorkbench(tmp_path), sink, limits=RunLimits(tool_timeout_s=0.2)
    )
    assert isinstance(result.error, RunLimitReached)
    assert result.error.limit == "agent_tool_timeout_seconds"


async def test_cancelling_stops_the_run_and_reports_cancelled(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    cancel = anyio.Event()
    model = ScriptedModel([run_python("print(1)"), answer("never")], delay=10)
    started = time.monotonic()
    async with anyio.create_task_group() as group:

        async def cancel_soon() -> None:
            await anyio.sleep(0.2)
            cancel.set()

        group.start_soon(cancel_soon)
        result = await turn(model, workbench, sink, cancel=cancel)
    assert time.monotonic() - started < 2
    assert result.status == "cancelled" and isinstance(result.error, RunCancelled)
    assert sink.statuses[-1] == "cancelled"
    assert sink.of("assistant") == []


async def test_a_call_interrupted_by_cancelling_stays_on_record(
    tmp_path: Path, sink: RecordingSink
) -> None:
    cancel = anyio.Event()
    model = ScriptedModel([run_python("while True: pass"), answer("never")])
    async with anyio.create_task_group() as group:

        async def cancel_soon() -> None:
            await anyio.sleep(0.3)
            cancel.set()

        group.start_soon(cancel_soon)
        result = await turn(model, HangingWorkbench(tmp_path), sink, cancel=cancel)
    assert result.status == "cancelled"
    (tool,) = sink.of("tool")
    record = json.loads(tool.content)
    assert record["input"] == {"code": "while True: pass"}
    assert record["error"] == loop.INTERRUPTED and record.get("output") is None


async def test_an_unset_cancel_event_does_not_hold_the_run(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    result = await turn(ScriptedModel([answer("hi")]), workbench, sink, cancel=anyio.Event())
    assert result.status == "done" and result.answer == "hi"


async def test_an_empty_answer_is_replaced_by_a_note(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    result = await turn(ScriptedModel([answer("  ")]), workbench, sink)
    assert result.answer == loop.EMPTY_ANSWER


async def test_earlier_turns_go_back_to_the_model(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    first = ScriptedModel([run_python("print('rows: 3')", text="Counting."), answer("3 rows.")])
    await turn(first, workbench, sink, question="How many rows?")
    history = [HistoryMessage("user", "How many rows?", False)] + [
        HistoryMessage(m.role, m.content, m.internal) for m in sink.messages
    ]
    second = ScriptedModel([answer("Still 3.")])
    await turn(second, workbench, RecordingSink(), question="And now?", history=history)
    sent = second.calls[0][0]
    assert isinstance(sent[0], SystemMessage)
    assert [type(m).__name__ for m in sent[1:]] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "UserMessage",
    ]
    assert sent[2].content == "Counting." and sent[2].tool_calls[0].arguments == {  # type: ignore[union-attr]
        "code": "print('rows: 3')"
    }
    assert sent[3].content == "stdout:\nrows: 3"
    assert sent[-1] == UserMessage("And now?")


async def test_the_prompt_says_when_the_sandbox_was_recreated(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel([answer("a"), answer("b")])
    await turn(model, workbench, sink, sandbox_recreated=True)
    await turn(model, workbench, sink, sandbox_recreated=False)
    recreated, fresh = (calls[0].content for calls, _ in model.calls)
    assert "earlier variables are gone; files are still in /workspace" in recreated
    assert "earlier variables are gone" not in fresh
