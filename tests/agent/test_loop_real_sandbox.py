"""The scripted model drives the real loop against real sandboxes (no HTTP, no store)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbank.agent.loop import RunLimits, run_turn
from sandbank.agent.model import SystemMessage, ToolResultMessage
from sandbank.agent.scripted import ScriptedModel, answer, run_python
from sandbank.interpreter.runs import SandboxWorkbench
from sandbank.protocol.calls import ExecResult, PythonCall
from sandbank.sandbox.local import LocalSandboxes
from sandbank.sandbox.port import chunks_of
from tests.agent.fakes import RecordingSink
from tests.support import data_dir, settings
from tests.tiers import needs

OWNER = "agent-tests"
CSV = "city,sales\nOslo,10\nLima,32\n"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def module_data() -> Iterator[Path]:
    with data_dir() as path:
        yield path


@pytest.fixture(scope="module")
@needs("root")
async def sandboxes(module_data: Path) -> AsyncIterator[LocalSandboxes]:
    s = settings(module_data)
    local = LocalSandboxes(s)
    await local.start()
    try:
        yield local
    finally:
        await local.close()


@pytest.fixture
async def bench(sandboxes: LocalSandboxes, tmp_path: Path) -> AsyncIterator[SandboxWorkbench]:
    sid = (await sandboxes.create(OWNER)).id
    upload = tmp_path / "sales.csv"
    upload.write_text(CSV)
    await sandboxes.write_file(sid, OWNER, "sales.csv", chunks_of(upload), read_only=True)
    try:
        yield SandboxWorkbench(sandboxes, sid, OWNER)
    finally:
        await sandboxes.destroy(sid, OWNER)


pytestmark = pytest.mark.anyio


async def py(bench: SandboxWorkbench, code: str) -> ExecResult:
    return await bench.execute(PythonCall(code), 10)


async def test_a_question_about_an_upload_is_answered_with_real_output_and_a_chart(
    bench: SandboxWorkbench,
) -> None:
    code = (
        "import pandas as pd, matplotlib.pyplot as plt\n"
        "df = pd.read_csv('sales.csv')\nprint('TOTAL', df['sales'].sum())\n"
        "df.plot.bar(x='city', y='sales');"
    )
    model = ScriptedModel(
        [
            run_python(code, text="Let me add the sales up."),
            answer("Total: 42\n\n![chart](figure_1.png)"),
        ]
    )
    sink = RecordingSink()
    result = await run_turn(model=model, workbench=bench, recorder=sink, question="Total sales?")

    assert result.status == "done" and result.answer is not None and "42" in result.answer
    assert result.files == ["figure_1.png"]
    # What the prompt says about the upload was gathered inside the sandbox.
    system = model.calls[0][0][0]
    assert isinstance(system, SystemMessage)
    assert "sales.csv" in system.content and "city" in system.content and "sales" in system.content
    # The tool's real output went back to the model.
    results = [m for m in model.calls[1][0] if isinstance(m, ToolResultMessage)]
    assert "TOTAL 42" in results[0].content and "figure_1.png" in results[0].content
    # Every step was recorded, with the right roles and flags.
    assert [r for r in sink.roles() if r[0] != "trace"] == [
        ("assistant", True),
        ("tool", True),
        ("assistant", False),
    ]
    tool = sink.of("tool")[0].json()
    assert tool["input"]["code"] == code
    assert tool["output"]["stdout"] == "TOTAL 42\n" and tool["output"]["return_code"] == 0
    assert tool["output"]["files"] == ["figure_1.png"]
    traces = [t.json() for t in sink.of("trace")]
    assert len(traces) == 2 and all(t["model"] == "scripted" for t in traces)
    assert "running code" in sink.statuses


async def test_a_failing_program_reaches_the_model_and_the_upload_stays_intact(
    bench: SandboxWorkbench,
) -> None:
    model = ScriptedModel(
        [
            run_python("open('sales.csv', 'w').write('gone')"),
            run_python("import os; os.remove('sales.csv')"),
            answer("I could not change your file."),
        ]
    )
    sink = RecordingSink()
    result = await run_turn(model=model, workbench=bench, recorder=sink, question="Wipe it")
    assert result.status == "done"
    outputs = [t.json()["output"] for t in sink.of("tool")]
    assert [o["return_code"] for o in outputs] == [1, 1]
    assert "PermissionError" in outputs[0]["stderr"] and "PermissionError" in outputs[1]["stderr"]
    check = await py(bench, "print(open('sales.csv').read())")
    assert check.stdout == CSV + "\n"


async def test_the_step_limit_ends_a_real_run_as_an_error_naming_it(
    bench: SandboxWorkbench,
) -> None:
    model = ScriptedModel(lambda messages, tools: run_python("print('again')"))
    sink = RecordingSink()
    result = await run_turn(
        model=model, workbench=bench, recorder=sink, question="Loop", limits=RunLimits(max_steps=3)
    )
    assert result.status == "error" and result.error is not None
    assert "step" in result.error.message
    assert [json.loads(t.content)["output"]["stdout"] for t in sink.of("tool")] == ["again\n"] * 3


async def test_a_tool_call_past_its_time_limit_ends_the_run_and_the_sandbox_survives(
    bench: SandboxWorkbench,
) -> None:
    model = ScriptedModel([run_python("import time; time.sleep(30)"), answer("never")])
    sink = RecordingSink()
    result = await run_turn(
        model=model,
        workbench=bench,
        recorder=sink,
        question="Slow",
        limits=RunLimits(tool_timeout_s=1),
    )
    assert result.status == "error" and result.error is not None
    assert "tool" in result.error.message.lower()
    assert (await py(bench, "print('alive')")).stdout == "alive\n"
