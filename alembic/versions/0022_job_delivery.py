"""Delivery settings of a job (docs/delivery.md): target, payload, retry policy.

One row per job that names anything but the defaults (a job without a row
delivers to its tenant's queue ``default`` with no payload and the default
retry policy). Kept apart from ``jobs`` so the row firing rewrites on every
advance stays narrow: a payload there would be copied by every advance.
Read by the claim (pull) and the push loop, one primary-key probe per run.

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS job_delivery (
    partition_id   INTEGER NOT NULL,
    job_id         UUID NOT NULL,
    url            TEXT,
    method         TEXT CHECK (method IS NULL OR method IN ('POST', 'PUT')),
    headers        JSONB,
    timeout_s      DOUBLE PRECISION CHECK (timeout_s IS NULL OR timeout_s > 0),
    payload        JSONB,
    max_attempts   INTEGER NOT NULL CHECK (max_attempts >= 1),
    backoff_base_s DOUBLE PRECISION NOT NULL CHECK (backoff_base_s > 0),
    backoff_cap_s  DOUBLE PRECISION NOT NULL CHECK (backoff_cap_s > 0),
    max_age_s      INTEGER CHECK (max_age_s IS NULL OR max_age_s > 0),
    PRIMARY KEY (partition_id, job_id)
)
        """
    )


def downgrade() -> None:
    op.execute(
        """
DROP TABLE IF EXISTS job_delivery
        """
    )
