"""The `Model` over any-llm-sdk: `provider:model` strings, bounded retries, the offline guard."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
from any_llm import AnyLLM
from any_llm.exceptions import AnyLLMError, MissingApiKeyError, RateLimitError
from any_llm.types.completion import ChatCompletion, ChatCompletionChunk
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from sandbank.agent.model import (
    AssistantMessage,
    ChatMessage,
    ModelReply,
    SystemMessage,
    TextSink,
    ToolCallRequest,
    ToolSpec,
    Usage,
    UserMessage,
)
from sandbank.agent.reach import UNREACHABLE
from sandbank.config import Settings
from sandbank.errors import (
    ModelEndpointRefused,
    ModelNotConfigured,
    ModelUnavailable,
    ModelUnreachable,
)

log = logging.getLogger(__name__)

OLLAMA_DEFAULT_URL = "http://127.0.0.1:11434/v1"  # Ollama's OpenAI-compatible endpoint
MAX_BACKOFF_S = 30.0
# Local OpenAI-compatible servers need no key, but the OpenAI client insists on one.
PLACEHOLDER_KEY = "sandbank-no-key"
_TRANSIENT = ("APIConnectionError", "APITimeoutError")  # openai's and anthropic's names
# A connection that cannot even be made (refused, no such host) is tried once more, at once,
# then said in words: backing off for 15 s would only keep the user waiting.
CONNECT_RETRY_S = 0.3


def _unreachable(error: AnyLLMError) -> bool:
    return error.status_code is None and (
        type(error.original_exception).__name__ == "APIConnectionError"
    )


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost could resolve anywhere


def check_endpoint(settings: Settings, url: str) -> None:
    """Refuse a non-loopback endpoint (or a provider default) when running offline.

    With `llm_offline` (SANDBANK_LLM_OFFLINE=1, set by the tests' conftest) the model cannot be
    built for an endpoint that is not a loopback address, and a provider's default endpoint
    counts as remote; `test_real_llm` (SANDBANK_TEST_REAL_LLM=1) lifts it. It runs when the
    model is built, before any request, so no code path reaches a real LLM by accident.
    """
    if not settings.llm_offline or settings.test_real_llm:
        return
    if not url:
        raise ModelEndpointRefused(
            f"SANDBANK_LLM_OFFLINE is set: {settings.llm_model} would use its provider's own "
            "endpoint, which is not on loopback; set SANDBANK_LLM_BASE_URL to a local server"
        )
    if not is_loopback_url(url):
        raise ModelEndpointRefused(
            f"SANDBANK_LLM_OFFLINE is set: the model endpoint {url} is not on loopback"
        )


def to_wire(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Our messages in the OpenAI chat format that any-llm takes for every provider."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            wire.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            wire.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            # Some servers reject `content: null` beside tool calls; an empty string passes.
            item: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if message.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }
                    for call in message.tool_calls
                ]
            wire.append(item)
        else:
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": message.content or "(no output)",
                }
            )
    return wire


def _tool_request(call_id: str, name: str, raw: str | None) -> ToolCallRequest:
    try:
        arguments = json.loads(raw or "{}")
    except ValueError as error:
        return ToolCallRequest(id=call_id, name=name, parse_error=str(error))
    if not isinstance(arguments, dict):
        return ToolCallRequest(id=call_id, name=name, parse_error="not an object")
    return ToolCallRequest(id=call_id, name=name, arguments=arguments)


def from_completion(response: ChatCompletion, fallback_model: str) -> ModelReply:
    if not response.choices:
        raise ModelUnavailable(f"the model {fallback_model} answered with no choices")
    message = response.choices[0].message
    calls = tuple(
        _tool_request(call.id, call.function.name, call.function.arguments)
        for call in message.tool_calls or []
        if isinstance(call, ChatCompletionMessageFunctionToolCall)  # custom calls: not offered
    )
    usage = response.usage
    return ModelReply(
        text=message.content or "",
        tool_calls=calls,
        usage=Usage(
            input_tokens=(usage.prompt_tokens or 0) if usage else 0,
            output_tokens=(usage.completion_tokens or 0) if usage else 0,
        ),
        model=response.model or fallback_model,
    )


@dataclass
class _StreamedCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAssembly:
    """A streamed reply put back together: the same `ModelReply` as the whole answer gives."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _StreamedCall] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    model: str = ""

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk in; returns the text it adds."""
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
        added = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.delta.content:
                added += choice.delta.content
            for delta in choice.delta.tool_calls or []:
                call = self.calls.setdefault(delta.index, _StreamedCall())
                call.id = delta.id or call.id
                if delta.function is not None:
                    call.name = delta.function.name or call.name  # sent whole, once
                    call.arguments.append(delta.function.arguments or "")
        self.text.append(added)
        return added

    def reply(self, fallback_model: str) -> ModelReply:
        calls = tuple(
            _tool_request(c.id or f"call_{i}", c.name, "".join(c.arguments))
            for i, c in sorted(self.calls.items())
        )
        text = "".join(self.text)
        return ModelReply(text, calls, self.usage, self.model or fallback_model)


def _retryable(error: AnyLLMError) -> bool:
    status = error.status_code
    if isinstance(error, RateLimitError) or status == 429:
        return True
    if status is not None:
        return status >= 500
    return type(error.original_exception).__name__ in _TRANSIENT


def _delay(error: AnyLLMError, attempt: int, base: float) -> float:
    delay = base * float(2**attempt)
    retry_after = getattr(error, "retry_after", None)
    # An HTTP-date Retry-After is ignored: our own backoff is good enough.
    with contextlib.suppress(TypeError, ValueError):
        delay = max(delay, float(str(retry_after)))
    return min(delay, MAX_BACKOFF_S)


class AnyLLMModel:
    """A `Model` backed by any-llm. Building it does no I/O; `complete` makes the requests."""

    def __init__(self, settings: Settings) -> None:
        spec = settings.llm_model.strip()
        if not spec:
            raise ModelNotConfigured()
        provider, _, model_id = spec.partition(":")
        if not provider or not model_id:
            raise ModelNotConfigured(
                f"SANDBANK_LLM_MODEL must be `provider:model` (e.g. openai:gpt-4.1-mini), "
                f"got {spec!r}"
            )
        self.name = spec
        self._model_id = model_id
        self._settings = settings
        base_url = settings.llm_base_url.strip()
        compatible = provider == "ollama" and not _has_module("ollama")
        if compatible:
            base_url = base_url or OLLAMA_DEFAULT_URL
        check_endpoint(settings, base_url)
        key = settings.llm_api_key.get_secret_value() or None
        try:
            self._llm = self._create(provider, base_url, key, compatible)
        except MissingApiKeyError as error:
            if not base_url:
                raise ModelNotConfigured(
                    f"{error.message} (or set SANDBANK_LLM_API_KEY)"
                ) from error
            self._llm = self._create(provider, base_url, PLACEHOLDER_KEY, compatible)
        except (AnyLLMError, ImportError, ValueError) as error:
            raise ModelNotConfigured(f"cannot use SANDBANK_LLM_MODEL={spec!r}: {error}") from error
        self._call_options: dict[str, Any] = {}
        if type(self._llm).TIMEOUT_SUPPORT != "unsupported":
            self._call_options["timeout"] = settings.llm_timeout_seconds
        # Off for good once the provider refuses a stream (a 4xx): it answers whole instead.
        self._streams = bool(type(self._llm).SUPPORTS_COMPLETION_STREAMING)

    @staticmethod
    def _create(provider: str, base_url: str, key: str | None, compatible: bool) -> AnyLLM:
        if compatible:
            return AnyLLM.create_openai_compatible(
                provider, api_base=base_url, api_key=key, unified_exceptions=True, max_retries=0
            )
        options: dict[str, Any] = {"unified_exceptions": True}
        if AnyLLM.get_provider_class(provider).MAX_RETRIES_SUPPORT != "unsupported":
            options["max_retries"] = 0  # we retry ourselves, with our own bounds
        return AnyLLM.create(provider, api_key=key, api_base=base_url or None, **options)

    async def complete(
        self, messages: list[ChatMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ModelReply:
        wire_tools: list[dict[str, Any] | Any] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ]
        request: dict[str, Any] = {
            "model": self._model_id,
            "messages": to_wire(messages),
            "tools": wire_tools or None,
            "max_tokens": self._settings.llm_max_output_tokens,
            **self._call_options,
        }
        if on_text is not None and self._streams:
            try:
                return await self._streamed(request, on_text)
            except AnyLLMError as error:
                # Nothing was handed on yet: the whole answer, asked for as usual, replaces it.
                log.info("model %s: streaming failed, asking without: %s", self.name, error)
                if not _retryable(error):
                    self._streams = False
        return await self._whole(request)

    async def _streamed(self, request: dict[str, Any], on_text: TextSink) -> ModelReply:
        stream = await self._llm.acompletion(
            **request, stream=True, stream_options={"include_usage": True}
        )
        if not isinstance(stream, AsyncIterator):
            raise ModelUnavailable(f"the model {self.name} did not stream")
        assembly = StreamAssembly()
        handed_on = False
        try:
            async for chunk in stream:
                if added := assembly.add(chunk):
                    on_text(added)
                    handed_on = True
        except AnyLLMError as error:
            if not handed_on:
                raise
            # Text was handed on: asking again would show it twice.
            raise ModelUnavailable(
                f"the model {self.name} failed in the middle of its answer: {str(error)[:500]}"
            ) from error
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):  # closing is best effort
                    await close()
        return assembly.reply(self.name)

    async def _whole(self, request: dict[str, Any]) -> ModelReply:
        settings = self._settings
        attempt = 0
        while True:
            try:
                response = await self._llm.acompletion(**request)
            except AnyLLMError as error:
                unreachable = _unreachable(error)
                retries = (
                    min(1, settings.llm_max_retries) if unreachable else (settings.llm_max_retries)
                )
                if _retryable(error) and attempt < retries:
                    delay = _delay(error, attempt, settings.llm_retry_base_seconds)
                    await anyio.sleep(CONNECT_RETRY_S if unreachable else delay)
                    attempt += 1
                    continue
                if unreachable:
                    log.warning("model %s: cannot connect: %s", self.name, str(error)[:300])
                    raise ModelUnreachable(UNREACHABLE) from error
                tries = f" after {attempt + 1} attempts" if attempt else ""
                status = f" (HTTP {error.status_code})" if error.status_code else ""
                detail = str(error)[:500]
                raise ModelUnavailable(
                    f"the model {self.name} failed{tries}{status}: {detail}"
                ) from error
            if not isinstance(response, ChatCompletion):
                raise ModelUnavailable(f"the model {self.name} answered with a stream")
            return from_completion(response, self.name)

    async def aclose(self) -> None:
        """Close the provider's HTTP client."""
        client = getattr(self._llm, "client", None)
        close = getattr(client, "close", None)
        if close is not None:
            await close()


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def model_from_settings(settings: Settings) -> AnyLLMModel:
    """Build the configured model; raises `ModelNotConfigured` or `ModelEndpointRefused`."""
    return AnyLLMModel(settings)
