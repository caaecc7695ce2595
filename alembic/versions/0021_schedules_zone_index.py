"""Index the zoned schedules by registration time (the nodes' zone warm-up).

Every ``ZONE_WARM_INTERVAL_S`` a node reads the zones of the cron schedules
registered since its last look (``schedule_zones``, scheduler/node.py); the
partial index keeps that read to the new rows, however many interval and
one-shot specs (one row per anchor or instant) the table holds.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS schedules_zone_idx ON schedules (created_at, tz) WHERE tz IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS schedules_zone_idx")
