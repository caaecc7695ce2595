"""Index: a job name is unique per tenant (idempotent jobs add --name).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE UNIQUE INDEX IF NOT EXISTS jobs_tenant_name_idx ON jobs (tenant, name) WHERE name IS NOT NULL AND deleted_at IS NULL
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS jobs_tenant_name_idx")
