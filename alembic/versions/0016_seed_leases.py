"""Data step: one free lease row per partition, at the partition's epoch (idempotent).

Leases are not carried over from the ``partitions`` columns of earlier
releases: every partition starts free, and the first claim bumps its epoch,
which fences out any node of an earlier release still firing it. Stop the
fleet before upgrading past this revision (docs/operations.md).

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
INSERT INTO leases (partition_id, owner_epoch)
SELECT partition_id, owner_epoch FROM partitions
ON CONFLICT (partition_id) DO NOTHING
        """
    )


def downgrade() -> None:
    # Hand the leases back to the columns earlier releases read, so that they
    # see released partitions as free (not owned with no expiry) and held ones
    # as held until their expiry.
    op.execute(
        """
UPDATE partitions AS p
SET owner_node = l.owner_node,
    lease_expires_at = l.lease_expires_at,
    acquired_at = l.acquired_at,
    renewed_at = l.renewed_at
FROM leases AS l
WHERE l.partition_id = p.partition_id
        """
    )
    op.execute("DELETE FROM leases")
