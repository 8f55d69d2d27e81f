"""Without a model, each refused question gets an error of its own (the fast tier)."""

from __future__ import annotations

import pytest

from sandbank.errors import ModelNotConfigured
from sandbank.interpreter.runs import Runs
from sandbank.store import ChatSession
from tests.support import settings


@pytest.mark.anyio
async def test_each_refusal_raises_a_fresh_error_never_the_stored_one(tmp_path: object) -> None:
    stored = ModelNotConfigured()
    runs = Runs(None, None, None, stored, settings(tmp_path))  # type: ignore[arg-type]
    session = ChatSession("s", "u", "DONE", None, 0.0, 0.0)
    raised = []
    for _ in range(3):
        with pytest.raises(ModelNotConfigured) as info:
            await runs.begin(session, "hi")
        raised.append(info.value)
    assert all(e is not stored for e in raised) and len({id(e) for e in raised}) == 3
    assert stored.__traceback__ is None  # nothing accumulates on the stored one
    assert raised[0].message == stored.message
