"""Storage reserved for files on their way in, so concurrent writes never pass a quota."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quota_reservations",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column(
            "user_id",
            sa.String(36),
            sa.ForeignKey("users.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "session_id",
            sa.String(36),
            sa.ForeignKey("sessions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("filename", sa.String(1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_quota_reservations_user", "quota_reservations", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_quota_reservations_user", "quota_reservations")
    op.drop_table("quota_reservations")
