"""The wire codec (protocol/codec.py), in-process: each 422 names its field, unknown fields are
ignored, and what the routes encode the clients decode back unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from sandbank.errors import ProtocolError, UnknownTool, Unprocessable
from sandbank.protocol import codec
from sandbank.protocol.calls import BashCall, EditorCall, ExecResult, PythonCall
from sandbank.protocol.sessions import FileEntry, SessionInfo, SessionSpec


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"idle_timeout_seconds": "5"}, "idle_timeout_seconds must be an integer >= 1"),
        ({"idle_timeout_seconds": 0}, "idle_timeout_seconds must be an integer >= 1"),
        ({"idle_timeout_seconds": True}, "idle_timeout_seconds must be an integer"),
        ({"idle_timeout_seconds": 2.5}, "idle_timeout_seconds must be an integer"),
        ({"max_lifetime_seconds": -1}, "max_lifetime_seconds must be an integer >= 1"),
        ({"image": 5}, "image must be a string"),
        ({"network": 5}, "network must be"),
        ({"network": {"allow": ["pypi.org"]}}, "network.allow: 'pypi.org': expected HOST:PORT"),
        ([1, 2], "the request body must be a JSON object"),
    ],
)
def test_a_bad_create_body_is_422_naming_the_field(body: Any, message: str) -> None:
    with pytest.raises(Unprocessable) as caught:
        codec.parse_create(body)
    assert caught.value.status == 422 and message in caught.value.message


def test_a_create_body_may_be_absent_and_ignores_unknown_fields() -> None:
    assert codec.parse_create(None) == SessionSpec()
    spec = codec.parse_create({"idle_timeout_seconds": 30.0, "image": "x", "later": {}})
    assert spec.idle_timeout == 30 and spec.max_lifetime is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": {"code": "1"}}, "tool is required"),
        ({"tool": "", "input": {}}, "tool must not be empty"),
        ({"tool": "code_execution"}, "input is required"),
        ({"tool": "code_execution", "input": []}, "input must be an object"),
        ({"tool": "code_execution", "input": {}}, "input.code is required"),
        ({"tool": "code_execution", "input": {"code": 5}}, "input.code must be a string"),
        ({"tool": "code_execution", "input": {"code": ""}}, "input.code must not be empty"),
        ({"tool": "bash_code_execution", "input": {}}, "input.command is required"),
        (
            {"tool": "text_editor_code_execution", "input": {"command": "view"}},
            "input.path is required",
        ),
        (
            {"tool": "text_editor_code_execution", "input": {"command": "rm", "path": "a"}},
            "input.command must be one of view, create, str_replace, insert, undo_edit",
        ),
        (
            {"tool": "text_editor_code_execution", "input": {"command": "create", "path": "a"}},
            "input.file_text is required for the command create",
        ),
        (
            {
                "tool": "text_editor_code_execution",
                "input": {"command": "str_replace", "path": "a", "old_str": "", "new_str": ""},
            },
            "input.old_str must not be empty",
        ),
        (
            {
                "tool": "text_editor_code_execution",
                "input": {"command": "insert", "path": "a", "insert_line": "1", "new_str": ""},
            },
            "input.insert_line must be an integer",
        ),
        (
            {
                "tool": "text_editor_code_execution",
                "input": {"command": "view", "path": "a", "view_range": [1]},
            },
            "input.view_range must be a list of two integers",
        ),
        (
            {"tool": "code_execution", "input": {"code": "1"}, "timeout_seconds": "10"},
            "timeout_seconds must be an integer >= 1",
        ),
        (
            {"tool": "code_execution", "input": {"code": "1"}, "tool_use_id": 7},
            "tool_use_id must be a string",
        ),
    ],
)
def test_a_bad_execute_body_is_422_naming_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(Unprocessable) as caught:
        codec.parse_exec(body)
    assert message in caught.value.message


def test_lone_surrogates_are_refused_naming_the_field() -> None:
    with pytest.raises(Unprocessable, match=r"input\.code"):
        codec.parse_exec({"tool": "code_execution", "input": {"code": "print('\ud800')"}})


def test_an_unknown_tool_is_400_naming_what_runs() -> None:
    with pytest.raises(UnknownTool) as caught:
        codec.parse_exec({"tool": "web_search", "input": {}})
    assert caught.value.status == 400
    assert "'web_search'" in caught.value.message and "bash_code_execution" in caught.value.message


def test_each_tool_kind_parses_to_its_call_ignoring_unknown_fields() -> None:
    python = codec.parse_exec(
        {"tool": "code_execution", "input": {"code": "1", "x": 1}, "timeout_seconds": 5.0}
    )
    assert (python.call, python.timeout, python.tool_use_id) == (PythonCall("1"), 5, None)
    bash = codec.parse_exec({"tool": "bash_code_execution", "input": {"command": "ls"}})
    assert bash.call == BashCall("ls")
    edit = codec.parse_exec(
        {
            "tool": "text_editor_code_execution",
            "input": {"command": "view", "path": "a", "view_range": [1, -1]},
            "tool_use_id": "t",
        }
    )
    assert edit.call == EditorCall("view", "a", view_range=(1, -1)) and edit.tool_use_id == "t"


@pytest.mark.parametrize(
    "call",
    [
        PythonCall("print(1)"),
        BashCall("echo hi"),
        EditorCall("create", "a.txt", file_text=""),
        EditorCall("str_replace", "a.txt", old_str="a", new_str=""),
        EditorCall("insert", "a.txt", new_str="x", insert_line=0),
        EditorCall("view", "a.txt", view_range=(2, 3)),
        EditorCall("undo_edit", "a.txt"),
    ],
)
def test_a_call_a_client_encodes_is_parsed_back_by_the_server(call: Any) -> None:
    body = codec.encode_call(call, 12)
    parsed = codec.parse_exec(body)
    assert parsed.call == call and parsed.timeout == 12


def test_a_result_round_trips_with_its_files_and_displays() -> None:
    result = ExecResult("out", "err", 3, ["a.png", "d/b.csv"], 42, [{"data": {"text/plain": "x"}}])
    body = codec.encode_result("code_execution", "t-1", result)
    assert body["result_block"]["type"] == "code_execution_tool_result"
    assert codec.decode_result(body) == result
    plain = codec.encode_result("bash_code_execution", "t-2", ExecResult())
    assert "display_outputs" not in plain["result_block"]["content"]


def test_a_handle_and_a_listing_round_trip() -> None:
    info = SessionInfo("s-1", 30, 3600, 1.5, 2.5)
    assert codec.decode_handle(codec.encode_handle(info)) == info
    entries = [FileEntry("d", 0, 1.0, is_dir=True), FileEntry("a.csv", 9, 2.0)]
    listing = codec.encode_listing(entries, True)
    assert listing["files"][0]["mime_type"] is None and listing["files"][1]["mime_type"]
    assert codec.decode_listing(listing) == (entries, True)


@pytest.mark.parametrize(
    ("decode", "body"),
    [
        (codec.decode_handle, {"idle_timeout_seconds": 3}),
        (codec.decode_handle, []),
        (codec.decode_result, {"result_block": {}}),
        (codec.decode_result, {"result_block": {"content": {"return_code": "x"}}}),
        (codec.decode_listing, {"files": [{"path": "a"}]}),
        (codec.decode_file, {"path": "a"}),
    ],
)
def test_a_malformed_reply_is_a_protocol_error_naming_the_operation(decode: Any, body: Any) -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        decode(body)


def test_a_display_bundle_is_kept_to_its_shape_with_bad_text_replaced() -> None:
    bundle = codec.decode_bundle({"data": {"text/plain": "a\ud800"}, "cut": ["image/png"], "x": 1})
    assert bundle == {"data": {"text/plain": "a?"}, "cut": ["image/png"]}
    with pytest.raises(TypeError):
        codec.decode_bundle({"data": "text"})
