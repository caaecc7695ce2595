"""Data step: give existing jobs their schedule key, in bounded batches.

Walks the live jobs without a key in primary-key order, BATCH at a time;
each batch registers its specs in ``schedules`` and sets the keys with a
compare-and-set on the revision read (a concurrent edit wins and sets its
own key), each statement committed on its own, so the step holds no lock
for long and a re-run continues where it stopped. Offline (``--sql``) it
only writes a comment: the keys need an online upgrade. Jobs whose spec no longer
validates (or whose key collided) keep no key and fire per timer.

Revision ID: 0019
Revises: 0018
"""

from alembic import op
from sqlalchemy import text

from scheduler.errors import ValidationError
from scheduler.identity import SPEC_COLUMNS, identity_of
from scheduler.spec import build_schedule

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

BATCH = 5_000

_SELECT = text(
    f"""
SELECT partition_id, job_id, revision, {", ".join(SPEC_COLUMNS)}
FROM jobs
WHERE schedule_key IS NULL AND deleted_at IS NULL
  AND (partition_id, job_id) > (:pid, CAST(:jid AS uuid))
ORDER BY partition_id, job_id
LIMIT :batch
    """
)
_REGISTER = text(
    f"""
INSERT INTO schedules (schedule_key, canonical, {", ".join(SPEC_COLUMNS)})
VALUES (:schedule_key, :canonical, {", ".join(":" + c for c in SPEC_COLUMNS)})
ON CONFLICT (schedule_key) DO NOTHING
    """
)
_CANONICAL = text("SELECT schedule_key, canonical FROM schedules WHERE schedule_key = ANY(:keys)")
_SET = text(
    """
UPDATE jobs SET schedule_key = :schedule_key
WHERE partition_id = :partition_id AND job_id = :job_id AND revision = :revision AND schedule_key IS NULL
    """
)


def upgrade() -> None:
    if op.get_context().as_sql:
        # Offline (--sql) there is nothing to read: the script says so, and jobs
        # left without a key are fired per timer until an online upgrade runs.
        op.execute(
            "-- 0019: existing jobs get their schedule keys only from an online upgrade "
            "(scheduler db upgrade); until then they are fired per timer"
        )
        return
    with op.get_context().autocommit_block():
        bind = op.get_bind()
        pid, jid = -1, "00000000-0000-0000-0000-000000000000"
        while True:
            rows = bind.execute(_SELECT, {"pid": pid, "jid": jid, "batch": BATCH}).mappings().all()
            if not rows:
                return
            pid, jid = rows[-1]["partition_id"], str(rows[-1]["job_id"])
            identities = {}
            for row in rows:
                try:
                    build_schedule(  # the spec must still validate (expression, zone, interval)
                        row["kind"], row["cron_expr"], row["cron_dialect"], row["tz"],
                        row["interval_s"], row["anchor_at"], row["fire_at"],
                    )
                    identities[(row["partition_id"], row["job_id"])] = identity_of(dict(row))
                except (ValidationError, ValueError, TypeError):
                    continue  # an invalid stored spec: fired (and reported) per timer
            specs = {}
            for row in rows:
                identity = identities.get((row["partition_id"], row["job_id"]))
                if identity is not None and identity.key not in specs:
                    specs[identity.key] = {**dict(row), "schedule_key": identity.key, "canonical": identity.canonical}
            if not specs:
                continue
            bind.execute(_REGISTER, list(specs.values()))
            stored = dict(bind.execute(_CANONICAL, {"keys": list(specs)}).tuples().all())
            updates = [
                {"partition_id": row["partition_id"], "job_id": row["job_id"], "revision": row["revision"],
                 "schedule_key": identity.key}
                for row in rows
                if (identity := identities.get((row["partition_id"], row["job_id"]))) is not None
                and stored.get(identity.key) == identity.canonical
            ]
            if updates:
                bind.execute(_SET, updates)


def downgrade() -> None:
    op.execute("UPDATE jobs SET schedule_key = NULL WHERE schedule_key IS NOT NULL")
    op.execute("DELETE FROM schedules")
