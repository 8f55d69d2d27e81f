"""Every setting is documented, and the README's tables are the generated ones."""

from __future__ import annotations

import subprocess
import sys

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
