"""cgroup2's favordynmods: found in mountinfo, remounted once at start, and never fatal."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sandbank.sandbox import bwrap, cgroups

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
    with caplog.at_level(logging.WARNING, logger=bwrap.log.name):
        bwrap.favor_dynamic_moves()
    assert "favordynmods could not be enabled" in caplog.text
    assert "Invalid argument" in caplog.text
