"""Tool specs, argument mapping to the runtime's calls, and result text for the model."""

from __future__ import annotations

import pytest

from sandbank.agent.model import ToolCallRequest
from sandbank.agent.tools import TOOL_SPECS, ToolArgumentError, clip, result_text, to_sandbox_call
from sandbank.protocol.calls import BashCall, EditorCall, ExecResult, PythonCall


def request(name: str, **arguments: object) -> ToolCallRequest:
    return ToolCallRequest(id="c1", name=name, arguments=dict(arguments))


def test_three_tools_are_offered_with_object_schemas() -> None:
    assert [s.name for s in TOOL_SPECS] == [
        "code_execution",
        "bash",
        "str_replace_based_edit_tool",
    ]
    assert all(s.parameters["type"] == "object" and s.parameters["required"] for s in TOOL_SPECS)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (request("code_execution", code="1"), PythonCall("1")),
        (request("bash", command="ls"), BashCall("ls")),
        (
            request("str_replace_based_edit_tool", command="view", path="a", view_range=[1, -1]),
            EditorCall("view", "a", view_range=(1, -1)),
        ),
        (
            request("str_replace_based_edit_tool", command="create", path="a", file_text="x"),
            EditorCall("create", "a", file_text="x"),
        ),
        (
            request("str_replace_based_edit_tool", command="str_replace", path="a", old_str="x"),
            EditorCall("str_replace", "a", old_str="x", new_str=""),
        ),
        (
            request(
                "str_replace_based_edit_tool",
                command="insert",
                path="a",
                insert_line=0,
                insert_text="y",
            ),
            EditorCall("insert", "a", insert_line=0, new_str="y"),
        ),
    ],
)
def test_calls_map_to_the_runtime_vocabulary(call: ToolCallRequest, expected: object) -> None:
    assert to_sandbox_call(call) == expected


@pytest.mark.parametrize(
    "call",
    [
        request("str_replace_based_edit_tool", command="create", path="a"),
        request("str_replace_based_edit_tool", command="insert", path="a", new_str="y"),
        request("str_replace_based_edit_tool", command="view", path=" "),
        request("bash"),
    ],
)
def test_incomplete_calls_are_refused_with_a_reason(call: ToolCallRequest) -> None:
    with pytest.raises(ToolArgumentError, match=r"\S"):
        to_sandbox_call(call)


def test_result_text_shows_what_the_model_needs() -> None:
    result = ExecResult(stdout="out\n", stderr="warn\n", return_code=2, files=["a.png", "b.csv"])
    assert result_text(result, 1000) == (
        "stdout:\nout\nstderr:\nwarn\nreturn code: 2\nfiles produced: a.png, b.csv"
    )
    assert result_text(ExecResult(), 1000) == "(no output)"


def test_long_output_is_cut_to_the_budget_saying_so() -> None:
    text = result_text(ExecResult(stdout="HEAD" + "x" * 10_000 + "TAIL", stderr="boom"), 1000)
    assert text.startswith("stdout:\nHEAD") and "TAIL" in text and text.endswith("stderr:\nboom")
    assert "characters cut: the output was 10008 characters" in text
    assert len(text) < 1200


def test_clip_leaves_short_text_alone() -> None:
    assert clip("abc", 3) == "abc"
