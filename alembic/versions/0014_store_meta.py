"""Store metadata: small key/value facts about the store as a whole.

Keys in use: ``tzdata_version`` (the IANA tzdata release, e.g. ``2026.6``,
with which the stored future slots of zoned cron jobs were computed; a node
started with another release replans them before firing, see
scheduler/tzreplan.py).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS store_meta (
    key         TEXT NOT NULL PRIMARY KEY,
    value       TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS store_meta")
