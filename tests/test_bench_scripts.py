"""The benchmarks stay runnable: every script in bench/ imports against today's package."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


@pytest.fixture
def bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # scripts import their siblings (capacity, ...)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_imports_without_running(bench_on_path: None, name: str) -> None:
    sys.modules.pop(name, None)
    module = importlib.import_module(name)
    assert module.__doc__, f"bench/{name}.py says what it measures and how to run it"
    sys.modules.pop(name, None)
