"""Per-tenant schedule quota: ``tenants.max_schedules`` (NULL: the default,
:data:`scheduler.jobs.DEFAULT_MAX_SCHEDULES`). The API's ``PUT`` and
``apply`` refuse a write that would leave the tenant with more live jobs
(docs/api.md, "Schedules").

Revision ID: 0033
Revises: 0032
"""

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS max_schedules INTEGER
    CHECK (max_schedules IS NULL OR max_schedules >= 0)
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE tenants DROP COLUMN IF EXISTS max_schedules")
