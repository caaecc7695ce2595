"""Pending push runs indexed by available_at alone (was partition_id, available_at).

The push loop's poll and claim take the oldest due push runs of the node's
partitions (``ORDER BY available_at LIMIT n``). Over an index led by
partition_id PostgreSQL answered that by reading every due entry of those
partitions and keeping the top n: each poll read the whole push backlog
(90 ms with 250,000 pending, four polls a second; the loop fell to ~400
pushes/s). Over ``available_at`` alone the scan reads entries in order and
stops after n of the node's partitions: about n × the nodes sharing the
partitions (docs/delivery.md, "Push").

Revision ID: 0034
Revises: 0033
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS runs_push_idx")
    op.execute(
        """
CREATE INDEX IF NOT EXISTS runs_push_idx ON runs (available_at)
WHERE state = 'pending' AND queue IS NULL
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS runs_push_idx")
    op.execute(
        """
CREATE INDEX IF NOT EXISTS runs_push_idx ON runs (partition_id, available_at)
WHERE state = 'pending' AND queue IS NULL
        """
    )
