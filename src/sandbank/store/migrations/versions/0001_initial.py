"""Initial schema: users, API keys, sessions, messages, file records."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sandbank.store.migrations.columns import belongs_to

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("created_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        belongs_to("user_id", "users.id", nullable=False, index=True),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(36), primary_key=True),
        belongs_to("user_id", "users.id", nullable=False, index=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("ttl", sa.Double(), nullable=False, index=True),
        sa.Column("last_message_at", sa.Double(), nullable=True),
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        belongs_to("session_id", "sessions.id", nullable=False),
        sa.Column("timestamp", sa.Double(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("internal", sa.Boolean(), nullable=False),
        # Also the index that serves "messages of a session after T".
        sa.UniqueConstraint("session_id", "timestamp", name="uq_messages_session_timestamp"),
    )
    op.create_table(
        "files",
        belongs_to("session_id", "sessions.id", primary_key=True),
        sa.Column("filename", sa.String(1024), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    for table in ("files", "messages", "sessions", "api_keys", "users"):
        op.drop_table(table)
