"""The system prompt: file previews gathered by a snippet run through the workbench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbank.agent.inspect_snippet import MARKER
from sandbank.agent.loop import RunLimits
from sandbank.agent.prompt import build_system_prompt
from sandbank.config import Settings
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.host import manifest
from tests.agent.fakes import FakeWorkbench

pytestmark = pytest.mark.anyio


async def prompt(workbench: FakeWorkbench, libraries: str = "pandas 3.1.1, sympy 1.14.0") -> str:
    return await build_system_prompt(
        workbench, sandbox_recreated=False, inspect_root=str(workbench.root), libraries=libraries
    )


async def test_the_prompt_names_the_environment_without_files(workbench: FakeWorkbench) -> None:
    text = await prompt(workbench)
    assert "/workspace" in text and "no internet" in text.lower()
    assert "Installed Python packages (and their dependencies): pandas 3.1.1, sympy 1.14.0." in text
    assert "![chart](figure_1.png)" in text and "Markdown" in text
    assert "There are no uploaded files yet." in text
    assert workbench.calls == []


async def test_tabular_files_are_described_by_code_run_in_the_sandbox(
    workbench: FakeWorkbench,
) -> None:
    (workbench.root / "sales.csv").write_text("region,amount\nnorth,10\nsouth,20\n")
    (workbench.root / "people.tsv").write_text("name\tage\nada\t36\n")
    (workbench.root / "items.json").write_text(json.dumps([{"sku": "a1", "qty": 2}]))
    (workbench.root / "events.jsonl").write_text('{"kind": "click"}\n{"kind": "view"}\n')
    (workbench.root / "notes.txt").write_text("hello")
    text = await prompt(workbench)

    (call,) = workbench.calls
    assert isinstance(call, PythonCall) and "_sandbank_inspect" in call.code
    assert "- `sales.csv` (32 bytes)" in text
    assert "  | region | amount |" in text and "  | south | 20 |" in text
    assert "  | name | age |" in text and "  | ada | 36 |" in text
    assert "`items.json` (25 bytes): a JSON list of 1 items" in text and "| a1 | 2 |" in text
    assert "`events.jsonl` (35 bytes): JSON lines" in text and "| click |" in text
    assert "- `notes.txt` (5 bytes)" in text
    assert "not instructions" in text
    assert "_sandbank_inspect" not in workbench.namespace  # the interpreter is left clean


async def test_huge_and_hostile_files_do_not_break_the_preview(workbench: FakeWorkbench) -> None:
    (workbench.root / "wide.csv").write_text(",".join(f"c{i}" for i in range(5000)) + "\n1,2\n")
    (workbench.root / "long.csv").write_text("a\n" + "x" * 3_000_000 + "\n")
    (workbench.root / "broken.json").write_text("{not json")
    (workbench.root / "fake.parquet").write_bytes(b"PAR1 not really")
    (workbench.root / "fake.xlsx").write_bytes(b"PK not really")
    (workbench.root / "sub").mkdir()
    (workbench.root / "sub" / "inner.csv").write_text("k\nv\n")
    text = await prompt(workbench)

    assert "`broken.json` (9 bytes): error: JSONDecodeError" in text
    assert "`fake.parquet`" in text and "`fake.xlsx`" in text
    assert "| c49 |" in text and "c50" not in text  # at most 50 columns
    assert "- `long.csv` (2.9 MB)" in text and "x" * 41 not in text  # cells are cut
    assert "- `sub/inner.csv`" in text and "| k |" in text
    assert len(text) < 20_000


async def test_the_preview_output_is_capped(workbench: FakeWorkbench) -> None:
    for i in range(60):
        (workbench.root / f"t{i:02}.csv").write_text(",".join(["y" * 60] * 50) + "\n")
    await prompt(workbench)
    result = await workbench.execute(workbench.calls[0], 30)
    payload = json.loads(result.stdout.split(MARKER, 1)[1])
    assert len(result.stdout) < 13_000
    assert payload["not_described"] > 20  # 40 files at most, and fewer once output is full


async def test_a_failing_preview_still_lists_names_and_sizes(workbench: FakeWorkbench) -> None:
    (workbench.root / "data.csv").write_text("a\n1\n")
    workbench.namespace["__builtins__"] = {}  # the snippet cannot even import
    text = await prompt(workbench)
    assert "- `data.csv` (4 bytes)" in text and "| a |" not in text


async def test_the_tags_format_asks_for_the_spec_clients_tags(workbench: FakeWorkbench) -> None:
    text = await build_system_prompt(
        workbench, sandbox_recreated=False, inspect_root=str(workbench.root), answer_format="tags"
    )
    for tag in ("<png>figure_1.png</png>", "<plotly>plotly_1.json</plotly>", "<md>report.md</md>"):
        assert tag in text
    assert "![chart]" not in text and "plotly" in text


async def test_the_prompt_says_what_the_network_policy_allows(workbench: FakeWorkbench) -> None:
    allowed = await build_system_prompt(
        workbench,
        sandbox_recreated=False,
        inspect_root=str(workbench.root),
        network="api.example.com:443, *.pypi.org:443",
    )
    assert "no internet" not in allowed.lower()
    assert "only to api.example.com:443, *.pypi.org:443 (HOST:PORT)" in allowed
    assert "HTTP and HTTPS only, through a filtering proxy" in allowed
    closed = await build_system_prompt(
        workbench, sandbox_recreated=False, inspect_root=str(workbench.root), network="none"
    )
    assert "Network: none: there is no internet access." in closed


async def test_the_packages_named_are_the_runtime_images_own_list(
    workbench: FakeWorkbench, tmp_path: Path
) -> None:
    runtime = Settings(data_dir=tmp_path).runtime_dir  # the one `make install` built
    listed = RunLimits.from_settings(Settings(data_dir=tmp_path, runtime_dir=runtime)).libraries
    packages = manifest.load(runtime)
    assert listed == manifest.describe(packages) and packages
    for name in ("pandas", "scikit-learn", "ipython", "requests", "opencv-python-headless"):
        version = next(p.version for p in packages if p.name == name)
        assert f"{name} {version}" in listed
    assert "numpy-" not in listed and "jedi" not in listed  # dependencies are not listed
    text = await prompt(workbench, listed)
    assert f"Installed Python packages (and their dependencies): {listed}." in text
    # A runtime built before it had a list: the model is told where to look instead.
    empty = RunLimits.from_settings(Settings(data_dir=tmp_path, runtime_dir=tmp_path)).libraries
    assert empty == "" and "`pip list` shows" in await prompt(workbench, empty)
