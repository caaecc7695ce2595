"""Unfinished runs of jobs with an overlap policy other than ``allow``
(``runs.overlap`` is set only for those): the fenced firing statement's
overlap check probes it. Runs of ``allow`` jobs are never in it.

Revision ID: 0028
Revises: 0027
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS runs_overlap_idx ON runs (partition_id, job_id, nominal_time)
WHERE overlap IS NOT NULL AND state IN ('pending', 'leased', 'failed')
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP INDEX IF EXISTS runs_overlap_idx
        """
    )
