"""Stored slots after a time-zone database update: find them, replan them.

Why
---
A job's next slot is stored as a UTC instant (``next_nominal_at``), computed
by the node or CLI that planned it, under the IANA rules of the ``tzdata``
release it bundled. Zones change their rules (America/Havana's offset after
2026-11-01 differs between tzdata releases; Asia/Almaty moved from +06 to
+05 in 2024). After an update, a stored instant that meant "09:00 local"
can mean 08:00 or 10:00: fired as stored, the run comes an hour early, and
the next slot (planned under the new rules) fires the same day again.

Two mechanisms, both here:

1. **At plan time** (every tick, :func:`is_slot`): a cron job whose stored
   slot is not a slot of its schedule under the running node's rules is
   not fired; the firing loop hands it to :func:`replan_jobs` at the end of
   the tick, which moves it to its *true* slot, and a later tick fires that
   (the run carries the true slot as its nominal time, its identity). So an
   early run or a second run for one slot never happens, whatever the
   versions involved; a slot that moved earlier is fired late, by at most
   the distance it moved.
2. **Ahead of time** (:func:`replan_store`): the store records in
   ``store_meta`` the tzdata release its slots were computed with
   (``tzdata_version``). A node started with another release replans every
   stored future slot that is not a slot under its rules, in bounded
   batches, on a thread of its own, then records its release; so a slot
   that moved *earlier* fires on time too. ``scheduler jobs replan-slots``
   runs the same pass by hand (docs/operations.md).

The true slot
-------------
The first slot of the schedule (current rules) strictly after the job's
last *handled* instant: the latest of its last run's nominal time, the end
of its last skip range (exclusive: just before it), and the start of its
current revision (``changed_at``; ``created_at`` when the pending slot is
older than the last edit, i.e. an edit kept it). Computed per job in
:func:`true_slot`; the inputs come from the runs and skips primary keys
(one index probe each).

Safety
------
Replanning is a compare-and-set: a job moves only if its revision and its
stored slot are still the ones read, so it never overwrites a concurrent
firing's advance or an edit, and the firing statement's own
compare-and-set (``fire_runs``: the slot read, forward only) refuses a plan
made from the old slot. It needs no fence: from the same inputs every node
with the same rules computes the same true slot, and a replan by a stale
owner is the same write. During a rolling upgrade that changes tzdata,
nodes with different releases disagree on affected slots: each replans what
it fires by its own rules, so an affected job follows the rules of whichever
node owns its partition (upgrade quickly; ``verify --exhaustive`` audits
the result).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import tzdata

from scheduler import log, store
from scheduler.errors import ValidationError
from scheduler.planner import scheduled_time
from scheduler.schedule import Schedule
from scheduler.spec import ScheduleCache, ScheduleKey, schedule_key

_EPSILON = timedelta(microseconds=1)

REPLAN_BATCH = 5_000
"""Jobs read per transaction by :func:`replan_store` (keyset over the primary key)."""

META_KEY = "tzdata_version"
"""The ``store_meta`` key holding the tzdata release the stored slots were computed with."""


def tzdata_version() -> str:
    """The IANA release of the bundled ``tzdata`` package (e.g. ``2026f``): the rules
    every schedule of this process is computed with (scheduler/zones.py)."""
    return str(tzdata.IANA_VERSION)


def is_slot(schedule: Schedule, instant: datetime) -> bool:
    """True if ``instant`` (aware) is a fire of ``schedule`` under the current rules."""
    return schedule.next_after(instant - _EPSILON) == instant


def true_slot(
    schedule: Schedule,
    *,
    stored: datetime,
    created_at: datetime,
    changed_at: datetime,
    last_run: datetime | None,
    last_skip_until: datetime | None,
) -> datetime | None:
    """The slot a job whose stored slot ``stored`` is wrong should be at (module doc).

    ``last_run``: the latest nominal time of its runs; ``last_skip_until``: the
    latest end of its skip ranges (exclusive); either may be ``None``.
    Returns ``None`` if the schedule has no slot left.
    """
    base = changed_at if stored > changed_at else created_at
    if last_run is not None:
        base = max(base, last_run)
    if last_skip_until is not None:
        base = max(base, last_skip_until - _EPSILON)
    return schedule.next_after(base)


@dataclasses.dataclass(frozen=True)
class Replan:
    """A job whose stored slot is not a slot of its schedule: primary key, the
    ``revision`` and stored slot read (the compare-and-set), and the ``jobs``
    columns :func:`true_slot` and the schedule need."""

    partition_id: int
    job_id: uuid.UUID
    revision: int
    stored: datetime
    schedule_key: ScheduleKey
    jitter_s: int
    created_at: datetime
    changed_at: datetime


SLOTS_REPLANNED_LOGGED = 10
"""Jobs a call of :func:`replan_jobs` names in ``slot_replanned`` log events; the rest are
counted in one ``slot_replanned_more`` event (the metric counts them all)."""


def replan_jobs(conn: psycopg.Connection, items: Iterable[Replan], cache: ScheduleCache | None = None) -> int:
    """Move each job to its true slot (compare-and-set); return how many moved.

    One transaction (retried whole on 40001/40P01): reads the jobs' last run
    and skip (``last_handled``), computes the true slots, writes them with
    ``replan_slots``. Jobs edited or fired meanwhile are left alone (the next
    plan sees them afresh). Once committed, logs ``slot_replanned`` (WARNING) for
    the first :data:`SLOTS_REPLANNED_LOGGED` jobs moved and ``slot_replanned_more``
    with the count of the others.
    """
    items = list(items)
    if not items:
        return 0
    cache = cache or ScheduleCache()

    def body(c: psycopg.Connection) -> list[tuple[Replan, datetime | None]]:
        handled = {
            (row["partition_id"], row["job_id"]): row
            for row in store.execute(
                c, "last_handled", {"pids": [i.partition_id for i in items], "jids": [i.job_id for i in items]}
            )
        }
        moves = []
        for item in items:
            last = handled.get((item.partition_id, item.job_id), {})
            schedule = cache.for_key(item.schedule_key)
            slot = true_slot(
                schedule,
                stored=item.stored,
                created_at=item.created_at,
                changed_at=item.changed_at,
                last_run=last.get("last_run"),
                last_skip_until=last.get("last_skip_until"),
            )
            if slot == item.stored:
                continue
            moves.append((item, slot))
        if not moves:
            return []
        rows = store.execute(
            c,
            "replan_slots",
            {
                "pids": [m.partition_id for m, _ in moves],
                "jids": [m.job_id for m, _ in moves],
                "revs": [m.revision for m, _ in moves],
                "froms": [m.stored for m, _ in moves],
                "nominals": [slot for _, slot in moves],
                "dues": [None if slot is None else scheduled_time(m.job_id, slot, m.jitter_s) for m, slot in moves],
            },
        )
        moved = {(row["partition_id"], row["job_id"]) for row in rows}
        return [(item, slot) for item, slot in moves if (item.partition_id, item.job_id) in moved]

    done = store.run_transaction(conn, body)
    # Logged once committed (the body may run again on a retry), a few by name: a release
    # that moves a zone with 100,000 jobs must not write 100,000 lines.
    for item, slot in done[:SLOTS_REPLANNED_LOGGED]:
        log.event(
            "slot_replanned",
            logging.WARNING,
            job_id=str(item.job_id),
            stored=item.stored.isoformat(),
            true_slot=None if slot is None else slot.isoformat(),
            tzdata=tzdata_version(),
        )
    if len(done) > SLOTS_REPLANNED_LOGGED:
        log.event(
            "slot_replanned_more", logging.WARNING, jobs=len(done) - SLOTS_REPLANNED_LOGGED, tzdata=tzdata_version()
        )
    return len(done)


def replan_item(row: dict[str, Any]) -> Replan:
    """A :class:`Replan` from a ``jobs`` row (a dict with the ``jobs`` column names)."""
    return Replan(
        row["partition_id"],
        row["job_id"],
        row["revision"],
        row["next_nominal_at"],
        schedule_key(row),
        row["jitter_s"],
        row["created_at"],
        row["changed_at"],
    )


@dataclasses.dataclass
class ReplanReport:
    """Outcome of :func:`replan_store`: cron jobs ``checked``, ``replanned``, and the
    tzdata releases ``previous`` (``None``: never recorded) and ``current``."""

    checked: int = 0
    replanned: int = 0
    previous: str | None = None
    current: str = ""


def recorded_version(conn: psycopg.Connection) -> str | None:
    """The tzdata release recorded in ``store_meta`` (``None``: none yet)."""
    rows = store.execute(conn, "get_store_meta", {"key": META_KEY})
    return rows[0]["value"] if rows else None


def replan_store(
    conn: psycopg.Connection, *, batch_size: int = REPLAN_BATCH, force: bool = False, dry_run: bool = False
) -> ReplanReport:
    """Replan every stored cron slot that is not a slot under this process's tzdata.

    Skipped (nothing read) when the recorded release equals this one, unless
    ``force``. Walks the cron jobs with a pending slot in primary-key order,
    ``batch_size`` per transaction, and replans the ones whose stored slot is
    not a slot (:func:`replan_jobs`); then records this release
    (``set_store_meta``), unless ``dry_run`` (which only counts). Returns a
    :class:`ReplanReport`. Raises ``psycopg.Error`` / StoreError on store
    failures (what was replanned stays replanned; the pass is re-runnable).
    """
    report = ReplanReport(previous=recorded_version(conn), current=tzdata_version())
    if report.previous == report.current and not force:
        return report
    cache = ScheduleCache()
    after: tuple[int, uuid.UUID] = (-1, uuid.UUID(int=0))

    def page(c: psycopg.Connection[Any], key: tuple[int, uuid.UUID]) -> list[store.Row]:
        return store.execute(c, "cron_jobs_page", {"after_pid": key[0], "after_job": key[1], "limit": batch_size})

    while True:
        rows = store.run_transaction(conn, functools.partial(page, key=after))
        if not rows:
            break
        after = (rows[-1]["partition_id"], rows[-1]["job_id"])
        report.checked += len(rows)
        wrong = []
        for row in rows:
            try:
                schedule = cache.for_row(row)
            except ValidationError:  # a row that no longer parses: the tick reports it (job_invalid)
                continue
            if not is_slot(schedule, row["next_nominal_at"]):
                wrong.append(replan_item(row))
        if dry_run:
            report.replanned += len(wrong)
        else:
            report.replanned += replan_jobs(conn, wrong, cache)
    if not dry_run:
        store.run_transaction(
            conn, lambda c: store.execute(c, "set_store_meta", {"key": META_KEY, "value": report.current})
        )
    log.event(
        "slots_replanned",
        checked=report.checked,
        replanned=report.replanned,
        previous=report.previous,
        current=report.current,
        dry_run=dry_run,
    )
    return report
