"""cgroup2's favordynmods (found in mountinfo, remounted once at start, never fatal); a server
whose own cgroup caps its memory counts that, not the machine's."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbank import capacity
from sandbank.sandbox.host import cgroups, machine

MOUNTINFO = """\
25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw
31 25 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
42 31 0:39 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""


def test_the_cgroup2_mount_under_the_root_is_found_with_its_superblock_options() -> None:
    found = cgroups.cgroup2_mount(MOUNTINFO, Path("/sys/fs/cgroup"))
    assert found == ("/sys/fs/cgroup/unified", "rw,nsdelegate")
    assert cgroups.cgroup2_mount(MOUNTINFO, Path("/elsewhere")) is None
    assert cgroups.cgroup2_mount(MOUNTINFO.replace("cgroup2", "tmpfs"), Path("/sys")) is None


def test_a_remount_keeps_the_options_it_found_and_adds_favordynmods_once() -> None:
    assert cgroups.remount_data("rw,nsdelegate") == "nsdelegate,favordynmods"
    assert cgroups.remount_data("ro,favordynmods") == "favordynmods"
    assert cgroups.remount_data("") == "favordynmods"


def test_this_host_gets_favordynmods_and_a_second_call_finds_it_on() -> None:
    first = cgroups.favor_dynamic_moves()
    if first == "absent":
        pytest.skip("no cgroup2 tree on this host")
    assert first in ("on", "enabled")
    found = cgroups.cgroup2_mount(Path("/proc/self/mountinfo").read_text())
    assert found is not None and "favordynmods" in found[1].split(",")
    assert cgroups.favor_dynamic_moves() == "on"


def test_a_kernel_that_refuses_costs_a_warning_not_the_server(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(root: Path = cgroups.ROOT) -> str:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(cgroups, "favor_dynamic_moves", refuse)
    with caplog.at_level(logging.WARNING, logger=machine.log.name):
        machine.favor_dynamic_moves()
    assert "favordynmods could not be enabled" in caplog.text
    assert "Invalid argument" in caplog.text


def test_a_server_in_a_memory_capped_cgroup_sizes_itself_to_the_cap() -> None:
    """As in a Kubernetes pod: /proc/meminfo shows the node, the server's cgroup the limit."""
    group = cgroups.ROOT / "memory" / f"sandbank-test-cap-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(3 << 30))
        probe = (
            "import sys; from sandbank import capacity\n"
            f"open('{group}/cgroup.procs', 'w').write('0')\n"
            "print(capacity.mem_total(), capacity.derived_max_sessions('fork', 512, 50000))"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
        assert int(out[0]) == 3 << 30
        assert int(out[1]) == capacity.derived_max_sessions("fork", 512, 50000, total=3 << 30)
        assert int(out[1]) < capacity.derived_max_sessions("fork", 512, 50000) / 4
    finally:
        group.rmdir()
