"""Requests not carried out yet, by partition: what the owner's firing pass reads.

Revision ID: 0030
Revises: 0029
"""

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS run_requests_open_idx ON run_requests (partition_id, requested_at)
WHERE done_at IS NULL
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP INDEX IF EXISTS run_requests_open_idx
        """
    )
