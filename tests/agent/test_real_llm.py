"""Opt-in: the configured real model answers through the loop (SANDBANK_TEST_REAL_LLM=1)."""

from __future__ import annotations

import os

import pytest

from sandbank.agent.anyllm import model_from_settings
from sandbank.agent.loop import run_turn
from sandbank.config import Settings
from tests.agent.fakes import FakeWorkbench, RecordingSink

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.real_llm,
    pytest.mark.skipif(
        os.environ.get("SANDBANK_TEST_REAL_LLM") != "1" or not os.environ.get("SANDBANK_LLM_MODEL"),
        reason="asks a real model: set SANDBANK_TEST_REAL_LLM=1 and SANDBANK_LLM_MODEL",
    ),
]


async def test_a_real_model_computes_with_code(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    (workbench.root / "numbers.csv").write_text("n\n17\n23\n")
    model = model_from_settings(Settings())
    try:
        result = await run_turn(
            model=model,
            workbench=workbench,
            recorder=sink,
            question="Multiply the numbers in numbers.csv using Python. Reply with the product.",
            inspect_root=str(workbench.root),
        )
    finally:
        await model.aclose()
    assert result.status == "done", result.error
    assert result.answer is not None and "391" in result.answer
    assert sink.of("tool")
