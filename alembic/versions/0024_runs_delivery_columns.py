"""Runs carry their delivery state (docs/delivery.md): the firing statement
writes ``state = 'pending'`` with the run. Runs fired before this revision
keep ``state`` NULL (they predate delivery and are never handed over).

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
ALTER TABLE runs
    ADD COLUMN IF NOT EXISTS state TEXT
        CHECK (state IS NULL OR state IN ('pending', 'leased', 'failed', 'succeeded', 'dead', 'canceled')),
    ADD COLUMN IF NOT EXISTS queue TEXT,
    ADD COLUMN IF NOT EXISTS origin TEXT CHECK (origin IS NULL OR origin IN ('schedule', 'manual', 'backfill')),
    ADD COLUMN IF NOT EXISTS overlap TEXT,
    ADD COLUMN IF NOT EXISTS attempt INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS available_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS lease_token UUID,
    ADD COLUMN IF NOT EXISTS leased_until TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS worker TEXT,
    ADD COLUMN IF NOT EXISTS first_claimed_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS claimed_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS finished_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS retryable BOOLEAN,
    ADD COLUMN IF NOT EXISTS last_error TEXT
        """
    )


def downgrade() -> None:
    op.execute(
        """
ALTER TABLE runs
    DROP COLUMN IF EXISTS state, DROP COLUMN IF EXISTS queue, DROP COLUMN IF EXISTS origin,
    DROP COLUMN IF EXISTS overlap, DROP COLUMN IF EXISTS attempt, DROP COLUMN IF EXISTS available_at,
    DROP COLUMN IF EXISTS lease_token, DROP COLUMN IF EXISTS leased_until, DROP COLUMN IF EXISTS worker,
    DROP COLUMN IF EXISTS first_claimed_at, DROP COLUMN IF EXISTS claimed_at,
    DROP COLUMN IF EXISTS finished_at, DROP COLUMN IF EXISTS retryable, DROP COLUMN IF EXISTS last_error
        """
    )
