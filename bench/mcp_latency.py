"""A warm tool call over MCP (streamable HTTP) beside the same call on the code-execution API;
prints medians side by side. (Not bench/mcp.py: a script of that name hides the `mcp` package.)

    .venv/bin/python bench/mcp_latency.py --url http://127.0.0.1:8080 [--rounds 500] [--token T]

On one session, interleaved (so the machine's noise hits both alike), a warm `print(1)`:
- the code-execution API: `POST /sessions/{id}/exec`;
- MCP: `tools/call` of `run_python` with the session's handle, one JSON-RPC POST to `/mcp` as the
  2026-07-28 revision has it (headers and `_meta`), and the same without a handle (the
  caller's default session);
both from the standard library's keep-alive `http.client`, so the figures are the server's.
Then the official `mcp` client's `call_tool` over the same endpoint, which adds its own cost
(its models, validation and httpx2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import http_protocol  # bench/, beside this script

CODE = "print(1)"
MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}


class Client(http_protocol.Client):
    """bench/http_protocol.py's client, with a raw MCP `tools/call`."""

    def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": META},
        }
        headers = {
            **self.headers,
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": MODERN,
            "mcp-method": "tools/call",
            "mcp-name": name,
        }
        self.conn.request("POST", "/mcp", body=json.dumps(body), headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status != 200:
            raise RuntimeError(f"/mcp: {response.status} {raw[:200]!r}")
        result: dict[str, Any] = json.loads(raw)["result"]
        if result.get("isError"):
            raise RuntimeError(f"/mcp: {result}")
        return result


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def sdk_calls(url: str, token: str | None, sid: str, rounds: int) -> list[float]:
    import httpx2
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    samples = []
    async with httpx2.AsyncClient(headers=headers) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with McpClient(transport) as client:
            for i in range(rounds + 20):
                t0 = time.perf_counter()
                r = await client.call_tool("run_python", {"code": CODE, "session_id": sid})
                if i >= 20:
                    samples.append(time.perf_counter() - t0)
                assert not r.is_error
    return samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--token")
    args = ap.parse_args()
    client = Client(args.url, args.token)
    sid = client.create()
    try:
        runs: dict[str, Callable[[], object]] = {
            "code-execution API": lambda: client.execute(sid, CODE),
            "MCP, with the handle": lambda: client.tool(
                "run_python", {"code": CODE, "session_id": sid}
            ),
            "MCP, default session": lambda: client.tool("run_python", {"code": CODE}),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for i in range(args.rounds + 20):  # the first 20 warm up
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                if i >= 20:
                    times[name].append(time.perf_counter() - t0)
        sdk = asyncio.run(sdk_calls(args.url, args.token, sid, args.rounds))
    finally:
        client.destroy(sid)
    base = median_ms(times["code-execution API"])
    print(f"warm print(1), {args.rounds} interleaved rounds, medians:")
    for name, samples in [*times.items(), ("MCP, the mcp SDK's client", sdk)]:
        med = median_ms(samples)
        print(f"  {name:<30} {med:8.3f} ms   {med - base:+7.3f} ms   n={len(samples)}")


if __name__ == "__main__":
    main()
