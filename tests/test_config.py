"""Every setting is documented, and the README's tables are the generated ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from sandbank.config import Settings
from tests.support import REPO


def test_every_setting_is_in_the_readme_table() -> None:
    readme = (REPO / "README.md").read_text()
    for name, field in Settings.model_fields.items():
        assert f"`SANDBANK_{name.upper()}`" in readme, name
        assert field.description, f"{name} has no description"


def test_readme_tables_are_up_to_date() -> None:
    """Compares only: the checkout's README is never written by a test."""
    done = subprocess.run(
        [sys.executable, "scripts/settings_table.py", "--check"], cwd=REPO, capture_output=True
    )
    assert done.returncode == 0, "README tables are stale: run scripts/settings_table.py --write"


def test_isolation_choices_and_tenant_isolation_are_checked_at_start() -> None:
    ok = Settings(
        isolation="fork", isolation_choices="gvisor, fork", tenant_isolation="ABCDEF12=gvisor"
    )
    assert ok.isolations() == ["fork", "gvisor"]  # the default first, each once
    for bad, says in (
        ({"isolation_choices": "none"}, "`none`"),
        ({"isolation_choices": "bwrap"}, "same isolation"),
        ({"isolation_choices": "microvm"}, "'microvm' is not one of"),
        ({"tenant_isolation": "abcdef12=gvisor"}, "this server offers fork"),
        ({"tenant_isolation": "abc=fork"}, "not TENANT=ISOLATION"),
        ({"tenant_isolation": "abcdef12=vm"}, "not TENANT=ISOLATION"),
    ):
        with pytest.raises(ValidationError, match=says):
            Settings(isolation="fork", **bad)  # type: ignore[arg-type]
    # A front offers no sandbox itself: its rule names what its nodes offer.
    front = Settings(role="front", fleet_token="t" * 32, tenant_isolation="abcdef12=gvisor")
    assert front.tenant_isolation == "abcdef12=gvisor"
