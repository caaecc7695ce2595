"""Leases: one row per partition, apart from the fence (docs/design.md §2).

The lease (who should fire a partition, until when) lives here; the fence
(``partitions.owner_node`` / ``owner_epoch``, locked ``FOR SHARE`` by every
firing statement) stays on ``partitions``. Renewals and releases write only
this table, so the firing fence's share locks never make them wait; a claim
writes both in one statement (it must bump ``partitions.owner_epoch``, which
waits for an in-flight firing commit). ``owner_epoch`` here is a copy of the
epoch the lease was claimed at. No foreign key: an UPDATE here must take no
lock on ``partitions``.

The ``lease_expires_at``, ``acquired_at`` and ``renewed_at`` columns of
``partitions`` are no longer read or written from this revision on.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS leases (
    partition_id     INTEGER PRIMARY KEY CHECK (partition_id >= 0 AND partition_id < 1024),
    owner_node       TEXT,
    owner_epoch      BIGINT NOT NULL DEFAULT 0 CHECK (owner_epoch >= 0),
    lease_expires_at TIMESTAMPTZ,
    acquired_at      TIMESTAMPTZ,
    renewed_at       TIMESTAMPTZ
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS leases")
