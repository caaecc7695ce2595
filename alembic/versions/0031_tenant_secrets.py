"""Per-tenant signing secrets of pushed requests (docs/delivery.md). A rotation
adds a secret and keeps the previous one valid until ``expires_at``; the
newest signs, every unexpired one is sent as a ``v1`` signature.

Revision ID: 0031
Revises: 0030
"""

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS tenant_secrets (
    tenant      TEXT NOT NULL REFERENCES tenants (tenant),
    secret_id   INTEGER NOT NULL,
    secret      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ,
    PRIMARY KEY (tenant, secret_id)
)
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP TABLE IF EXISTS tenant_secrets
        """
    )
