"""The file preview snippet run inside a real sandbox, on files made there with its own libraries."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from sandbank.agent.inspect_snippet import MARKER, inspect_code
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.local import LocalSandboxes
from sandbank.sandbox.sessions import ExecSession
from tests.support import data_dir, settings
from tests.tiers import needs

pytestmark = pytest.mark.anyio
TENANT = "inspect-tests"

MAKE_SHEETS = """
import openpyxl
book = openpyxl.Workbook()
sheet = book.active
sheet.title = "prices"
for row in [("fruit", "price"), ("apple", 3), ("pear", None), ("plum", 5)]:
    sheet.append(row)
book.create_sheet("empty")
book.save("two.xlsx")
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
@needs("root")
async def session() -> AsyncIterator[tuple[LocalSandboxes, ExecSession]]:
    with data_dir() as data:
        runtime = LocalSandboxes(settings(data))
        await runtime.start()
        try:
            yield runtime, runtime.session((await runtime.create(TENANT)).id, TENANT)
        finally:
            await runtime.close()


async def test_an_excel_preview_shows_only_the_real_columns(
    session: tuple[LocalSandboxes, ExecSession],
) -> None:
    runtime, s = session
    made = await runtime.execute(s.id, TENANT, PythonCall(MAKE_SHEETS), 60)
    assert made.return_code == 0, made.stderr
    result = await runtime.execute(s.id, TENANT, PythonCall(inspect_code("/workspace")), 60)
    assert result.return_code == 0, result.stderr
    (entry,) = json.loads(result.stdout.split(MARKER, 1)[1])["files"]
    assert entry == {
        "name": "two.xlsx",
        "sheets": ["prices", "empty"],
        "columns": ["fruit", "price"],
        "rows": [["apple", "3"], ["pear", ""], ["plum", "5"]],
    }
