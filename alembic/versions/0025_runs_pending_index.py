"""Pending pull runs by (tenant, queue, available_at): what a worker's claim
walks. Partial, so finished runs (nearly all of them) are not in it.

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS runs_pending_idx ON runs (tenant, queue, available_at)
WHERE state = 'pending' AND queue IS NOT NULL
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP INDEX IF EXISTS runs_pending_idx
        """
    )
