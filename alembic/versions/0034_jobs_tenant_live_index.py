"""Live jobs by tenant: what a schedule write's quota check counts (at most the
quota + 1 of them) and what `jobs delete --tenant T --all` pages through.
Without it both were sequential scans of every job (a second of store CPU
per PUT on a store of 5 M jobs). Partial: deleted jobs, kept until pruned,
are not in it.

Revision ID: 0034
Revises: 0033
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_tenant_live_idx ON jobs (tenant)
WHERE deleted_at IS NULL
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP INDEX IF EXISTS jobs_tenant_live_idx
        """
    )
