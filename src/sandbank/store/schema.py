"""The database tables as SQLAlchemy Core sees them (migrations own their creation)."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("created_at", sa.Double(), nullable=False),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("user_id", sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("revoked_at", sa.Double(), nullable=True),
    sa.Column("last_used_at", sa.Double(), nullable=True),  # migration 0003
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("user_id", sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_message", sa.Text(), nullable=True),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("ttl", sa.Double(), nullable=False),
    # The latest message timestamp, read under the session's row lock to order the next one.
    sa.Column("last_message_at", sa.Double(), nullable=True),
    # Where the session's sandbox lives (migration 0002).
    sa.Column("replica", sa.String(64), nullable=True),
    sa.Column("sandbox_id", sa.String(200), nullable=True),
    sa.Column("title", sa.Text(), nullable=True),  # the name its user gave (migration 0004)
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("timestamp", sa.Double(), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text(), nullable=False),
    sa.Column("internal", sa.Boolean(), nullable=False),
    sa.UniqueConstraint("session_id", "timestamp", name="uq_messages_session_timestamp"),
)

files = sa.Table(
    "files",
    metadata,
    sa.Column(
        "session_id",
        sa.ForeignKey("sessions.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("filename", sa.String(1024), primary_key=True),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("origin", sa.String(16), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
)

# The run of a posted question: a job leased by one replica at a time (migration 0002).
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("session_id", sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("user_id", sa.String(36), nullable=False),
    sa.Column("question_at", sa.Double(), nullable=False),  # the question message's timestamp
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("owner", sa.String(64), nullable=True),  # the replica holding the lease
    sa.Column("lease_until", sa.Double(), nullable=True),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),  # claims so far
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.Column("message", sa.Text(), nullable=True),  # how it ended
    sa.Column("preferred", sa.String(64), nullable=True),  # the replica with its sandbox
)

# Upload forms handed out for an object store that calls nobody back (S3): every replica
# reconciles them with the objects, whichever replica handed the form out (migration 0002).
pending_uploads = sa.Table(
    "pending_uploads",
    metadata,
    sa.Column("session_id", sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("filename", sa.String(1024), primary_key=True),
    sa.Column("expires_at", sa.Double(), nullable=False),
)

# Storage reserved for files on their way in (migration 0004): counted in the storage quota
# with the files already recorded, until committed as a file's record, released, or expired.
quota_reservations = sa.Table(
    "quota_reservations",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("user_id", sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("session_id", sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("filename", sa.String(1024), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("expires_at", sa.Double(), nullable=False),
    sa.Index("ix_quota_reservations_user", "user_id"),
)
