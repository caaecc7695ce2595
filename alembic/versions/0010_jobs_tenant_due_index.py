"""Index: due jobs per tenant in due order (the fair due scan, docs/design.md §5).

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_tenant_due_idx ON jobs (tenant, next_due_at, job_id)
WHERE next_due_at IS NOT NULL
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS jobs_tenant_due_idx")
