"""The model's text as it is generated: any-llm's streams from fake servers over loopback, put
back together into the very reply the whole answer gives, and the scripted model's chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from sandbank.agent.anyllm import AnyLLMModel
from sandbank.agent.loop import run_turn
from sandbank.agent.model import ModelReply, UserMessage
from sandbank.agent.scripted import ScriptedModel, answer, run_python
from sandbank.agent.tools import TOOL_SPECS
from tests.agent.fake_llm_servers import (
    Reply,
    anthropic_tool_use,
    openai_answer,
    openai_error,
    openai_tool_call,
    serve,
)
from tests.agent.fakes import FakeWorkbench, RecordingSink
from tests.agent.test_anyllm import settings

pytestmark = pytest.mark.anyio

ANSWER = "The total is **42**, from three rows:\n\n| a | 1 |\n| b | 41 |\n"


def with_text(reply: Reply, text: str) -> Reply:
    """An OpenAI tool call that also says something (as models do before calling)."""
    status, body = reply
    body["choices"][0]["message"]["content"] = text
    return status, body


@pytest.fixture
async def built() -> AsyncIterator[list[AnyLLMModel]]:
    models: list[AnyLLMModel] = []
    yield models
    for model in models:
        await model.aclose()


async def both_ways(model: AnyLLMModel) -> tuple[ModelReply, ModelReply, list[str]]:
    """The same request asked whole, then streamed (the fake repeats its scripted reply)."""
    whole = await model.complete([UserMessage("sum it")], TOOL_SPECS)
    pieces: list[str] = []
    streamed = await model.complete([UserMessage("sum it")], TOOL_SPECS, pieces.append)
    return whole, streamed, pieces


@pytest.mark.parametrize(
    "reply",
    [
        openai_answer(ANSWER),
        with_text(openai_tool_call("import pandas as pd\nprint(pd.__version__)"), "Let me look."),
    ],
    ids=["answer", "tool-call"],
)
async def test_an_openai_stream_gives_the_same_reply_as_the_whole_answer(
    reply: Reply, built: list[AnyLLMModel]
) -> None:
    with serve([reply]) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        built.append(model)
        whole, streamed, pieces = await both_ways(model)
    assert "stream" not in server.requests[0]
    assert server.requests[1]["stream"] is True
    assert server.requests[1]["stream_options"] == {"include_usage": True}
    assert streamed == whole  # text, tool calls (id, name, parsed arguments), usage, model
    assert "".join(pieces) == whole.text and len(pieces) > 2


async def test_an_anthropic_stream_gives_the_same_reply_as_the_whole_answer(
    built: list[AnyLLMModel],
) -> None:
    with serve([anthropic_tool_use("print(6 * 7)")]) as server:
        model = AnyLLMModel(settings(llm_model="anthropic:claude-fake", llm_base_url=server.url))
        built.append(model)
        whole, streamed, pieces = await both_ways(model)
    assert server.requests[1]["stream"] is True
    assert streamed == whole and whole.tool_calls[0].arguments == {"code": "print(6 * 7)"}
    assert "".join(pieces) == "I will compute it."


async def test_a_refused_stream_falls_back_to_the_whole_answer_and_is_not_tried_again(
    built: list[AnyLLMModel],
) -> None:
    with serve([openai_error(400), openai_answer("whole")]) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        built.append(model)
        pieces: list[str] = []
        first = await model.complete([UserMessage("hi")], [], pieces.append)
        second = await model.complete([UserMessage("hi")], [], pieces.append)
    assert first.text == second.text == "whole"
    assert [r.get("stream", False) for r in server.requests] == [True, False, False]
    assert pieces == []  # a whole answer is not handed on as text: it is stored at once


async def test_the_loop_hands_on_each_steps_text_as_the_anyllm_model_streams_it(
    workbench: FakeWorkbench, sink: RecordingSink, built: list[AnyLLMModel]
) -> None:
    script = [with_text(openai_tool_call("print(6 * 7)"), "Computing it."), openai_answer(ANSWER)]
    with serve(script) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        built.append(model)
        result = await run_turn(
            model=model,
            workbench=workbench,
            recorder=sink,
            question="What is 6 times 7?",
            inspect_root=str(workbench.root),
        )
    assert result.status == "done"
    by_step = {step: "".join(t for s, t in sink.texts if s == step) for step, _ in sink.texts}
    assert by_step == {1: "Computing it.", 2: ANSWER}
    assert sink.of("assistant")[-1].content == ANSWER.strip()  # stored whole, as before


async def test_the_scripted_model_streams_its_text_in_timed_chunks() -> None:
    text = "one two three four five"
    model = ScriptedModel([answer(text)], chunk_delay=0.05)
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    reply = await model.complete([], [], lambda piece: arrivals.append((time.monotonic(), piece)))
    ended = time.monotonic()
    assert reply.text == text and "".join(p for _, p in arrivals) == text
    assert len(arrivals) == 5
    assert arrivals[0][0] - started < 0.04  # the first word before the reply is done
    assert ended - arrivals[0][0] >= 0.2


async def test_scripted_text_is_tagged_by_step_and_without_a_sink_nothing_waits(
    workbench: FakeWorkbench, sink: RecordingSink
) -> None:
    model = ScriptedModel([run_python("print(1)", text="Checking."), answer("Done.")])
    result = await run_turn(
        model=model,
        workbench=workbench,
        recorder=sink,
        question="q",
        inspect_root=str(workbench.root),
    )
    assert result.status == "done"
    assert sink.texts == [(1, "Checking."), (2, "Done.")]  # one word each, tagged by step
    quick = ScriptedModel([answer("a b c")], chunk_delay=10.0)
    started = time.monotonic()
    assert (await quick.complete([], [])).text == "a b c"
    assert time.monotonic() - started < 1.0
