"""The text editor inside the sandbox: view, create, str_replace, insert, undo_edit.

Semantics follow Anthropic's text-editor tool. Runs as the session's user, confined to the
workspace; standard library only. Every failure is a result: (stdout, stderr, return code).
"""

from __future__ import annotations

import os
import stat
from typing import Any

SNIPPET_LINES = 4
MAX_SNIPPET_LINES = 200  # an edit's snippet shows at most this many lines
MAX_VIEW_BYTES = 1 << 20
MAX_DIR_ENTRIES = 500
MAX_LISTED_LINES = 20  # line numbers named when old_str is not unique


class EditorError(Exception):
    pass


class Editor:
    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.history: dict[str, list[str]] = {}

    def run(self, msg: dict[str, Any]) -> tuple[str, str, int]:
        try:
            command = msg.get("command")
            path = self.resolve(str(msg.get("path") or ""))
            if command == "view":
                return self.view(path, msg.get("view_range")), "", 0
            if command == "create":
                return self.create(path, str(msg.get("file_text") or "")), "", 0
            if command == "str_replace":
                return self.str_replace(path, msg.get("old_str"), msg.get("new_str")), "", 0
            if command == "insert":
                return self.insert(path, msg.get("insert_line"), msg.get("new_str")), "", 0
            if command == "undo_edit":
                return self.undo(path), "", 0
            raise EditorError(f"unknown command {command!r}")
        except EditorError as e:
            return "", f"Error: {e}\n", 1
        except OSError as e:
            return "", f"Error: {e.strerror or e}\n", 1

    def resolve(self, raw: str) -> str:
        if not raw:
            raise EditorError("a path is required")
        if "\x00" in raw:
            raise EditorError("the path contains a NUL byte")
        joined = os.path.normpath(os.path.join(self.root, raw))
        real = os.path.realpath(joined)
        for candidate in (joined, real):
            if candidate != self.root and not candidate.startswith(self.root + os.sep):
                raise EditorError(f"the path {raw} is outside the workspace {self.root}")
        return joined

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def _regular(self, fd: int, path: str) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise EditorError(f"{self.rel(path)} is not a regular file")

    def read(self, path: str) -> str:
        if os.path.isdir(path):
            raise EditorError(f"{self.rel(path)} is a directory")
        if not os.path.lexists(path):
            raise EditorError(f"the file {self.rel(path)} does not exist")
        # Non-blocking, then refused unless regular: a FIFO or a device never blocks the editor.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._regular(fd, path)
        if os.fstat(fd).st_size > MAX_VIEW_BYTES * 8:
            os.close(fd)
            raise EditorError(f"{self.rel(path)} is too large to edit here; use bash or Python")
        with open(fd, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()

    def write(self, path: str, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        self._regular(fd, path)
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        with open(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    def remember(self, path: str, text: str) -> None:
        self.history.setdefault(path, []).append(text)

    def view(self, path: str, view_range: Any) -> str:
        if os.path.isdir(path):
            if view_range is not None:
                raise EditorError("view_range is not allowed when the path is a directory")
            return self.view_dir(path)
        text = self.read(path)
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        start, end = 1, len(lines)
        if view_range is not None:
            if (
                not isinstance(view_range, list | tuple)
                or len(view_range) != 2
                or not all(isinstance(n, int) for n in view_range)
            ):
                raise EditorError("view_range must be a list of two integers")
            start, end = int(view_range[0]), int(view_range[1])
            if start < 1 or start > max(len(lines), 1):
                raise EditorError(
                    f"view_range start {start} is outside the file's lines [1, {len(lines)}]"
                )
            if end == -1:
                end = len(lines)
            elif end < start or end > len(lines):
                raise EditorError(
                    f"view_range end {end} must be -1 or within [{start}, {len(lines)}]"
                )
        body = "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines[start - 1 : end], start))
        out = body + ("\n" if body else "")
        if len(out) > MAX_VIEW_BYTES:
            out = out[:MAX_VIEW_BYTES] + "\n[view truncated; use view_range]\n"
        return out

    def view_dir(self, path: str) -> str:
        entries: list[str] = []
        base_depth = path.rstrip(os.sep).count(os.sep)
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if dirpath.count(os.sep) - base_depth >= 2:
                dirnames[:] = []
            for name in sorted(dirnames) + sorted(f for f in filenames if not f.startswith(".")):
                entries.append(self.rel(os.path.join(dirpath, name)))
                if len(entries) >= MAX_DIR_ENTRIES:
                    entries.append("[listing truncated]")
                    return "\n".join(entries) + "\n"
        header = f"Files and directories up to 2 levels deep in {self.rel(path)}:\n"
        return header + "\n".join(entries) + ("\n" if entries else "")

    def create(self, path: str, text: str) -> str:
        if os.path.isdir(path):
            raise EditorError(f"{self.rel(path)} is a directory")
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        if os.path.exists(path):
            self.remember(path, self.read(path))
        self.write(path, text)
        return f"File created successfully at: {self.rel(path)}\n"

    def str_replace(self, path: str, old: Any, new: Any) -> str:
        if not isinstance(old, str) or old == "":
            raise EditorError("old_str must be a non-empty string")
        new = "" if new is None else str(new)
        text = self.read(path)
        count = text.count(old)
        if count == 0:
            raise EditorError(
                f"no replacement was performed: old_str did not appear in {self.rel(path)}"
            )
        if count > 1:
            first = old.split("\n")[0]
            lines = [n for n, line in enumerate(text.split("\n"), 1) if first in line]
            shown = ", ".join(map(str, lines[:MAX_LISTED_LINES]))
            more = (
                f" and {len(lines) - MAX_LISTED_LINES} more"
                if len(lines) > MAX_LISTED_LINES
                else ""
            )
            raise EditorError(
                f"no replacement was performed: old_str appears {count} times "
                f"(lines {shown}{more}); make it unique"
            )
        self.remember(path, text)
        updated = text.replace(old, new, 1)
        self.write(path, updated)
        at = text.split(old)[0].count("\n")
        return f"The file {self.rel(path)} has been edited.\n" + self.snippet(updated, at, new)

    def insert(self, path: str, line: Any, new: Any) -> str:
        if not isinstance(line, int) or isinstance(line, bool):
            raise EditorError("insert_line must be an integer")
        if not isinstance(new, str):
            raise EditorError("new_str must be a string")
        text = self.read(path)
        lines = text.split("\n")
        trailing = text.endswith("\n")
        if trailing:
            lines.pop()
        if line < 0 or line > len(lines):
            raise EditorError(f"insert_line {line} must be within [0, {len(lines)}]")
        self.remember(path, text)
        new_lines = new.split("\n")
        if new.endswith("\n"):
            new_lines.pop()
        updated_lines = lines[:line] + new_lines + lines[line:]
        updated = "\n".join(updated_lines) + ("\n" if trailing or not lines else "")
        self.write(path, updated)
        return f"The file {self.rel(path)} has been edited.\n" + self.snippet(updated, line, new)

    def undo(self, path: str) -> str:
        stack = self.history.get(path)
        if not stack:
            raise EditorError(f"no edit history for {self.rel(path)}")
        self.write(path, stack.pop())
        return f"Last edit to {self.rel(path)} undone successfully.\n"

    def snippet(self, text: str, at_line: int, new: str) -> str:
        lines = text.split("\n")
        start = max(0, at_line - SNIPPET_LINES)
        end = min(len(lines), at_line + new.count("\n") + SNIPPET_LINES + 1)
        cut = max(0, end - start - MAX_SNIPPET_LINES)
        end -= cut
        body = "\n".join(f"{n:6}\t{ln}" for n, ln in enumerate(lines[start:end], start + 1))
        if len(body) > MAX_VIEW_BYTES:
            body = body[:MAX_VIEW_BYTES]
            cut = cut or 1
        note = "\n[snippet cut: view the file for the rest of the edit]" if cut else ""
        return f"Snippet of the edited file:\n{body}{note}\n"
