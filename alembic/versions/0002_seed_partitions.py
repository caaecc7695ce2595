"""Data step: seed the 1,024 partition rows (idempotent).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
INSERT INTO partitions (partition_id)
SELECT g FROM generate_series(0, 1023) AS g
ON CONFLICT (partition_id) DO NOTHING
        """
    )


def downgrade() -> None:
    op.execute("DELETE FROM partitions WHERE owner_node IS NULL AND owner_epoch = 0")
