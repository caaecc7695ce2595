"""The audit: every (job, nominal time) in a window exactly once (DESIGN.md §8).

:func:`verify` recomputes, from each job's schedule, every slot with nominal
time in ``[since, until)`` and compares them with ``runs`` in SQL:

* **expected**: slots of jobs that existed and were not changed in the
  window. A job created inside the window counts from its first slot after
  creation; a job paused, edited (``--replace``), resumed or deleted inside
  the window is left out and counted in ``jobs_excluded``. A slot whose
  scheduled time (nominal + jitter) is after ``until`` is not expected yet,
  and its run, if it already fired (auditing the past), is not audited.
* **missing**: expected slots with no run and not inside a recorded skip
  range (a misfire policy's decision counts as accounted for);
* **duplicates**: (job, nominal time) pairs with more than one run (the
  primary key forbids them; counted from the data, not assumed);
* **unexpected**: runs of audited jobs at a nominal time the schedule does
  not produce;
* **lateness**: fired_at − scheduled time of the audited runs, p50/p99/max
  in seconds (``None`` when there are none).

Slots are computed in Python once per distinct cron schedule and expanded to
jobs in SQL (jobs sharing an expression share the work); only interval,
one-shot and jittered jobs are computed per job. Everything is compared
set-based in temporary tables, so millions of jobs and runs cost seconds.
"""

from __future__ import annotations

import bisect
import dataclasses
from datetime import datetime, timedelta

import psycopg

from scheduler import store
from scheduler.errors import ValidationError
from scheduler.planner import scheduled_time
from scheduler.spec import build_schedule

_EPSILON = timedelta(microseconds=1)
MAX_WINDOW = timedelta(days=31)
"""Longest window one audit accepts (its cost grows with the slots in it)."""


@dataclasses.dataclass
class VerifyReport:
    """Counts of :func:`verify`; lateness in seconds (``None`` without runs)."""

    expected: int = 0
    runs: int = 0
    missing: int = 0
    duplicates: int = 0
    unexpected: int = 0
    skipped: int = 0
    jobs_audited: int = 0
    jobs_excluded: int = 0
    lateness_p50_s: float | None = None
    lateness_p99_s: float | None = None
    lateness_max_s: float | None = None

    @property
    def ok(self) -> bool:
        """True when nothing is missing, duplicated or unexpected."""
        return self.missing == 0 and self.duplicates == 0 and self.unexpected == 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _slots(schedule, start: datetime, until: datetime) -> list[datetime]:
    """Fires of ``schedule`` with ``start ≤ nominal < until``."""
    out: list[datetime] = []
    slot = schedule.next_after(start - _EPSILON)
    while slot is not None and slot < until:
        out.append(slot)
        slot = schedule.next_after(slot)
    return out


def per_job_slots(jobs: list[dict], since: datetime, until: datetime):
    """Yield ``(partition_id, job_id, nominal)`` for jobs audited one at a time.

    Interval and one-shot slots depend on the job; so does a cron slot's
    jitter (a slot whose jittered time is after ``until`` is not expected
    yet). Jitter-free cron jobs are expanded in SQL instead.
    """
    shared: dict[tuple, list[datetime]] = {}
    for job in jobs:
        start = max(since, job["counted_from"] + _EPSILON)
        if job["kind"] == "cron":
            key = (job["cron_expr"], job["cron_dialect"], job["tz"])
            slots = shared.get(key)
            if slots is None:
                schedule = build_schedule("cron", job["cron_expr"], job["cron_dialect"], job["tz"],
                                          None, None, None)
                slots = shared[key] = _slots(schedule, since, until)
            slots = slots[bisect.bisect_left(slots, start):]
        else:
            schedule = build_schedule(job["kind"], None, None, None, job["interval_s"],
                                      job["anchor_at"], job["fire_at"])
            slots = _slots(schedule, start, until)
        for slot in slots:
            if job["jitter_s"] and scheduled_time(job["job_id"], slot, job["jitter_s"]) > until:
                continue
            yield job["partition_id"], job["job_id"], slot


def verify(conn: psycopg.Connection, since: datetime, until: datetime) -> VerifyReport:
    """Audit the runs with nominal time in ``[since, until)``; see the module doc.

    Both bounds must be aware datetimes with ``since < until``, at most
    :data:`MAX_WINDOW` apart, and ``until`` not after the store's now (else
    ValidationError, fields ``since``/``until``). Read-only: its working
    tables are temporary and dropped at commit; retried whole on 40001/40P01
    (store.run_transaction). Cost: one pass over ``jobs``
    and one over the window's runs in SQL; Python computes slots once per
    distinct cron schedule, plus per job only for interval, one-shot and
    jittered jobs.
    """
    for field, value in (("since", since), ("until", until)):
        if value.tzinfo is None:
            raise ValidationError(field, "must carry a UTC offset", value.isoformat())
    if since >= until:
        raise ValidationError("until", "must be later than --since", until.isoformat())
    if until - since > MAX_WINDOW:
        raise ValidationError("until", f"the window may span at most {MAX_WINDOW.days} days; "
                              "audit a long period as several windows", until.isoformat())
    window = {"since": since, "until": until}
    report = VerifyReport()

    def audit(conn: psycopg.Connection) -> dict:
        now = store.execute(conn, "store_now")[0]["store_now"]
        if until > now:
            raise ValidationError("until", "must not be in the future: slots after now (store time "
                                  f"{now.isoformat()}) cannot have fired yet", until.isoformat())
        store.execute(conn, "create_audit_candidates", window)
        store.execute(conn, "create_audit_tables")
        schedules = store.execute(conn, "audit_cron_schedules")
        per_job = store.execute(conn, "audit_per_job")
        with conn.cursor() as cur:
            with cur.copy("COPY audit_cron_slots (cron_expr, cron_dialect, tz, nominal_time) "
                          "FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["text", "text", "text", "timestamptz"])
                for row in schedules:
                    schedule = build_schedule("cron", row["cron_expr"], row["cron_dialect"], row["tz"],
                                              None, None, None)
                    for slot in _slots(schedule, since, until):
                        copy.write_row((row["cron_expr"], row["cron_dialect"], row["tz"], slot))
            with cur.copy("COPY audit_expected_tmp (partition_id, job_id, nominal_time) "
                          "FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "uuid", "timestamptz"])
                for row in per_job_slots(per_job, since, until):
                    copy.write_row(row)
        store.execute(conn, "expand_audit_cron_slots")
        store.execute(conn, "analyze_audit_tables")
        return store.execute(conn, "compare_audit", window)[0]

    # Read-only, but at SERIALIZABLE (CockroachDB, or PostgreSQL set so) a
    # concurrent firing transaction can cancel it with 40001: retried whole
    # (its working tables vanish with the aborted transaction).
    row = store.run_transaction(conn, audit)
    for key, value in row.items():
        setattr(report, key, value)
    return report
