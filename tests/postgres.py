"""A throwaway PostgreSQL server for tests: initdb in a temp dir, loopback port, torn down after."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("SANDBANK_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_postgres() -> Iterator[str]:
    """Yield the URL of a fresh server's `postgres` database (trust auth, loopback only)."""
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        pytest.fail(
            f"PostgreSQL server binaries not found in {PG_BIN}: install the Debian package "
            "`postgresql` (or point SANDBANK_TEST_PG_BIN at initdb/pg_ctl)"
        )
    # PostgreSQL refuses to run as root: as root, run it as the `postgres` user.
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    tmp = Path(tempfile.mkdtemp(prefix="sandbank-pg-"))
    if as_root:
        shutil.chown(tmp, "postgres", "postgres")
    data = tmp / "data"
    port = free_port()
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={tmp} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )
    pg_ctl = [*prefix, str(PG_BIN / "pg_ctl"), "-D", str(data)]
    try:
        try:
            subprocess.run(
                [*prefix, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                 "--auth=trust", "-E", "UTF8", "--no-sync"],
                check=True, capture_output=True,
            )  # fmt: skip
            subprocess.run(
                [*pg_ctl, "-l", str(tmp / "log"), "-o", options, "-w", "-t", "30", "start"],
                check=True, capture_output=True,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            log = (tmp / "log").read_text() if (tmp / "log").exists() else ""
            pytest.fail(f"PostgreSQL did not start: {exc.stderr!r}\n{log}")
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*pg_ctl, "-m", "immediate", "-w", "stop"], capture_output=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
