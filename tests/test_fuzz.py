"""Schemathesis against both served OpenAPI documents: whatever it sends, never a 5xx.

Bounded: a fixed number of examples per operation and a time limit. Its other findings are
schema-expressiveness artefacts, kept out on purpose (a per-command field the contract's
prose requires, a hint the prose says must never fail a request, multipart fields that are
always strings); the 5xx check is the one that must stay at zero.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import Server, data_dir

ST = str(Path(sys.executable).with_name("st"))


# Streams that last as long as the client stays (a watch answers 200 and follows changes until
# the client leaves): each example of one held the run for schemathesis's whole request timeout
# (12 of them, 2 of the test's 2.3 minutes). Their refusals: tests/execapi/test_http_contract.py.
STREAMS = ("WatchDir",)


def fuzz(url: str, *headers: str) -> str:
    argv = [ST, "run", url, "--checks", "not_a_server_error", "--max-examples", "8",
            "--phases", "examples,fuzzing", "--workers", "1", "--seed", "1",
            "--request-timeout", "5"]  # fmt: skip
    for operation in STREAMS:
        argv += ["--exclude-operation-id", operation]
    for header in headers:
        argv += ["-H", header]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd="/tmp")
    return done.stdout + done.stderr


def server_errors(report: str) -> list[str]:
    """5xx answers, but 503: a documented refusal (no model here, or at capacity)."""
    return re.findall(r"\[5(?!03)\d\d\][^\n]*", report)


@pytest.mark.timeout(600)
def test_no_request_makes_either_api_answer_5xx(machine: None) -> None:
    with data_dir() as d:
        server = Server(d, pool_size=1).start()
        try:
            report = fuzz(f"{server.base_url}/openapi.json")
            assert "Tested:" in report, report[-3000:]
            assert server_errors(report) == [], report[-5000:]
            key = server.cli("users", "create", "fuzzer").strip().splitlines()[-1]
            report = fuzz(f"{server.base_url}/api/openapi.json", f"Authorization: Bearer {key}")
            assert "Tested:" in report, report[-3000:]
            assert server_errors(report) == [], report[-5000:]
        finally:
            server.stop()
        assert "Traceback" not in server.log.read_text()
