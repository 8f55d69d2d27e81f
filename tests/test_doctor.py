"""`sandbank doctor`: each check says ok or FAIL with the fix; any failure exits non-zero."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbank import doctor
from sandbank.sandbox.host import manifest
from sandbank.store import open_store
from tests.agent.fake_llm_servers import openai_answer, serve
from tests.support import data_dir, free_port, settings

SANDBANK = str(Path(sys.executable).with_name("sandbank"))


def lines_of(text: str) -> dict[str, str]:
    """Check name -> its line (and its fix line, when there is one)."""
    found: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith(" ") and last:
            found[last] += "\n" + line.strip()
            continue
        status, _, rest = line.partition("  ")
        name = rest.strip().split("  ")[0]
        last = name
        found[name] = f"{status.strip()} {rest.strip()}"
    return found


def test_a_healthy_machine_passes_and_a_sandbox_really_imports(
    monkeypatch: pytest.MonkeyPatch, machine: None
) -> None:
    # The real list takes ~20 s of imports; a smaller one proves the same path.
    monkeypatch.setattr(doctor, "modules_to_import", lambda settings: ["json", "numpy"])
    out = io.StringIO()
    with data_dir() as data:
        code = doctor.run_checks(settings(data, port=free_port()), model=False, out=out)
    report = lines_of(out.getvalue())
    assert code == 0, out.getvalue()
    for name in ("root", "isolation tools", "cgroups", "loop devices", "data dir", "storage"):
        assert report[name].startswith("ok "), report[name]
    assert report["runtime image"].startswith("ok ")
    assert "a sandbox imports all 2 modules of the image" in report["runtime image"]
    assert "empty; `sandbank serve` creates the schema" in report["database"]
    assert report["model"].startswith("warn ")
    assert out.getvalue().rstrip().endswith("all checks passed")


def test_a_missing_module_in_the_runtime_fails_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, machine: None
) -> None:
    monkeypatch.setattr(
        doctor, "modules_to_import", lambda settings: ["json", "no_such_module_here"]
    )
    with data_dir() as data, pytest.raises(doctor.Failed) as caught:
        asyncio.run(doctor.check_runtime(settings(data)))
    assert "No module named 'no_such_module_here'" in caught.value.detail
    assert caught.value.fix == "rebuild the runtime image: `make clean install`"


def test_the_modules_imported_are_the_runtime_images_own_list() -> None:
    with data_dir() as data:
        s = settings(data)
        names = doctor.modules_to_import(s)
    assert names == manifest.modules(manifest.load(s.runtime_dir))
    assert {"pandas", "sklearn", "IPython", "cv2", "bs4", "yaml", "docx", "xgboost"} <= set(names)


def test_failures_are_each_named_with_a_fix_and_exit_1() -> None:
    with data_dir() as data:
        bad = settings(
            Path("/etc/hostname/data"),
            runtime_dir=data / "no-runtime",
            database_url="mysql://db/x",
            host="0.0.0.0",
            exec_tokens_file=data / "missing-tokens",
        )
        out = io.StringIO()
        code = doctor.run_checks(bad, model=False, out=out)
    report = lines_of(out.getvalue())
    assert code == 1
    assert report["data dir"].startswith("FAIL ")
    assert "/etc/hostname is a regular file" in report["data dir"]
    assert report["runtime image"].startswith("FAIL ")
    assert "fix: run `make install`, or set SANDBANK_RUNTIME_DIR" in report["runtime image"]
    assert report["database"].startswith("FAIL ")
    assert "unsupported database URL scheme" in report["database"]
    assert report["listening"].startswith("FAIL ")
    assert "SANDBANK_EXEC_TOKENS_FILE cannot be read" in report["listening"]
    assert "check(s) failed: " in out.getvalue()


def test_an_exposed_unauthenticated_api_fails() -> None:
    refused = pytest.raises(doctor.Failed, match="refusing to serve the code-execution API")
    with data_dir() as data, refused:
        doctor.check_listening(settings(data, host="0.0.0.0"))


def test_a_migrated_database_is_current() -> None:
    with data_dir() as data:
        s = settings(data)

        # Let the server's own migrations create the schema, then read it as the doctor.
        async def migrate() -> None:
            await (open_store(s)).close()

        asyncio.run(migrate())
        assert "migrations current" in doctor.check_database(s)


def test_the_model_gets_one_token_only_when_asked() -> None:
    with data_dir() as data, serve([openai_answer("OK")]) as fake:
        s = settings(
            data,
            llm_model="openai:gpt-fake",
            llm_base_url=fake.url + "/v1",
            llm_api_key="fake-key",
        )
        with pytest.raises(doctor.Skipped):
            asyncio.run(doctor.model_check(False)(s))  # type: ignore[arg-type]
        assert fake.requests == []
        seen: str = asyncio.run(doctor.model_check(True)(s))  # type: ignore[arg-type]
    assert "openai:gpt-fake at " in seen and " answered in " in seen
    assert len(fake.requests) == 1
    sent = fake.requests[0]
    assert sent.get("max_tokens", sent.get("max_completion_tokens")) == 1


def test_the_command_exits_1_on_a_failure() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
    env["SANDBANK_RUNTIME_DIR"] = "/nonexistent-runtime"
    done = subprocess.run(
        [SANDBANK, "doctor", "--data-dir", "/etc/hostname/x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  data dir" in done.stdout
    assert "Traceback" not in done.stderr


def test_cgroups_without_favordynmods_warn_only_when_the_server_will_not_set_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandbank.sandbox.host import cgroups

    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda info, root: ("/sys/fs/cgroup/u", "rw"))
    with data_dir() as data:
        assert "favordynmods set at server start" in doctor.check_cgroups(settings(data))
        with pytest.raises(doctor.Warned) as caught:
            doctor.check_cgroups(settings(data, cgroup_favor_dynmods=False))
    assert "/sys/fs/cgroup/u lacks favordynmods" in caught.value.detail
    assert "mount -o remount,favordynmods /sys/fs/cgroup/u" in caught.value.fix
