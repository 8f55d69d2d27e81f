"""What a call produced, tracked with inotify (inside/files.py `Tracker`), always agrees with
the walk before and after that it replaces: random changes in rounds, changes between calls,
a lost event queue and too many directories. In-process on a scratch directory: no sandbox."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from sandbank.sandbox.inside import files
from sandbank.sandbox.inside.files import SITE_DIR_NAME, Tracker, produced, scan


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(30):
        (ws / f"data-{i}.csv").write_text("a,b\n" * i)
    (ws / "sub" / "deeper").mkdir(parents=True)
    (ws / "sub" / "deeper" / "x.txt").write_text("x")
    return ws


def change(ws: Path, rng: random.Random, n: int) -> None:
    """`n` random changes of the kinds code makes."""
    for _ in range(n):
        files = [p for p in ws.rglob("*") if p.is_file() and SITE_DIR_NAME not in p.parts]
        dirs = [p for p in ws.rglob("*") if p.is_dir() and SITE_DIR_NAME not in p.parts]
        kind = rng.choice(["new", "append", "rewrite", "delete", "mkdir", "mv", "mvdir", "rmdir"])
        if kind == "new" or not files:
            where = rng.choice([ws, *dirs])
            (where / f"n{rng.randrange(10**6)}.out").write_text("new")
        elif kind == "append":
            with open(rng.choice(files), "a") as f:
                f.write("more")
        elif kind == "rewrite":  # replaced by a new file under the same name (a new inode)
            target = rng.choice(files)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text("rewritten")
            os.replace(tmp, target)
        elif kind == "delete":
            rng.choice(files).unlink()
        elif kind == "mkdir":  # a directory made with files in it at once
            d = ws / f"dir{rng.randrange(10**6)}" / "inner"
            d.mkdir(parents=True)
            (d / "made.png").write_bytes(b"png")
            (d.parent / "top.txt").write_text("t")
        elif kind == "mv":
            target = rng.choice(files)
            os.replace(target, rng.choice([ws, *dirs]) / f"moved{rng.randrange(10**6)}")
        elif kind == "mvdir" and dirs:
            d = rng.choice(dirs)
            if d.exists():
                d.rename(ws / f"renamed{rng.randrange(10**6)}")
        elif kind == "rmdir" and dirs:
            shutil.rmtree(rng.choice(dirs), ignore_errors=True)


def test_the_tracker_agrees_with_the_walk_over_random_calls(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[str] = []

    def counted(r: str) -> dict[str, tuple[int, int, int]]:
        walks.append(r)
        return scan(r)

    monkeypatch.setattr(files, "scan", counted)
    rng = random.Random(7)
    tracker = Tracker(str(root))
    for round_ in range(60):
        change(root, rng, rng.randrange(3))  # between calls: not the call's
        walked = scan(str(root))
        before = tracker.before()
        assert before is None  # tracking, not walking
        change(root, rng, rng.randrange(6))
        expected = produced(str(root), walked)  # the reference walks (counted too)
        reference_walks = len(walks)
        assert tracker.produced(before) == expected, round_
        assert len(walks) == reference_walks  # the tracker's answer came from the events
    assert not tracker.gave_up
    tracker.close()


def test_the_sites_packages_are_not_files_the_code_made(root: Path) -> None:
    tracker = Tracker(str(root))
    before = tracker.before()
    (root / SITE_DIR_NAME / "pkg").mkdir(parents=True)
    (root / SITE_DIR_NAME / "pkg" / "mod.py").write_text("x = 1")
    (root / "out.txt").write_text("made")
    assert tracker.produced(before) == ["out.txt"]


def test_a_lost_event_queue_falls_back_to_the_walk(root: Path) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    tracker = Tracker(str(root))
    walked = scan(str(root))
    before = tracker.before()
    for i in range(limit + 100):  # more events than the queue holds: it overflows
        (root / f"f{i}").write_bytes(b"")
    (root / "data-3.csv").write_text("changed")
    assert tracker.produced(before) == produced(str(root), walked)
    # And it tracks again after.
    walked = scan(str(root))
    before = tracker.before()
    (root / "after.txt").write_text("a")
    assert before is None and tracker.produced(before) == produced(str(root), walked)


def test_too_many_directories_and_the_walk_decides(root: Path) -> None:
    tracker = Tracker(str(root))
    tracker.MAX_DIRS = 4
    walked = scan(str(root))
    before = tracker.before()
    for i in range(6):
        (root / f"d{i}").mkdir()
        (root / f"d{i}" / "f.txt").write_text("f")
    assert tracker.produced(before) == produced(str(root), walked)
    assert tracker.gave_up
    walked = scan(str(root))
    before = tracker.before()
    assert before is not None  # walking from here on
    (root / "d1" / "g.txt").write_text("g")
    assert tracker.produced(before) == ["d1/g.txt"]


def test_a_workspace_mounted_anew_is_tracked_anew(tmp_path: Path) -> None:
    """A paused session's disk mounted again is another file system at the same path: the
    tracker notices by the root's identity (here: the directory replaced)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    tracker = Tracker(str(ws))
    tracker.produced(tracker.before())
    ws.rename(tmp_path / "old")
    ws.mkdir()
    (ws / "already.txt").write_text("there before the call")
    before = tracker.before()
    (ws / "new.txt").write_text("made")
    assert tracker.produced(before) == ["new.txt"]
