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
    before = (REPO / "README.md").read_text()
    subprocess.run([sys.executable, "scripts/settings_table.py", "--write"], cwd=REPO, check=True)
    after = (REPO / "README.md").read_text()
    if after != before:
        (REPO / "README.md").write_text(before)
    assert after == before, "README tables are stale: run scripts/settings_table.py --write"
