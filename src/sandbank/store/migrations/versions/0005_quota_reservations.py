"""Storage reserved for files on their way in, so concurrent writes never pass a quota."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sandbank.store.migrations.columns import belongs_to

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quota_reservations",
        sa.Column("id", sa.String(200), primary_key=True),
        belongs_to("user_id", "users.id", nullable=False),
        belongs_to("session_id", "sessions.id", nullable=False),
        sa.Column("filename", sa.String(1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_quota_reservations_user", "quota_reservations", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_quota_reservations_user", "quota_reservations")
    op.drop_table("quota_reservations")
