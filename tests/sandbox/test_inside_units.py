"""In-sandbox modules that need only the standard library, in-process: the worker's frames and
their caps (inside/protocol.py) and display bundles (inside/display.py). The sandbox suite runs
them again inside real sandboxes."""

from __future__ import annotations

import base64
import json
import os

import pytest

from sandbank.sandbox.inside import display, protocol


def test_a_frame_is_a_length_and_ascii_json_that_carries_any_text() -> None:
    msg = {"stdout": "h\u00e9 \ud800 \x00", "return_code": 0}
    frame = protocol.encode(msg)
    (size,) = protocol.HEADER.unpack(frame[:4])
    assert size == len(frame) - 4 and frame[4:].isascii()
    assert protocol.decode(frame[4:]) == msg


@pytest.mark.parametrize(
    ("body", "why"),
    [(b"{nope", "not JSON"), (b"[1]", "not a JSON object"), (b"[" * 100_000, "not JSON")],
)
def test_a_frame_that_is_not_a_json_object_is_a_violation(body: bytes, why: str) -> None:
    with pytest.raises(protocol.ProtocolViolation, match=why):
        protocol.decode(body)


def test_a_frame_over_its_cap_is_a_violation() -> None:
    protocol.check_size(protocol.MAX_REPLY, protocol.MAX_REPLY)
    with pytest.raises(protocol.ProtocolViolation, match="over the cap"):
        protocol.check_size(protocol.MAX_REPLY + 1, protocol.MAX_REPLY)


def test_frames_are_read_whole_however_the_reads_split_them() -> None:
    frames = [{"op": "python", "code": "x" * n} for n in (0, 10, 70_000)]
    stream = b"".join(protocol.encode(f) for f in frames)
    for step in (1, 3, 4, 5, 65536, len(stream)):
        chunks = [stream[i : i + step] for i in range(0, len(stream), step)]
        asked: list[int] = []

        def read(n: int, chunks: list[bytes] = chunks, asked: list[int] = asked) -> bytes:
            asked.append(n)
            return chunks.pop(0) if chunks else b""

        buf = bytearray()
        assert [protocol.next_frame(buf, read, 1 << 20) for _ in frames] == frames
        assert not buf and min(asked) >= 65536  # reads ahead, never byte by byte
        with pytest.raises(EOFError):
            protocol.next_frame(buf, read, 1 << 20)


def test_a_frame_cut_short_or_over_the_cap_is_refused() -> None:
    frame = protocol.encode({"op": "ping"})
    parts = [frame[:-1]]
    with pytest.raises(EOFError):
        protocol.next_frame(bytearray(), lambda n: parts.pop() if parts else b"", 1 << 20)
    with pytest.raises(protocol.ProtocolViolation, match="over the cap"):
        protocol.next_frame(bytearray(frame), lambda n: b"", len(frame) - 5)


def test_a_result_lists_at_most_the_cap_of_files_and_counts_the_rest() -> None:
    files = [f"f{i}" for i in range(protocol.MAX_FILES + 3)] + ["x" * (protocol.MAX_PATH_CHARS + 1)]
    reply = protocol.result(files=files)
    assert len(reply[protocol.FILES]) == protocol.MAX_FILES
    assert reply[protocol.FILES_CUT] == 4
    assert protocol.FILES_CUT not in protocol.result(files=["a"])
    assert protocol.DISPLAYS not in protocol.result()


def test_a_reply_too_large_gives_up_displays_first_then_output_and_says_so() -> None:
    big = {"data": {"text/html": "x" * (protocol.MAX_REPLY // 2)}}
    reply = protocol.result(stdout="o" * 100, displays=[big, big, big])
    assert len(protocol.encode(reply)) <= protocol.MAX_REPLY
    assert reply[protocol.DISPLAYS_CUT] >= 2 and reply[protocol.STDOUT] == "o" * 100
    # Text that escapes to six times its size is cut by its encoded size.
    reply = protocol.result(stdout="\x01" * protocol.MAX_REPLY, stderr="e")
    assert len(protocol.encode(reply)) <= protocol.MAX_REPLY
    assert reply[protocol.STDOUT].endswith("[output truncated: the reply was too large]\n")


@pytest.mark.parametrize(
    ("disk", "shown"),
    [("plain.txt", "plain.txt"), ("bad\udcff.txt", "bad\\xff.txt"), ("é.txt", "é.txt")],
)
def test_a_name_that_is_not_utf8_is_shown_escaped_and_read_back(disk: str, shown: str) -> None:
    assert protocol.display_name(disk) == shown
    back = protocol.disk_name(shown)
    assert back == (disk if "\\x" in shown else None)


def test_a_shown_name_with_a_broken_escape_keeps_it_as_text() -> None:
    assert protocol.disk_name("a\\xZZ.txt") == "a\\xZZ.txt"
    assert os.fsencode(protocol.disk_name("\\x41\\xff") or "") == b"A\xff"


def test_a_bundle_keeps_text_encodes_binary_forms_and_serializes_json() -> None:
    out = display.bundle_of(
        {
            "text/plain": "Rich()",
            "text/html": "<b>rich</b>",
            "image/png": b"\x89PNG",
            "image/jpeg": "already-base64",
            "application/json": {"a": 1},
        }
    )
    data = out["data"]
    assert data["text/plain"] == "Rich()" and data["text/html"] == "<b>rich</b>"
    assert base64.b64decode(data["image/png"]) == b"\x89PNG"
    assert data["image/jpeg"] == "already-base64"
    assert json.loads(data["application/json"]) == {"a": 1}
    assert "cut" not in out


def test_a_bundle_without_text_has_an_empty_one_and_unusable_forms_are_left_out() -> None:
    out = display.bundle_of({"image/png": 5, "application/json": {1, 2}})
    assert out == {"data": {"text/plain": ""}}


def test_representations_over_the_cap_are_cut_and_named() -> None:
    huge = "h" * (display.MAX_BUNDLE_CHARS + 10)
    out = display.bundle_of({"text/plain": huge, "text/html": "<p>"})
    assert out["data"]["text/plain"].endswith("...")
    assert out["cut"] == ["text/html", "text/plain (shortened)"]
