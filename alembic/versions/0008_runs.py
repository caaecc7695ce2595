"""Runs: one row per (job, nominal time), written by the fenced firing transaction.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS runs (
    partition_id INTEGER NOT NULL,
    job_id       UUID NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL,
    tenant       TEXT NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    fired_at     TIMESTAMPTZ NOT NULL,
    node_id      TEXT NOT NULL,
    epoch        BIGINT NOT NULL,
    PRIMARY KEY (partition_id, job_id, nominal_time)
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS runs")
