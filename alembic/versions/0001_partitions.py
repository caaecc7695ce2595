"""Partitions: one lease row per partition; owner_epoch is the fencing token (docs/design.md §2).

Not UNLOGGED: a crash must never reset epochs.

Revision ID: 0001
Revises: None
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS partitions (
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
    op.execute("DROP TABLE IF EXISTS partitions")
