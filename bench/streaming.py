"""Streaming and display figures; prints medians.

    .venv/bin/python bench/streaming.py [--url http://127.0.0.1:8080] [--rounds 30] [--token T]

Over HTTP (a running server speaking the code-execution protocol): the time to the first byte
and to the first stdout event of a streamed Execute that prints a line then sleeps, and a warm
`print(1)` plain and streamed. In the runtime's Python (the worker's own code, no sandbox): what
the notebook machinery (IPython's shell, display bundles, figures) adds to a warm `print(1)`
cell, against the same cell as a bare `exec`, and what a call's output capture costs (its
begin and end: what the pipes behind fds 1 and 2 hold is taken under their locks).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import http_protocol  # bench/, beside this script

REPO = Path(__file__).resolve().parent.parent

STREAMED = "import time\nprint('first line', flush=True)\ntime.sleep(0.5)\nprint('second')"


def median_ms(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:9.4f} ms   n={len(samples)}"


class Client(http_protocol.Client):
    """bench/http_protocol.py's client, with a streamed Execute."""

    def streamed(self, sid: str, code: str) -> tuple[float, float, float]:
        """(first byte, first stdout event, whole) seconds of a streamed Execute."""
        body = json.dumps({"tool": "code_execution", "input": {"code": code}})
        headers = {**self.headers, "accept": "text/event-stream"}
        started = time.perf_counter()
        self.conn.request("POST", f"/sessions/{sid}/exec", body=body, headers=headers)
        response = self.conn.getresponse()
        first_byte = first_out = 0.0
        while line := response.readline():
            now = time.perf_counter() - started
            first_byte = first_byte or now
            if line.startswith(b"event: stdout"):
                first_out = first_out or now
        return first_byte, first_out, time.perf_counter() - started


def over_http(url: str, token: str | None, rounds: int) -> None:
    client = Client(url, token)
    sid = client.call("POST", "/sessions", {})["session_id"]
    plain, streamed, first_bytes, first_outs, wholes = [], [], [], [], []
    try:
        client.call("POST", f"/sessions/{sid}/exec", {"tool": "code_execution",
                                                      "input": {"code": "print(0)"}})  # fmt: skip
        for _ in range(rounds):
            t0 = time.perf_counter()
            client.call("POST", f"/sessions/{sid}/exec",
                        {"tool": "code_execution", "input": {"code": "print(1)"}})  # fmt: skip
            plain.append(time.perf_counter() - t0)
            streamed.append(client.streamed(sid, "print(1)")[2])
            first_byte, first_out, whole = client.streamed(sid, STREAMED)
            first_bytes.append(first_byte)
            first_outs.append(first_out)
            wholes.append(whole)
    finally:
        client.call("DELETE", f"/sessions/{sid}")
    print(f"{'warm print(1), plain':<44} {median_ms(plain)}")
    print(f"{'warm print(1), streamed':<44} {median_ms(streamed)}")
    print(f"{'streamed exec: first byte':<44} {median_ms(first_bytes)}")
    print(f"{'streamed exec: first stdout event':<44} {median_ms(first_outs)}")
    print(f"{'streamed exec: whole (prints, sleeps 0.5 s)':<44} {median_ms(wholes)}")


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def in_process(rounds: int) -> None:
    """Worker-side figures, in the runtime's Python (IPython is there, not in the server's)."""
    try:
        import IPython  # noqa: F401
    except ImportError:
        runtime = REPO / ".runtime" / "bin" / "python3"
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        argv = [str(runtime), __file__, "--rounds", str(rounds), "--worker-only"]
        subprocess.run(argv, env=env, check=True)
        return
    from sandbank.sandbox.inside import notebook, pyexec
    from sandbank.sandbox.inside.capture import Capture

    saved = os.dup(1), os.dup(2)  # fds 1 and 2 are the capture's pipes meanwhile
    runner = pyexec.PythonRunner(notebook.session_shell(), forked=lambda: False)
    namespace: dict[str, object] = {}
    results: dict[str, list[float]] = {}
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            runner.run("print(0)")
            for _ in range(3):  # interleaved, so drift hits both alike
                results.setdefault("print(1), notebook (IPython)", []).extend(
                    timed(lambda: runner.run("print(1)"), rounds)
                )
                results.setdefault("print(1), bare exec", []).extend(
                    timed(lambda: exec(compile("print(1)", "<c>", "exec"), namespace), rounds)  # noqa: S102
                )
                results.setdefault("echo 1, notebook (IPython)", []).extend(
                    timed(lambda: runner.run("1"), rounds)
                )
        Capture(1 << 20)  # the drain threads start once
        results["capture (a call's begin and end)"] = timed(
            lambda: Capture(1 << 20).__enter__().__exit__(), rounds
        )
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # the capture's, meanwhile
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    for name, samples in results.items():
        print(f"{'cell ' + name:<44} {median_ms(samples)}")
    overhead = statistics.median(results["print(1), notebook (IPython)"]) - statistics.median(
        results["print(1), bare exec"]
    )
    print(f"{'notebook machinery on print(1) (difference)':<44} {overhead * 1000:+10.4f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a server speaking the code-execution protocol")
    ap.add_argument("--token")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--worker-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_only:
        in_process(args.rounds)
        return
    in_process(max(args.rounds, 1000))
    if args.url:
        over_http(args.url, args.token, args.rounds)


if __name__ == "__main__":
    main()
