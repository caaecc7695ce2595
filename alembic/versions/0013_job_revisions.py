"""Job revisions: the superseded specs of edited, paused, resumed or deleted jobs.

Every path that rewrites a job (``jobs add --replace``, pause, resume,
delete) copies the row as it was into ``job_revisions`` in the same
transaction, with the half-open interval ``[valid_from, valid_until)`` of
store time during which that revision was in force (``valid_from`` is the
job's ``changed_at`` before the change, i.e. its creation or previous edit;
``valid_until`` the edit's store time). ``verify`` audits a job edited inside
its window revision by revision: the slots of each revision's schedule in
its interval (none while ``paused``), the slots after the edit by the
current row.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE IF NOT EXISTS job_revisions (
    partition_id      INTEGER NOT NULL,
    job_id            UUID NOT NULL,
    revision          BIGINT NOT NULL,
    valid_from        TIMESTAMPTZ NOT NULL,
    valid_until       TIMESTAMPTZ NOT NULL,
    tenant            TEXT NOT NULL,
    kind              TEXT NOT NULL,
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
    paused            BOOLEAN NOT NULL,
    PRIMARY KEY (partition_id, job_id, revision)
)
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS job_revisions")
