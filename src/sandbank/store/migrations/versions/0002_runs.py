"""Runs as leased jobs (which replica holds each, until when); upload forms every replica sees."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sandbank.store.migrations.columns import belongs_to

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(36), primary_key=True),
        belongs_to("session_id", "sessions.id", nullable=False, index=True),
        sa.Column("user_id", sa.String(36), nullable=False),
        sa.Column("question_at", sa.Double(), nullable=False),
        # queued | running | done | error | cancelled
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("lease_until", sa.Double(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        # The replica holding the session's sandbox, which should run it if alive.
        sa.Column("preferred", sa.String(64), nullable=True),
    )
    # Where the session's sandbox lives: which replica, and its id (reusable by any replica
    # when the sandboxes come from a shared backend, SANDBANK_SANDBOX_URL).
    op.add_column("sessions", sa.Column("replica", sa.String(64), nullable=True))
    op.add_column("sessions", sa.Column("sandbox_id", sa.String(200), nullable=True))
    # Claimers look for queued runs and running ones whose lease ran out.
    op.create_index("ix_runs_state_lease", "runs", ["state", "lease_until"])
    op.create_table(
        "pending_uploads",
        belongs_to("session_id", "sessions.id", primary_key=True),
        sa.Column("filename", sa.String(1024), primary_key=True),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("sessions", "sandbox_id")
    op.drop_column("sessions", "replica")
    op.drop_table("pending_uploads")
    op.drop_index("ix_runs_state_lease", table_name="runs")
    op.drop_table("runs")
