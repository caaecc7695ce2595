"""Tenants: fairness weight and optional fleet-wide rate cap (docs/design.md §5).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS tenants (
    tenant     TEXT PRIMARY KEY CHECK (length(tenant) BETWEEN 1 AND 200),
    weight     INTEGER NOT NULL DEFAULT 1 CHECK (weight >= 1 AND weight <= 1000),
    max_rate   DOUBLE PRECISION CHECK (max_rate IS NULL OR max_rate > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS tenants")
