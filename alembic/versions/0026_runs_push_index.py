"""Pending push runs (HTTP targets) by (partition_id, available_at): what the
partition owner's push loop walks. Pull runs are not in it.

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS runs_push_idx ON runs (partition_id, available_at)
WHERE state = 'pending' AND queue IS NULL
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP INDEX IF EXISTS runs_push_idx
        """
    )
