"""The due index carries each timer's schedule key (last column).

Replaces jobs_tenant_due_part_idx (tenant, next_due_at, partition_id,
job_id) with the same key columns plus schedule_key at the end: the order
the fair due scan and the herd probes walk is unchanged, and the herd path
learns which schedules a herd holds, with their counts, from index entries
only (``herd_schedule_keys``, scheduler/firing/herds.py). Built before the
old one is dropped, so firing always has a due index.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_due_schedule_idx ON jobs (tenant, next_due_at, partition_id, job_id, schedule_key)
WHERE next_due_at IS NOT NULL
        """
    )
    op.execute("DROP INDEX IF EXISTS jobs_tenant_due_part_idx")


def downgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_tenant_due_part_idx ON jobs (tenant, next_due_at, partition_id, job_id)
WHERE next_due_at IS NOT NULL
        """
    )
    op.execute("DROP INDEX IF EXISTS jobs_due_schedule_idx")
