"""Skips: slot ranges [first_nominal, until_nominal) a misfire policy recorded as skipped.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS skips (
    partition_id  INTEGER NOT NULL,
    job_id        UUID NOT NULL,
    first_nominal TIMESTAMPTZ NOT NULL,
    until_nominal TIMESTAMPTZ NOT NULL,
    slots         BIGINT CHECK (slots IS NULL OR slots >= 1),
    reason        TEXT NOT NULL,
    recorded_at   TIMESTAMPTZ NOT NULL,
    node_id       TEXT NOT NULL,
    epoch         BIGINT NOT NULL,
    PRIMARY KEY (partition_id, job_id, first_nominal)
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS skips")
