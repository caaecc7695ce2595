"""Run-now requests (``jobs trigger``): deduplicated by (job, request id),
carried out by the job's partition owner in its fenced firing transaction,
which records the outcome (``fired`` with the run's nominal time, or
``skipped`` by the overlap policy).

Revision ID: 0029
Revises: 0028
"""

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS run_requests (
    partition_id  INTEGER NOT NULL,
    job_id        UUID NOT NULL,
    request_id    TEXT NOT NULL CHECK (length(request_id) BETWEEN 1 AND 200),
    force         BOOLEAN NOT NULL DEFAULT false,
    requested_at  TIMESTAMPTZ NOT NULL,
    done_at       TIMESTAMPTZ,
    outcome       TEXT CHECK (outcome IS NULL OR outcome IN ('fired', 'skipped', 'deleted')),
    nominal_time  TIMESTAMPTZ,
    PRIMARY KEY (partition_id, job_id, request_id)
)
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP TABLE IF EXISTS run_requests
        """
    )
