"""Scripted fake LLM servers on loopback: OpenAI's chat completions and Anthropic's messages."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, Any]]  # HTTP status, JSON body


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


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
