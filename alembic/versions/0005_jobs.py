"""Jobs: registered timers; next_due_at (nominal + jitter) drives firing.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS jobs (
    partition_id      INTEGER NOT NULL CHECK (partition_id >= 0 AND partition_id < 1024),
    job_id            UUID NOT NULL,
    tenant            TEXT NOT NULL REFERENCES tenants (tenant),
    name              TEXT,
    kind              TEXT NOT NULL CHECK (kind IN ('cron', 'interval', 'once')),
    cron_expr         TEXT,
    cron_dialect      TEXT CHECK (cron_dialect IS NULL OR cron_dialect IN ('unix', 'seconds')),
    tz                TEXT,
    interval_s        BIGINT CHECK (interval_s IS NULL OR interval_s > 0),
    anchor_at         TIMESTAMPTZ,
    fire_at           TIMESTAMPTZ,
    misfire           TEXT NOT NULL DEFAULT 'all' CHECK (misfire IN ('all', 'once', 'skip')),
    catchup_window_s  INTEGER NOT NULL DEFAULT 86400 CHECK (catchup_window_s >= 0),
    misfire_grace_s   INTEGER NOT NULL DEFAULT 60 CHECK (misfire_grace_s >= 0),
    jitter_s          INTEGER NOT NULL DEFAULT 0 CHECK (jitter_s >= 0),
    paused            BOOLEAN NOT NULL DEFAULT false,
    next_nominal_at   TIMESTAMPTZ,
    next_due_at       TIMESTAMPTZ,
    revision          BIGINT NOT NULL DEFAULT 1,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    changed_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at        TIMESTAMPTZ,
    PRIMARY KEY (partition_id, job_id)
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS jobs")
