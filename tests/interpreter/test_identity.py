"""Which addresses a trusted user header is believed from; when keys were last used."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request

from sandbank.config import Settings
from sandbank.http.proxies import is_trusted, parse_networks
from sandbank.interpreter.identity import Identity, KeyUse
from sandbank.store import Store, open_store
from tests.fakeapp import FakeApp


def test_only_configured_proxies_are_trusted() -> None:
    networks = parse_networks("10.0.0.0/8, 192.168.1.5 ,::1")
    assert is_trusted("10.2.3.4", networks)
    assert is_trusted("192.168.1.5", networks)
    assert is_trusted("::1", networks)
    assert not is_trusted("192.168.1.6", networks)
    assert not is_trusted("127.0.0.1", networks)
    assert not is_trusted(None, networks)
    assert not is_trusted("not-an-address", networks)
    assert not is_trusted("10.2.3.4", parse_networks(""))


# --- a key's last use, recorded off the request's path ---------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(Settings(data_dir=tmp_path))
    try:
        yield store
    finally:
        await store.close()


def _request(secret: str) -> Request:
    headers = [(b"authorization", f"Bearer {secret}".encode())]
    return Request({"type": "http", "headers": headers, "client": ("127.0.0.1", 5000)})


async def _last_used(store: Store) -> float | None:
    return (await store.accounts.list_keys("alice"))[0].last_used_at


@pytest.mark.anyio
async def test_a_busy_key_is_written_once_a_period(sqlite_store: Store) -> None:
    await sqlite_store.accounts.create_user("alice")
    _, secret = await sqlite_store.accounts.create_key("alice")
    uses = KeyUse(sqlite_store, every=0.5)
    for _ in range(3):
        uses.note(secret)
    await uses.settle()
    first = await _last_used(sqlite_store)
    assert first is not None and time.time() - first < 5
    uses.note(secret)  # within the period: not written
    await uses.settle()
    assert await _last_used(sqlite_store) == first
    await asyncio.sleep(0.6)
    uses.note(secret)
    await uses.settle()
    later = await _last_used(sqlite_store)
    assert later is not None and later > first


@pytest.mark.anyio
async def test_a_request_does_not_wait_for_a_busy_database_writer(
    sqlite_store: Store, tmp_path: Path
) -> None:
    alice = await sqlite_store.accounts.create_user("alice")
    _, secret = await sqlite_store.accounts.create_key("alice")
    identity = Identity(sqlite_store, Settings(data_dir=tmp_path))
    holder = sqlite3.connect(tmp_path / "sandbank.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds SQLite's one write lock
    try:
        started = time.monotonic()
        assert await identity.user(_request(secret)) == alice
        assert time.monotonic() - started < 2  # SQLite's busy timeout is 30 s
        assert await _last_used(sqlite_store) is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await identity.key_use.settle()
    assert await _last_used(sqlite_store) is not None


@pytest.mark.anyio
async def test_a_failed_write_is_logged_and_the_request_served(
    sqlite_store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice = await sqlite_store.accounts.create_user("alice")
    _, secret = await sqlite_store.accounts.create_key("alice")
    with sqlite3.connect(tmp_path / "sandbank.db") as db:
        db.execute("ALTER TABLE api_keys DROP COLUMN last_used_at")  # every write now fails
    identity = Identity(sqlite_store, Settings(data_dir=tmp_path))
    assert await identity.user(_request(secret)) == alice
    await identity.key_use.settle()
    [record] = [r for r in caplog.records if r.name == "sandbank.identity"]
    assert record.levelname == "WARNING"
    assert "could not record an API key's use: database error" in record.getMessage()
    assert secret not in record.getMessage()


# --- the peer address the trust is judged by --------------------------------------------------


def test_a_forwarded_for_header_never_makes_a_peer_a_trusted_proxy() -> None:
    # Served as `sandbank serve` serves it (uvicorn, the listener's settings): uvicorn's own
    # proxy-header handling would take a loopback peer's X-Forwarded-For as the client's
    # address, so a local process could pass for the trusted proxy and name any user.
    fake = FakeApp(trusted_user_header="X-Remote-User", trusted_proxies="10.0.0.5/32")
    with fake.serving() as url:
        name, _ = fake.new_user()
        forged = {"X-Forwarded-For": "10.0.0.5", "X-Remote-User": name}
        with httpx.Client(base_url=url, headers={"Host": "localhost"}) as http:
            r = http.get("/api/sessions", headers=forged)
            assert r.status_code == 403, r.text
            assert "API key" in r.json()["message"]
