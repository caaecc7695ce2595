"""Drop the per-partition due index: the fair due scan uses jobs_tenant_due_idx,
and every index on next_due_at costs a write per fired job.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS jobs_due_idx")


def downgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_due_idx ON jobs (partition_id, next_due_at)
WHERE next_due_at IS NOT NULL
        """
    )
