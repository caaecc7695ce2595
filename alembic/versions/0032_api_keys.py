"""API keys of the tenant HTTP API (docs/api.md, "Keys"). A token is
``tk_<key_id>_<secret>``; only the SHA-256 of the 32-byte secret is stored.
``tenant`` is NULL only for admin keys.

Revision ID: 0032
Revises: 0031
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id        TEXT PRIMARY KEY,
    tenant        TEXT REFERENCES tenants (tenant),
    role          TEXT NOT NULL CHECK (role IN ('admin', 'tenant', 'worker')),
    name          TEXT,
    secret_hash   BYTEA NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at    TIMESTAMPTZ,
    last_used_at  TIMESTAMPTZ,
    CHECK ((role = 'admin') = (tenant IS NULL))
)
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP TABLE IF EXISTS api_keys
        """
    )
