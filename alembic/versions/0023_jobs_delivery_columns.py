"""Jobs carry what their firing statement needs of delivery: the queue a run
goes to (NULL: the job's HTTP endpoint, pushed by the partition owner) and
the overlap policy. Both short: the job row stays narrow.

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS queue TEXT DEFAULT 'default',
    ADD COLUMN IF NOT EXISTS overlap TEXT NOT NULL DEFAULT 'allow'
        CHECK (overlap IN ('allow', 'forbid', 'buffer_one', 'replace'))
        """
    )


def downgrade() -> None:
    op.execute(
        """
ALTER TABLE jobs DROP COLUMN IF EXISTS queue, DROP COLUMN IF EXISTS overlap
        """
    )
