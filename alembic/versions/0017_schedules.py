"""Schedules: the distinct specs timers share, keyed by their schedule identity.

One row per schedule key (scheduler/identity.py): the canonical text the key
hashes (to detect the improbable collision) and one spelling of the spec,
which the herd path plans for every timer carrying the key
(scheduler/firing/herds.py). Rows are written by every path that writes a
job (``scheduler.jobs.register_schedules``) and never updated; a row no job
refers to any more is harmless (a few hundred bytes per distinct spec ever
registered).

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS schedules (
    schedule_key      BIGINT PRIMARY KEY,
    canonical         TEXT NOT NULL,
    kind              TEXT NOT NULL CHECK (kind IN ('cron', 'interval', 'once')),
    cron_expr         TEXT,
    cron_dialect      TEXT,
    tz                TEXT,
    interval_s        BIGINT,
    anchor_at         TIMESTAMPTZ,
    fire_at           TIMESTAMPTZ,
    misfire           TEXT NOT NULL,
    catchup_window_s  INTEGER NOT NULL,
    misfire_grace_s   INTEGER NOT NULL,
    jitter_s          INTEGER NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS schedules")
