"""Leased and failed runs by (partition_id, leased_until): what the partition
owner's settle step walks (expired leases, failed attempts to retry or
mark dead).

Revision ID: 0027
Revises: 0026
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS runs_inflight_idx ON runs (partition_id, leased_until)
WHERE state IN ('leased', 'failed')
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP INDEX IF EXISTS runs_inflight_idx
        """
    )
