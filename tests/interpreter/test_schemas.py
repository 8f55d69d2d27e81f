"""Parsing of the interpreter API's requests (no server: the fast tier)."""

from __future__ import annotations

import pytest

from sandbank.errors import BadRequest
from sandbank.interpreter.schemas import message_content


def test_a_posted_message_may_carry_the_servers_own_fields_which_are_ignored() -> None:
    body = b'{"content": "hi", "timestamp": 1, "internal": false, "role": "user"}'
    assert message_content(body, "application/json", 100) == "hi"


@pytest.mark.parametrize(
    "body",
    [
        b'{"content": "\\ud800"}',
        b"[" * 10_000 + b"]" * 10_000,
        b'{"content": "hi", "role": "tool"}',
    ],
)
def test_what_cannot_be_a_question_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest):
        message_content(body, "application/json", 100)
