"""Fixtures: a fake LLM on loopback for the interpreter API's end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interpreter.fake_llm import FakeLLM, fake_llm


@pytest.fixture(scope="session")
def llm() -> Iterator[FakeLLM]:
    with fake_llm() as fake:
        yield fake
