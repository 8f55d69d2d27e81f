"""The agent loop: model, tool calls, results, model again, until it answers without tools."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio

from sandbank.agent.history import replay
from sandbank.agent.interfaces import HistoryMessage, Recorder, Workbench
from sandbank.agent.model import (
    ChatMessage,
    Model,
    SystemMessage,
    ToolCallRequest,
    ToolResultMessage,
    UserMessage,
)
from sandbank.agent.prompt import WORKSPACE, AnswerFormat, build_system_prompt
from sandbank.agent.records import ToolOutput, ToolRecord, TraceRecord
from sandbank.agent.tools import (
    BASH_TOOL,
    EDITOR_TOOL,
    PYTHON_TOOL,
    TOOL_SPECS,
    ToolArgumentError,
    result_text,
    to_sandbox_call,
)
from sandbank.config import Settings
from sandbank.errors import RunCancelled, RunLimitReached, SandbankError
from sandbank.protocol.calls import RC_TIMEOUT
from sandbank.sandbox.host import manifest

# A workbench that ignores its timeout is abandoned this long after the deadline.
TOOL_TIMEOUT_GRACE_S = 5.0
# Previewing the files for the prompt gets at most this long (and never more than a tool call).
INSPECT_TIMEOUT_S = 30.0
EMPTY_ANSWER = "(The model gave an empty answer.)"

STATUS_STARTING = "looking at the files"
STATUS_THINKING = "thinking"
STATUS_CANCELLED = "cancelled"
INTERRUPTED = "interrupted: the run was stopped while this call ran"
_TOOL_STATUS = {BASH_TOOL: "running a command", EDITOR_TOOL: "editing files"}


@dataclass(frozen=True)
class RunLimits:
    max_steps: int = 20
    max_tokens: int = 400_000
    tool_timeout_s: float = 120.0
    run_timeout_s: float = 900.0
    tool_output_chars: int = 20_000
    history_chars: int = 100_000
    # Not limits, but per-server facts every run follows.
    answer_format: AnswerFormat = "markdown"
    libraries: str = ""  # the runtime image's packages, for the prompt

    @classmethod
    def from_settings(cls, settings: Settings) -> RunLimits:
        return cls(
            max_steps=settings.agent_max_steps,
            max_tokens=settings.agent_max_tokens,
            tool_timeout_s=settings.agent_tool_timeout_seconds,
            run_timeout_s=settings.agent_run_timeout_seconds,
            tool_output_chars=settings.agent_tool_output_chars,
            history_chars=settings.agent_history_chars,
            answer_format=settings.agent_answer_format,
            libraries=manifest.describe(manifest.load(settings.runtime_dir)),
        )


@dataclass
class TurnResult:
    """How a run ended. Everything it did was recorded as it happened, whatever the status."""

    status: Literal["done", "error", "cancelled"] = "error"
    answer: str | None = None
    error: SandbankError | None = None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    files: list[str] = field(default_factory=list)  # produced by the run's tool calls


class _Run:
    def __init__(
        self,
        model: Model,
        workbench: Workbench,
        recorder: Recorder,
        limits: RunLimits,
        result: TurnResult,
    ) -> None:
        self.model = model
        self.workbench = workbench
        self.recorder = recorder
        self.limits = limits
        self.result = result

    async def loop(self, messages: list[ChatMessage]) -> None:
        limits, result = self.limits, self.result
        for step in range(1, limits.max_steps + 1):
            await self.recorder.set_status(STATUS_THINKING)
            started = time.monotonic()
            reply = await self.model.complete(
                messages, TOOL_SPECS, functools.partial(self.recorder.text, step)
            )
            result.steps = step
            result.input_tokens += reply.usage.input_tokens
            result.output_tokens += reply.usage.output_tokens
            trace = TraceRecord(
                model=reply.model,
                step=step,
                input_tokens=reply.usage.input_tokens,
                output_tokens=reply.usage.output_tokens,
                latency_ms=round((time.monotonic() - started) * 1000),
                tool_calls=len(reply.tool_calls),
            )
            await self.recorder.add_message("trace", trace.model_dump_json(), internal=True)
            if not reply.tool_calls:
                result.answer = reply.text.strip() or EMPTY_ANSWER
                await self.recorder.add_message("assistant", result.answer, internal=False)
                result.status = "done"
                return
            if reply.text.strip():
                await self.recorder.add_message("assistant", reply.text, internal=True)
            spent = result.input_tokens + result.output_tokens
            if spent > limits.max_tokens:
                raise RunLimitReached(
                    f"token limit reached: {spent} tokens spent, the limit is "
                    f"{limits.max_tokens} (SANDBANK_AGENT_MAX_TOKENS)",
                    limit="agent_max_tokens",
                )
            messages.append(reply.as_message())
            for request in reply.tool_calls:
                messages.append(await self.tool(request, step))
        raise RunLimitReached(
            f"step limit reached: {limits.max_steps} model calls without a final answer "
            "(SANDBANK_AGENT_MAX_STEPS)",
            limit="agent_max_steps",
        )

    async def tool(self, request: ToolCallRequest, step: int) -> ToolResultMessage:
        code = request.arguments.get("code")
        record = ToolRecord(
            tool=request.name,
            call_id=request.id,
            step=step,
            input=request.arguments,
            python_code=code if request.name == PYTHON_TOOL and isinstance(code, str) else None,
        )
        try:
            call = to_sandbox_call(request)
        except ToolArgumentError as error:
            record.error = f"bad arguments: {error}"
            await self.recorder.add_message("tool", record.model_dump_json(), internal=True)
            text = f"Error: {error}. Nothing was run; correct the call and try again."
            return ToolResultMessage(tool_call_id=request.id, name=request.name, content=text)

        await self.recorder.set_status(_TOOL_STATUS.get(request.name, "running code"))
        timeout = self.limits.tool_timeout_s
        started = time.monotonic()
        try:
            with anyio.move_on_after(timeout + TOOL_TIMEOUT_GRACE_S) as scope:
                exec_result = await self.workbench.execute(call, timeout)
        except anyio.get_cancelled_exc_class():
            # The run was cancelled (or ran out of time) mid-call: keep the call's code on record.
            record.error = INTERRUPTED
            with anyio.CancelScope(shield=True):
                await self.recorder.add_message("tool", record.model_dump_json(), internal=True)
            raise
        elapsed = time.monotonic() - started
        # 124 alone could be a user's own `timeout` command; the wall clock tells them apart.
        timed_out = scope.cancelled_caught or (
            exec_result.return_code == RC_TIMEOUT and elapsed >= timeout * 0.9
        )
        if not scope.cancelled_caught:
            record.output = ToolOutput(
                stdout=exec_result.stdout,
                stderr=exec_result.stderr,
                return_code=exec_result.return_code,
                files=list(exec_result.files),
                duration_ms=exec_result.duration_ms,
                displays=exec_result.displays,
            )
            self.result.files += [f for f in exec_result.files if f not in self.result.files]
        if timed_out:
            message = (
                f"tool-call time limit reached: a {request.name} call ran longer than "
                f"{timeout:g} s (SANDBANK_AGENT_TOOL_TIMEOUT_SECONDS)"
            )
            record.error = message
            await self.recorder.add_message("tool", record.model_dump_json(), internal=True)
            raise RunLimitReached(message, limit="agent_tool_timeout_seconds")
        await self.recorder.add_message("tool", record.model_dump_json(), internal=True)
        text = result_text(exec_result, self.limits.tool_output_chars)
        return ToolResultMessage(tool_call_id=request.id, name=request.name, content=text)


async def run_turn(
    *,
    model: Model,
    workbench: Workbench,
    recorder: Recorder,
    question: str,
    history: Sequence[HistoryMessage] = (),
    limits: RunLimits | None = None,
    sandbox_recreated: bool = False,
    cancel: anyio.Event | None = None,
    inspect_root: str = WORKSPACE,
    network: str = "none",
) -> TurnResult:
    """Answer `question` (already stored by the caller) by working in the sandbox.

    Records every step through `recorder` as it happens and returns how the run ended; a
    limit, a model failure or a sandbox failure ends it as `error` with a `SandbankError`
    naming the cause; `network` is what the sandbox may reach (its egress policy, told to the
    model). Setting `cancel` stops the run where it is (awaits are abandoned, the
    sandbox is not interrupted by the loop) and ends it as `cancelled`.
    """
    limits = limits or RunLimits()
    result = TurnResult()
    run = _Run(model, workbench, recorder, limits, result)

    async def body() -> None:
        with anyio.move_on_after(limits.run_timeout_s) as deadline:
            try:
                await recorder.set_status(STATUS_STARTING)
                system = await build_system_prompt(
                    workbench,
                    sandbox_recreated=sandbox_recreated,
                    timeout_s=min(INSPECT_TIMEOUT_S, limits.tool_timeout_s),
                    inspect_root=inspect_root,
                    answer_format=limits.answer_format,
                    libraries=limits.libraries,
                    network=network,
                )
                earlier = replay(
                    history,
                    budget_chars=limits.history_chars,
                    tool_output_chars=limits.tool_output_chars,
                )
                await run.loop([SystemMessage(system), *earlier, UserMessage(question)])
            except SandbankError as error:
                result.status, result.error = "error", error
        if deadline.cancelled_caught:
            result.status = "error"
            result.error = RunLimitReached(
                f"run time limit reached: the answer took longer than {limits.run_timeout_s:g} s "
                "(SANDBANK_AGENT_RUN_TIMEOUT_SECONDS)",
                limit="agent_run_timeout_seconds",
            )

    cancelled = False
    async with anyio.create_task_group() as group:

        async def watch(event: anyio.Event) -> None:
            nonlocal cancelled
            await event.wait()
            cancelled = True
            group.cancel_scope.cancel()

        if cancel is not None:
            group.start_soon(watch, cancel)
        await body()
        group.cancel_scope.cancel()  # the run is over: stop watching

    if cancelled and result.status != "done":
        result.status, result.error = "cancelled", RunCancelled()
        await recorder.set_status(STATUS_CANCELLED)
    elif result.error is not None:
        await recorder.set_status(f"error: {result.error.message}")
    return result
