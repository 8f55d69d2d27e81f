"""The column helpers the numbered migrations share.

Migrations are history: a database migrated long ago and one migrated today must hold the
same schema, so what a helper here returns never changes. A different column wants a new
helper (or its `sa.Column` spelled in its migration), never an edit of one of these.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa


def belongs_to(name: str, owner: str, **options: Any) -> sa.Column[Any]:
    """A 36-character id referencing the row owning this one (`owner` is its "table.id"):
    deleting the owner deletes this row too. `options` are the rest of `sa.Column`'s
    (`nullable`, `primary_key`, `index`)."""
    return sa.Column(name, sa.String(36), sa.ForeignKey(owner, ondelete="CASCADE"), **options)
