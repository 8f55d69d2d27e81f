"""The any-llm adapter driving the real OpenAI and Anthropic providers against fake servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbank.agent.anyllm import AnyLLMModel, is_loopback_url, model_from_settings
from sandbank.agent.loop import run_turn
from sandbank.agent.model import AssistantMessage, UserMessage
from sandbank.agent.tools import TOOL_SPECS
from sandbank.config import Settings
from sandbank.errors import ModelEndpointRefused, ModelNotConfigured, ModelUnavailable
from tests.agent.fake_llm_servers import (
    anthropic_answer,
    anthropic_error,
    anthropic_tool_use,
    openai_answer,
    openai_error,
    openai_tool_call,
    serve,
)
from tests.agent.fakes import FakeWorkbench, RecordingSink

pytestmark = pytest.mark.anyio


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "llm_model": "openai:gpt-fake",
        "llm_api_key": "sk-test",
        "llm_offline": True,
        "test_real_llm": False,
        "llm_retry_base_seconds": 0.01,
        "llm_max_retries": 2,
        "llm_timeout_seconds": 10,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def models() -> AsyncIterator[list[AnyLLMModel]]:
    """Models built in a test, closed after it (their HTTP clients)."""
    built: list[AnyLLMModel] = []
    yield built
    for model in built:
        await model.aclose()


async def test_openai_round_trip_through_the_loop(
    workbench: FakeWorkbench, sink: RecordingSink, models: list[AnyLLMModel]
) -> None:
    script = [openai_tool_call("print(6 * 7)"), openai_answer("It is **42**.")]
    with serve(script) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        models.append(model)
        result = await run_turn(
            model=model,
            workbench=workbench,
            recorder=sink,
            question="What is 6 times 7?",
            inspect_root=str(workbench.root),
        )

    assert result.status == "done" and result.answer == "It is **42**."
    assert server.paths == ["/v1/chat/completions"] * 2
    first, second = server.requests
    assert first["model"] == "gpt-fake"
    assert [t["function"]["name"] for t in first["tools"]] == [s.name for s in TOOL_SPECS]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["code"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assistant, tool = second["messages"][2:]
    assert assistant["content"] == "" and assistant["content"] is not None  # never null
    assert assistant["tool_calls"][0]["id"] == "call_abc"
    assert tool == {"role": "tool", "tool_call_id": "call_abc", "content": "stdout:\n42"}
    traces = [m.json() for m in sink.of("trace")]
    assert traces[0]["model"] == "gpt-fake"
    assert (traces[0]["input_tokens"], traces[0]["output_tokens"]) == (100, 20)


async def test_anthropic_round_trip_through_the_loop(
    workbench: FakeWorkbench, sink: RecordingSink, models: list[AnyLLMModel]
) -> None:
    script = [anthropic_tool_use("print(6 * 7)"), anthropic_answer("It is 42.")]
    with serve(script) as server:
        model = AnyLLMModel(settings(llm_model="anthropic:claude-fake", llm_base_url=server.url))
        models.append(model)
        result = await run_turn(
            model=model,
            workbench=workbench,
            recorder=sink,
            question="What is 6 times 7?",
            inspect_root=str(workbench.root),
        )

    assert result.status == "done" and result.answer == "It is 42."
    assert server.paths == ["/v1/messages"] * 2
    first, second = server.requests
    assert first["model"] == "claude-fake" and "data analyst" in first["system"]
    assert [t["name"] for t in first["tools"]] == [s.name for s in TOOL_SPECS]
    assert first["tools"][0]["input_schema"]["required"] == ["code"]
    assistant, results = second["messages"][1:]
    assert assistant["role"] == "assistant"
    assert {"type": "text", "text": "I will compute it."} in assistant["content"]
    assert all(block.get("text") != "" for block in assistant["content"])
    assert results["role"] == "user"
    (block,) = results["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_1"
    assert "stdout:\n42" in str(block["content"])
    assert sink.of("assistant")[0].content == "I will compute it."  # intermediate, internal


@pytest.mark.parametrize("failures", [[429], [500, 503]])
async def test_rate_limits_and_server_errors_are_retried(
    failures: list[int], models: list[AnyLLMModel]
) -> None:
    with serve([openai_error(s) for s in failures] + [openai_answer("ok")]) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        models.append(model)
        reply = await model.complete([UserMessage("hi")], TOOL_SPECS)
    assert reply.text == "ok"
    assert len(server.requests) == len(failures) + 1


async def test_persistent_failure_ends_in_our_error(models: list[AnyLLMModel]) -> None:
    with serve([openai_error(503)]) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1", llm_max_retries=2))
        models.append(model)
        with pytest.raises(ModelUnavailable) as caught:
            await model.complete([UserMessage("hi")], TOOL_SPECS)
    assert len(server.requests) == 3
    assert "openai:gpt-fake failed after 3 attempts (HTTP 503)" in caught.value.message
    assert caught.value.status == 502


async def test_client_errors_are_not_retried(models: list[AnyLLMModel]) -> None:
    with serve([openai_error(400)]) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        models.append(model)
        with pytest.raises(ModelUnavailable, match=r"\(HTTP 400\)"):
            await model.complete([UserMessage("hi")], TOOL_SPECS)
    assert len(server.requests) == 1


async def test_anthropic_failures_end_in_our_error(models: list[AnyLLMModel]) -> None:
    with serve([anthropic_error(529)]) as server:
        model = AnyLLMModel(
            settings(llm_model="anthropic:claude-fake", llm_base_url=server.url, llm_max_retries=1)
        )
        models.append(model)
        with pytest.raises(ModelUnavailable, match="after 2 attempts"):
            await model.complete([UserMessage("hi")], [])
    assert len(server.requests) == 2


async def test_a_history_assistant_message_without_text_is_sent_as_empty_string(
    models: list[AnyLLMModel],
) -> None:
    with serve([openai_answer("ok")]) as server:
        model = AnyLLMModel(settings(llm_base_url=server.url + "/v1"))
        models.append(model)
        await model.complete([UserMessage("hi"), AssistantMessage(), UserMessage("?")], [])
    assert server.requests[0]["messages"][1] == {"role": "assistant", "content": ""}
    assert "tools" not in server.requests[0]


@pytest.mark.parametrize(
    "base_url", ["", "https://api.openai.com/v1", "http://10.0.0.5:8000/v1", "http://llm:8/v1"]
)
def test_offline_refuses_every_endpoint_not_on_loopback(base_url: str) -> None:
    with pytest.raises(ModelEndpointRefused, match="SANDBANK_LLM_OFFLINE"):
        AnyLLMModel(settings(llm_base_url=base_url))


def test_the_real_llm_switch_lifts_the_offline_guard() -> None:
    # builds a client for a remote URL but sends nothing
    model = AnyLLMModel(settings(llm_base_url="https://api.openai.com/v1", test_real_llm=True))
    assert model.name == "openai:gpt-fake"


def test_the_tests_run_offline() -> None:
    assert Settings().llm_offline is True


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:1/v1", True),
        ("http://127.8.0.1/v1", True),
        ("http://[::1]:80/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://localhost.evil.com/v1", False),
        ("http://0.0.0.0/v1", False),
        ("not a url", False),
    ],
)
def test_loopback_detection(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


@pytest.mark.parametrize("spec", ["", "  ", "gpt-4", "openai:", "nosuchprovider:model"])
def test_a_missing_or_malformed_model_is_not_configured(spec: str) -> None:
    with pytest.raises(ModelNotConfigured, match="SANDBANK_LLM_MODEL") as caught:
        model_from_settings(settings(llm_model=spec, llm_base_url="http://127.0.0.1:1/v1"))
    assert caught.value.status == 503


def test_a_local_server_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = AnyLLMModel(settings(llm_api_key="", llm_base_url="http://127.0.0.1:1/v1"))
    assert model.name == "openai:gpt-fake"


def test_ollama_without_its_sdk_uses_its_openai_compatible_endpoint() -> None:
    model = AnyLLMModel(settings(llm_model="ollama:qwen2.5-coder", llm_api_key=""))
    assert model.name == "ollama:qwen2.5-coder"
