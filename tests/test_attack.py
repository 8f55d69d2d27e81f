"""`sandbank doctor --attack`: the battery holds against every isolation, and detects: against
the unisolated reference most attempts succeed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sandbank.attack import ATTEMPTS, run_attack
from tests.support import gvisor_missing, settings
from tests.tiers import param

GVISOR = param(
    "gvisor",
    "root",
    id="gvisor",
)


@pytest.mark.parametrize(
    "isolation",
    [param("fork", "root", id="fork"), GVISOR],
)
def test_no_attempt_escapes_an_isolated_sandbox(isolation: str, tmp_path: Path) -> None:
    if isolation == "gvisor" and (why := gvisor_missing()) is not None:
        pytest.skip(why)
    out = io.StringIO()
    code = run_attack(settings(tmp_path, gvisor_platform="ptrace"), [isolation], out)
    assert code == 0, out.getvalue()
    assert f"{isolation}: 0 of {len(ATTEMPTS)} attempts succeeded" in out.getvalue()
    assert out.getvalue().count(f"{isolation:<7} held") == len(ATTEMPTS)


@pytest.mark.parametrize("isolation", [param("none", "root", id="none")])
def test_the_battery_detects_escapes_from_the_unisolated_reference(
    isolation: str, tmp_path: Path
) -> None:
    out = io.StringIO()
    assert run_attack(settings(tmp_path), [isolation], out) == 1
    # Unisolated, the sandbox can trace the battery's own process; it must not be left traced
    # (a tracee stops at its next signal with nobody to resume it: the run would hang).
    assert "left this process traced" not in out.getvalue()
    assert "none    ESCAPED  ptrace the server" in out.getvalue()
    escaped = out.getvalue().count("none    ESCAPED")
    assert escaped >= len(ATTEMPTS) - 3, out.getvalue()
    assert f"none: {escaped} of {len(ATTEMPTS)} attempts succeeded" in out.getvalue()
