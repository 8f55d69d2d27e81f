"""One tenant's disk is its own: workspaces are allocated whole on the data directory's file
system, so a tenant filling its workspace never loses another's fsynced write nor fills the
host; sessions past what the disk holds (less its reserve) are refused with a clear 503."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Server

MiB = 1 << 20


@contextlib.contextmanager
def small_disk(size_mb: int) -> Iterator[Path]:
    """A data directory on an ext4 file system of its own, `size_mb` large."""
    base = Path(tempfile.mkdtemp(prefix="sandbank-test-smalldisk-"))
    base.chmod(0o711)
    image, point = base / "fs.img", base / "data"
    point.mkdir(mode=0o711)
    with open(image, "wb") as f:
        f.truncate(size_mb * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    point.chmod(0o711)
    try:
        yield point
    finally:
        subprocess.run(["umount", "--lazy", str(point)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def _exec(client: httpx.Client, sid: str, command: str) -> dict[str, object]:
    r = client.post(
        f"/sessions/{sid}/exec",
        json={"tool": "bash_code_execution", "input": {"command": command}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    content: dict[str, object] = r.json()["result_block"]["content"]
    return content


@pytest.mark.parametrize("isolation", ["fork", "bwrap"])
def test_a_tenant_filling_its_disk_costs_no_other_session_a_written_byte(
    isolation: str, machine: None
) -> None:
    with small_disk(224) as data:
        # ~200 MiB free, 40 kept: three workspaces of 48 MiB fit, a fourth would eat the reserve.
        server = Server(
            data, isolation=isolation, disk_limit_mb=48, disk_reserve_mb=40, pool_size=0
        ).start()
        try:
            with server.client() as client:
                filler, writer, third = (
                    client.post("/sessions", json={}).json()["session_id"] for _ in range(3)
                )
                refused = client.post("/sessions", json={})
                assert refused.status_code == 503 and refused.headers["retry-after"] == "30"
                assert "no room for another workspace of 48 MiB" in refused.json()["detail"]
                # The writer's data, written and fsynced, before and while the filler fills.
                wrote = _exec(
                    client,
                    writer,
                    "head -c 8M /dev/urandom > kept.bin && sync kept.bin && sha256sum kept.bin",
                )
                filled = _exec(client, filler, "dd if=/dev/zero of=fill bs=1M 2>&1; echo rc=$?")
                assert "No space left on device" in str(filled["stdout"])  # its own disk is full
                more = _exec(
                    client,
                    writer,
                    "head -c 8M /dev/urandom > more.bin && sync more.bin && echo ok; "
                    "sha256sum kept.bin",
                )
                assert str(more["stdout"]).startswith("ok\n")
                assert str(wrote["stdout"]) in str(more["stdout"])  # the fsynced file is intact
                # The host's file system keeps its reserve: the server's own data has room.
                fs = os.statvfs(data)
                assert fs.f_bavail * fs.f_frsize >= 30 * MiB
                client.delete(f"/sessions/{third}")
                deadline = time.monotonic() + 15  # its disk goes once its sandbox is closed
                while (again := client.post("/sessions", json={})).status_code == 503:
                    assert time.monotonic() < deadline, again.text
                    time.sleep(0.2)
                assert again.status_code == 201
        finally:
            server.stop()
