"""The `ObjectStore` contract: local, S3 (moto) and memory stores pass the same tests."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from sandbank.errors import BadRequest, NotFound, PathEscape
from sandbank.files import ObjectStore, object_key, session_prefix
from sandbank.files.base import CHUNK_SIZE

pytestmark = pytest.mark.anyio

BIG = os.urandom(CHUNK_SIZE * 2 + 123)  # several chunks, the last one short


async def read_all(store: ObjectStore, key: str) -> bytes:
    return b"".join([chunk async for chunk in await store.open(key)])


async def test_put_from_a_file_object_then_read_back(object_store: ObjectStore) -> None:
    await object_store.put("sessions/s/big.bin", io.BytesIO(BIG), len(BIG))
    assert await read_all(object_store, "sessions/s/big.bin") == BIG
    assert await object_store.size("sessions/s/big.bin") == len(BIG)


async def test_put_from_a_path_and_copy_to_a_path(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"hello")
    await object_store.put("a/in.txt", source)
    dest = tmp_path / "out.txt"
    assert await object_store.copy_to("a/in.txt", dest) == 5
    assert dest.read_bytes() == b"hello"


async def test_put_replaces_an_existing_object(object_store: ObjectStore) -> None:
    await object_store.put("k", io.BytesIO(b"first version"))
    await object_store.put("k", io.BytesIO(b"second"))
    assert await read_all(object_store, "k") == b"second"


async def test_missing_objects(object_store: ObjectStore, tmp_path: Path) -> None:
    assert await object_store.size("nope") is None
    with pytest.raises(NotFound):
        await object_store.open("nope")
    with pytest.raises(NotFound):
        await object_store.copy_to("nope", tmp_path / "x")
    await object_store.delete("nope")  # not an error


async def test_delete_removes_one_object(object_store: ObjectStore) -> None:
    await object_store.put("d/one", io.BytesIO(b"1"))
    await object_store.put("d/two", io.BytesIO(b"2"))
    await object_store.delete("d/one")
    assert await object_store.size("d/one") is None
    assert await object_store.size("d/two") == 1


async def test_delete_prefix_removes_exactly_the_prefix(object_store: ObjectStore) -> None:
    for key in [object_key("a", "x.csv"), object_key("a", "y.csv"), object_key("ab", "z.csv")]:
        await object_store.put(key, io.BytesIO(b"data"))
    await object_store.put("sessions/a/deeper/w.csv", io.BytesIO(b"data"))

    assert await object_store.delete_prefix(session_prefix("a")) == 3

    assert await object_store.size(object_key("a", "x.csv")) is None
    assert await object_store.size("sessions/a/deeper/w.csv") is None
    assert await object_store.size(object_key("ab", "z.csv")) == 4
    assert await object_store.delete_prefix(session_prefix("a")) == 0


@pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/../b", ".tmp/x", "a/./b", ""])
async def test_keys_that_could_escape_are_refused(object_store: ObjectStore, key: str) -> None:
    with pytest.raises((PathEscape, BadRequest)):
        await object_store.put(key, io.BytesIO(b"x"))
    with pytest.raises((PathEscape, BadRequest)):
        await object_store.size(key)
    with pytest.raises((PathEscape, BadRequest)):
        await object_store.presign_post(key, 10, 60)


async def test_put_new_stores_once_and_never_replaces(object_store: ObjectStore) -> None:
    assert await object_store.put_new("claims/one", b"first")
    assert not await object_store.put_new("claims/one", b"second")
    assert await read_all(object_store, "claims/one") == b"first"
    await object_store.delete("claims/one")
    assert await object_store.put_new("claims/one", b"third")  # free again once deleted
    assert await read_all(object_store, "claims/one") == b"third"
