"""Scripted fake LLM servers on loopback: OpenAI's chat completions and Anthropic's messages,
whole or, when the request asks for `stream`, as Server-Sent Events cut from the same reply."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, Any]]  # HTTP status, JSON body
# A reply's body may carry this key (removed before sending): seconds between streamed chunks.
CHUNK_DELAY = "_fake_chunk_delay"
_PIECES = re.compile(r"\s*\S+\s*|\s+")


def pieces(text: str, size: int = 1) -> list[str]:
    """`text` cut into runs of `size` words (with their spaces): they join back exactly."""
    words = _PIECES.findall(text)
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)]


@dataclass
class FakeLLMServer:
    """A loopback server answering POSTs; what it was sent is kept for assertions."""

    script: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    url: str = ""

    def next_reply(self) -> Reply:
        """The scripted replies in order (the last one repeats)."""
        index = min(len(self.requests) - 1, len(self.script) - 1)
        return self.script[index]


@contextmanager
def serve(script: list[Reply]) -> Iterator[FakeLLMServer]:
    with serve_replies(lambda fake, path, body: fake.next_reply(), script) as fake:
        yield fake


@contextmanager
def serve_replies(
    reply: Callable[[FakeLLMServer, str, dict[str, Any]], Reply], script: list[Reply] | None = None
) -> Iterator[FakeLLMServer]:
    """Answers each POST with `reply(server, path, body)`."""
    fake = FakeLLMServer(script or [])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            fake.paths.append(self.path)
            fake.requests.append(body)
            status, payload = reply(fake, self.path, body)
            payload = dict(payload)
            delay = float(payload.pop(CHUNK_DELAY, 0.0))
            if body.get("stream") and status == 200:
                anthropic = self.path.endswith("/messages")
                events = anthropic_events(payload) if anthropic else openai_chunks(payload, body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for name, data_ in events:
                    head = f"event: {name}\n" if name else ""
                    self.wfile.write(f"{head}data: {data_}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(delay)
                self.close_connection = True
                return
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll: `shutdown` waits for one, and the default (0.5 s) was paid by every test.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def openai_chunks(body: dict[str, Any], request: dict[str, Any]) -> list[tuple[str, str]]:
    """A chat completion as the `chat.completion.chunk` events that stream it."""
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    message = body["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str, str]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return "", json.dumps({**head, "choices": [choice]})

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in pieces(message.get("content") or "")]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        start = {"name": function["name"], "arguments": ""}
        events.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": start}]}))  # fmt: skip
        for part in pieces(function["arguments"], 3):
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
            )
    events.append(chunk({}, body["choices"][0]["finish_reason"]))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(("", json.dumps({**head, "choices": [], "usage": body["usage"]})))
    events.append(("", "[DONE]"))
    return events


def anthropic_events(body: dict[str, Any]) -> list[tuple[str, str]]:
    """A message as the events of Anthropic's streamed Messages API."""
    usage = body["usage"]
    start = {**body, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            events.append({"type": "content_block_start", "index": index,
                           "content_block": {"type": "text", "text": ""}})  # fmt: skip
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            empty = {**block, "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": empty})
            arguments = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(arguments, 3)]
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "usage": {"output_tokens": usage["output_tokens"]},
                   "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None}})  # fmt: skip
    events.append({"type": "message_stop"})
    return [(e["type"], json.dumps(e)) for e in events]


def openai_tool_call(code: str) -> Reply:
    return 200, {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-fake",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "type": "function",
                            "function": {
                                "name": "code_execution",
                                "arguments": json.dumps({"code": code}),
                            },
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


def openai_answer(text: str) -> Reply:
    return 200, {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 2,
        "model": "gpt-fake",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
            }
        ],
        "usage": {"prompt_tokens": 150, "completion_tokens": 10, "total_tokens": 160},
    }


def openai_error(status: int) -> Reply:
    return status, {"error": {"message": f"fake failure {status}", "type": "server_error"}}


def anthropic_tool_use(code: str) -> Reply:
    return 200, {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": [
            {"type": "text", "text": "I will compute it."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "code_execution",
                "input": {"code": code},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 50, "output_tokens": 12},
    }


def anthropic_answer(text: str) -> Reply:
    return 200, {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 80, "output_tokens": 6},
    }


def anthropic_error(status: int) -> Reply:
    return status, {"type": "error", "error": {"type": "api_error", "message": "fake failure"}}
