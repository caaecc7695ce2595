"""Index: due jobs per partition, in due order (the firing tick's scan).

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_due_idx ON jobs (partition_id, next_due_at) WHERE next_due_at IS NOT NULL
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS jobs_due_idx")
