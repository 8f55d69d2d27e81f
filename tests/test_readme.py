"""The README's commands work as written: `sandbank` as the install step leaves it, admin commands
with the data directory they need, and every `SANDBANK_*` it names a setting (or the installer's)."""

from __future__ import annotations

import re

from sandbank.config import NOT_SETTINGS, Settings
from tests.support import REPO

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```sh\n(.*?)```", README, re.S)
ADMIN = re.compile(r"\bsandbank (users|keys|sessions list)(?! --exec)")


def command_lines() -> list[str]:
    lines = []
    for block in BLOCKS:
        for line in block.splitlines():
            code = line.split("  #")[0].strip()
            if re.search(r"\bsandbank (serve|exec|doctor|users|keys|sessions|--version)", code):
                lines.append(code)
    return lines


def test_every_sandbank_command_is_the_one_the_install_step_made() -> None:
    lines = command_lines()
    assert len(lines) > 15
    for line in lines:
        if line.startswith("kubectl"):
            assert "-- sandbank " in line  # inside the image, where it is on the PATH
            continue
        assert re.search(r"(^|[\s;&|(])\.venv/bin/sandbank ", line), line
        assert not re.search(r"(^|[\s;&|(])sandbank ", line), line


def test_admin_commands_name_their_data_dir() -> None:
    for line in command_lines():
        if ADMIN.search(line) and not line.startswith("kubectl"):
            assert "--data-dir" in line, line


def test_every_variable_the_readme_names_exists() -> None:
    known = {f"SANDBANK_{name.upper()}" for name in Settings.model_fields} | NOT_SETTINGS
    named = set(re.findall(r"SANDBANK_[A-Z_]+[A-Z]", README))
    examples = {"SANDBANK_TEST_BACKENDS", "SANDBANK_EXEC_TOKEN"}  # a test knob; the typo shown
    assert named - known - examples == set()
