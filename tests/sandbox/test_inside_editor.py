"""The in-sandbox text editor (sandbox/inside/editor.py), in-process on a scratch workspace: its
semantics (Anthropic's text-editor tool) and its refusals, each a result with return code 1.
tests/sandbox/test_bash_and_editor.py runs it again inside real sandboxes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbank.sandbox.inside.editor import MAX_LISTED_LINES, Editor


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def editor(ws: Path) -> Editor:
    return Editor(str(ws))


def ok(editor: Editor, **msg: object) -> str:
    out, err, code = editor.run(msg)
    assert (err, code) == ("", 0), err
    return out


def refused(editor: Editor, **msg: object) -> str:
    out, err, code = editor.run(msg)
    assert out == "" and code == 1 and err.startswith("Error: ") and err.endswith("\n")
    return err


def test_create_makes_parent_directories_and_says_where(editor: Editor, ws: Path) -> None:
    out = ok(editor, command="create", path="a/b/c.txt", file_text="x\ny\n")
    assert out == "File created successfully at: a/b/c.txt\n"
    assert (ws / "a/b/c.txt").read_text() == "x\ny\n"


def test_view_numbers_lines_and_a_range_may_end_at_minus_one(editor: Editor) -> None:
    ok(editor, command="create", path="f.txt", file_text="one\ntwo\nthree\n")
    assert ok(editor, command="view", path="f.txt") == "     1\tone\n     2\ttwo\n     3\tthree\n"
    assert ok(editor, command="view", path="f.txt", view_range=[2, -1]) == (
        "     2\ttwo\n     3\tthree\n"
    )
    assert ok(editor, command="view", path="f.txt", view_range=[2, 2]) == "     2\ttwo\n"


@pytest.mark.parametrize(
    ("view_range", "message"),
    [
        ([0, 1], "start 0 is outside"),
        ([4, -1], "start 4 is outside"),
        ([2, 1], "end 1 must be -1 or within [2, 3]"),
        ([1, 9], "end 9 must be -1"),
        ([1], "a list of two integers"),
        (["1", "2"], "a list of two integers"),
    ],
)
def test_a_bad_view_range_is_refused_naming_the_bounds(
    editor: Editor, view_range: object, message: str
) -> None:
    ok(editor, command="create", path="f.txt", file_text="one\ntwo\nthree\n")
    assert message in refused(editor, command="view", path="f.txt", view_range=view_range)


def test_a_directory_is_listed_two_levels_deep_without_hidden_entries(
    editor: Editor, ws: Path
) -> None:
    (ws / "d/e/f/g").mkdir(parents=True)
    (ws / "d/top.txt").write_text("")
    (ws / "d/.hidden").write_text("")
    out = ok(editor, command="view", path="d")
    assert out.startswith("Files and directories up to 2 levels deep in d:\n")
    listed = out.splitlines()[1:]
    assert listed == ["d/e", "d/top.txt", "d/e/f"]
    assert "view_range is not allowed" in refused(
        editor, command="view", path="d", view_range=[1, 2]
    )


def test_str_replace_edits_once_and_shows_a_numbered_snippet(editor: Editor, ws: Path) -> None:
    ok(editor, command="create", path="f.py", file_text="a = 1\nb = 2\nc = 3\n")
    out = ok(editor, command="str_replace", path="f.py", old_str="b = 2", new_str="b = 20")
    assert out.startswith("The file f.py has been edited.\nSnippet of the edited file:\n")
    assert "     2\tb = 20" in out
    assert (ws / "f.py").read_text() == "a = 1\nb = 20\nc = 3\n"


def test_str_replace_refuses_a_missing_or_repeated_old_str_and_changes_nothing(
    editor: Editor, ws: Path
) -> None:
    ok(editor, command="create", path="f.txt", file_text="x\nx\ny\n")
    assert "did not appear in f.txt" in refused(
        editor, command="str_replace", path="f.txt", old_str="z", new_str=""
    )
    err = refused(editor, command="str_replace", path="f.txt", old_str="x", new_str="w")
    assert "appears 2 times (lines 1, 2); make it unique" in err
    assert "non-empty string" in refused(
        editor, command="str_replace", path="f.txt", old_str="", new_str="w"
    )
    assert (ws / "f.txt").read_text() == "x\nx\ny\n"


def test_a_repeated_old_str_names_at_most_twenty_lines(editor: Editor) -> None:
    ok(editor, command="create", path="f.txt", file_text="x\n" * 25)
    err = refused(editor, command="str_replace", path="f.txt", old_str="x", new_str="w")
    assert f"and {25 - MAX_LISTED_LINES} more" in err


def test_str_replace_without_new_str_deletes(editor: Editor, ws: Path) -> None:
    ok(editor, command="create", path="f.txt", file_text="keep drop keep\n")
    ok(editor, command="str_replace", path="f.txt", old_str=" drop")
    assert (ws / "f.txt").read_text() == "keep keep\n"


def test_insert_after_a_line_and_at_the_top(editor: Editor, ws: Path) -> None:
    ok(editor, command="create", path="f.txt", file_text="1\n3\n")
    ok(editor, command="insert", path="f.txt", insert_line=1, new_str="2")
    ok(editor, command="insert", path="f.txt", insert_line=0, new_str="0\n")
    assert (ws / "f.txt").read_text() == "0\n1\n2\n3\n"


@pytest.mark.parametrize(
    ("line", "new", "message"),
    [
        (5, "x", "insert_line 5 must be within [0, 2]"),
        (-1, "x", "insert_line -1 must be within"),
        ("1", "x", "insert_line must be an integer"),
        (True, "x", "insert_line must be an integer"),
        (1, None, "new_str must be a string"),
    ],
)
def test_insert_refuses_a_bad_line_or_text(
    editor: Editor, line: object, new: object, message: str
) -> None:
    ok(editor, command="create", path="f.txt", file_text="1\n2\n")
    assert message in refused(editor, command="insert", path="f.txt", insert_line=line, new_str=new)


def test_undo_goes_back_one_edit_at_a_time_then_says_there_is_none(
    editor: Editor, ws: Path
) -> None:
    ok(editor, command="create", path="f.txt", file_text="v1\n")
    ok(editor, command="str_replace", path="f.txt", old_str="v1", new_str="v2")
    ok(editor, command="create", path="f.txt", file_text="v3\n")  # overwriting is undoable
    assert (
        ok(editor, command="undo_edit", path="f.txt") == "Last edit to f.txt undone successfully.\n"
    )
    assert (ws / "f.txt").read_text() == "v2\n"
    ok(editor, command="undo_edit", path="f.txt")
    assert (ws / "f.txt").read_text() == "v1\n"
    assert "no edit history for f.txt" in refused(editor, command="undo_edit", path="f.txt")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", ""])
def test_paths_outside_the_workspace_or_empty_are_refused(editor: Editor, path: str) -> None:
    err = refused(editor, command="create", path=path, file_text="x")
    assert "outside the workspace" in err or "a path is required" in err


def test_a_symlink_out_of_the_workspace_is_refused(editor: Editor, ws: Path) -> None:
    (ws / "out").symlink_to("/etc")
    assert "outside the workspace" in refused(editor, command="view", path="out/passwd")


def test_a_nul_byte_in_a_path_is_refused(editor: Editor) -> None:
    assert "NUL byte" in refused(editor, command="view", path="a\x00b")


def test_a_fifo_is_refused_at_once_not_waited_on(editor: Editor, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    assert "not a regular file" in refused(editor, command="view", path="pipe")
    assert "not a regular file" in refused(editor, command="create", path="pipe", file_text="x")


def test_missing_files_directories_and_unknown_commands_are_results(
    editor: Editor, ws: Path
) -> None:
    (ws / "d").mkdir()
    assert "does not exist" in refused(editor, command="view", path="nope.txt")
    assert "d is a directory" in refused(editor, command="create", path="d", file_text="")
    assert "d is a directory" in refused(editor, command="str_replace", path="d", old_str="x")
    assert "unknown command 'delete'" in refused(editor, command="delete", path="f")


def test_a_long_edit_shows_a_cut_snippet(editor: Editor) -> None:
    ok(editor, command="create", path="f.txt", file_text="start\n")
    out = ok(editor, command="insert", path="f.txt", insert_line=1, new_str="\n".join(["l"] * 500))
    assert out.endswith("[snippet cut: view the file for the rest of the edit]\n")


def test_text_that_is_not_utf8_is_shown_replaced_not_refused(editor: Editor, ws: Path) -> None:
    (ws / "b.txt").write_bytes(b"ok \xff\n")
    assert ok(editor, command="view", path="b.txt") == "     1\tok \ufffd\n"
