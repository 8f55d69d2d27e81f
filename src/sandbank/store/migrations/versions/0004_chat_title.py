"""A chat's title, when its user named it (otherwise its first question is shown)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("title", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "title")
