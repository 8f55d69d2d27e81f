"""The repository's copies of the two contracts are the user's documents, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO

SHARED = REPO.parent / "shared" / "specs"
COPIES = {
    "code-execution-openapi.yaml": REPO / "src/sandbank/execapi/contract-v1.yaml",
    "interpreter-openapi.yaml": REPO / "src/sandbank/interpreter/interpreter-openapi.yaml",
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_the_copy_of_each_contract_matches_the_users_document(name: str) -> None:
    original = SHARED / name
    if not original.exists():
        pytest.skip(f"{SHARED} is not beside this checkout (a user's clone): nothing to compare")
    assert Path(COPIES[name]).read_bytes() == original.read_bytes()
