"""The database tables as SQLAlchemy Core sees them (migrations own their creation)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()


def _time(name: str, *, nullable: bool = False) -> sa.Column[Any]:
    # Every time is POSIX seconds as a double: 8 bytes in both SQLite and PostgreSQL, fine
    # enough for messages' timestamps to step by a microsecond (`records.TIMESTAMP_STEP`).
    return sa.Column(name, sa.Double(), nullable=nullable)


def _belongs_to(name: str, owner: str, *, primary_key: bool = False) -> sa.Column[Any]:
    """A reference to the row owning this one (`owner` is its "table.id"): deleting the owner
    deletes this row too, so whatever a user or a chat owns goes with them."""
    reference = sa.ForeignKey(owner, ondelete="CASCADE")
    if primary_key:
        return sa.Column(name, reference, primary_key=True)  # NOT NULL as a key already
    return sa.Column(name, reference, nullable=False)


users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    _time("created_at"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    _belongs_to("user_id", "users.id"),
    sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
    _time("created_at"),
    _time("revoked_at", nullable=True),
    _time("last_used_at", nullable=True),  # migration 0003
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    _belongs_to("user_id", "users.id"),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_message", sa.Text(), nullable=True),
    _time("created_at"),
    _time("ttl"),
    # The latest message timestamp, read under the session's row lock to order the next one.
    _time("last_message_at", nullable=True),
    # Where the session's sandbox lives (migration 0002).
    sa.Column("replica", sa.String(64), nullable=True),
    sa.Column("sandbox_id", sa.String(200), nullable=True),
    sa.Column("title", sa.Text(), nullable=True),  # the name its user gave (migration 0004)
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    _belongs_to("session_id", "sessions.id"),
    _time("timestamp"),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text(), nullable=False),
    sa.Column("internal", sa.Boolean(), nullable=False),
    sa.UniqueConstraint("session_id", "timestamp", name="uq_messages_session_timestamp"),
)

files = sa.Table(
    "files",
    metadata,
    _belongs_to("session_id", "sessions.id", primary_key=True),
    sa.Column("filename", sa.String(1024), primary_key=True),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("origin", sa.String(16), nullable=False),
    _time("updated_at"),
)

# The run of a posted question: a job leased by one replica at a time (migration 0002).
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    _belongs_to("session_id", "sessions.id"),
    sa.Column("user_id", sa.String(36), nullable=False),
    _time("question_at"),  # the question message's timestamp
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("owner", sa.String(64), nullable=True),  # the replica holding the lease
    _time("lease_until", nullable=True),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),  # claims so far
    _time("created_at"),
    _time("updated_at"),
    sa.Column("message", sa.Text(), nullable=True),  # how it ended
    sa.Column("preferred", sa.String(64), nullable=True),  # the replica with its sandbox
)

# Upload forms handed out for an object store that calls nobody back (S3): every replica
# reconciles them with the objects, whichever replica handed the form out (migration 0002).
pending_uploads = sa.Table(
    "pending_uploads",
    metadata,
    _belongs_to("session_id", "sessions.id", primary_key=True),
    sa.Column("filename", sa.String(1024), primary_key=True),
    _time("expires_at"),
)

# Storage reserved for files on their way in (migration 0004): counted in the storage quota
# with the files already recorded, until committed as a file's record, released, or expired.
quota_reservations = sa.Table(
    "quota_reservations",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    _belongs_to("user_id", "users.id"),
    _belongs_to("session_id", "sessions.id"),
    sa.Column("filename", sa.String(1024), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=False),
    _time("expires_at"),
    sa.Index("ix_quota_reservations_user", "user_id"),
)
