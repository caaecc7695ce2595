"""Due index keyed (tenant, next_due_at, partition_id, job_id): a node reads
only its own partitions' due timers (docs/design.md §4, §5).

Replaces jobs_tenant_due_idx (tenant, next_due_at, job_id). With the
partition id after the due time, the timers of one tenant due at one instant
(a herd) are found per owned partition by exact index probes
(``tenant = t AND next_due_at = T AND partition_id = ANY(owned)``), so a node
of a fleet of N never reads the other N - 1 nodes' rows; the fair due scan
still walks one tenant's due timers oldest first, now in
(next_due_at, partition_id, job_id) order. One index on next_due_at, as
before: every fired timer writes one entry into it.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_tenant_due_part_idx ON jobs (tenant, next_due_at, partition_id, job_id)
WHERE next_due_at IS NOT NULL
        """
    )
    op.execute("DROP INDEX IF EXISTS jobs_tenant_due_idx")


def downgrade() -> None:
    op.execute(
        """
CREATE INDEX IF NOT EXISTS jobs_tenant_due_idx ON jobs (tenant, next_due_at, job_id)
WHERE next_due_at IS NOT NULL
        """
    )
    op.execute("DROP INDEX IF EXISTS jobs_tenant_due_part_idx")
