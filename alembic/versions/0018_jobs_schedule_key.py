"""Jobs carry their schedule key (scheduler/identity.py); NULL: none (shares no plan).

NULL until the data step of revision 0019 fills existing rows, and for a job
whose key another spec took first (a hash collision): such jobs are always
fired by the per-timer path, never lost.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS schedule_key BIGINT")


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS schedule_key")
