"""When each API key was last used (written at most about once a minute per key)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("last_used_at", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "last_used_at")
