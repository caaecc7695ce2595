"""The audit: every (job, nominal time) in a window exactly once, never early (docs/design.md §8).

:func:`verify` recomputes, from each job's schedule, every slot with nominal
time in ``[since, until)`` and compares them with ``runs`` and ``skips`` in
SQL. A job is audited revision by revision: ``job_revisions`` holds each
superseded spec with the interval ``[valid_from, valid_until)`` of store
time it was in force (copied by every rewrite: ``jobs add --replace``,
pause, resume, delete), the ``jobs`` row is in force from its
``changed_at`` (to ``deleted_at`` for a deleted job).

* **expected**: per revision, the slots of its schedule inside its
  interval: strictly after the job's creation for the first revision,
  strictly after ``valid_from`` for a later one, except that a revision
  whose schedule columns (kind, expression, dialect, zone, interval,
  anchor, instant) equal its predecessor's, which was not paused,
  continues it seamlessly (from ``valid_from`` inclusive); before
  ``valid_until``; none while paused. So an edited job is audited up to
  and from the edit, a paused one up to the pause, a deleted one up to
  its deletion. A job rewritten before revisions were kept (a gap in its
  revision numbers) is audited only from the first rewrite whose history
  is known, its runs before it left alone; when that instant is inside or
  after the window it counts in ``jobs_excluded``, else in
  ``jobs_audited``. A slot whose scheduled time (nominal + jitter) is after
  ``until`` is not expected yet, and its run, if it already fired
  (auditing the past), is not audited.
* **missing**: expected slots with no run and not inside a *valid* skip
  range (a misfire policy's decision counts as accounted for; a skip that
  breaks its rule does not);
* **skipped**: expected slots with no run inside a valid skip range;
* **skips_invalid**: skip rows meeting the window that break their rule,
  judged with the policy in force at ``recorded_at``: ``catchup_window``
  needs misfire ``all`` and every slot in the range older than
  ``recorded_at − catchup_window_s``; ``grace`` needs misfire ``skip`` and
  every slot scheduled more than ``misfire_grace_s`` before
  ``recorded_at``; ``once`` needs misfire ``once``, the same grace rule,
  and a run at ``until_nominal`` (the collapsed run carries the latest
  missed slot); ``edited``, ``paused`` and ``deleted`` need a rewrite of
  the job at ``recorded_at`` (a ``job_revisions.valid_until``) and no slot
  in the range after it; ``overlap`` (docs/delivery.md) needs a run of the
  job under an overlap policy unfinished at ``recorded_at``; any other
  reason is invalid; a skip whose range holds a run the schedule fired is
  invalid (a backfilled or manual run may fill a skipped slot);
* **duplicates**: (job, nominal time) pairs with more than one run (the
  primary key forbids them; counted from the data, not assumed);
* **unexpected**: audited runs at a nominal time the schedule then in force
  does not produce. Audited runs are the schedule's own (``origin``
  ``schedule``): manual runs (``jobs trigger``, at no slot) and backfilled
  ones (late by design) are not audited, but a backfilled run is a slot's
  run (not missing);
* **early**: audited runs fired before their scheduled time: the stored
  ``scheduled_at``, or the one the audit computes (nominal + the job's
  jitter), or the nominal time, whichever is latest (a wrong stored
  scheduled time cannot hide an early run);
* **expected_disagreements** (``exhaustive=True`` only, else ``None``):
  slots that only one of :mod:`scheduler.schedule` (which fires them) and
  the independent brute-force :mod:`scheduler.oracle` produces;
* **lateness**: fired_at − stored scheduled time of the audited runs,
  p50/p99/max in seconds (``None`` when there are none).

The report fails (``ok`` false) when any of missing, duplicates, early,
unexpected, skips_invalid or expected_disagreements is non-zero. Each comes
with a list of its first ``list_limit`` findings (by job id, then nominal
time) in ``findings``.

Slots are computed in Python once per distinct cron schedule and expanded to
revisions in SQL (jobs sharing an expression share the work); only interval,
one-shot and jittered revisions are computed one at a time (and, when
exhaustive, every revision by the oracle). Everything is compared set-based
in temporary tables, so millions of jobs and runs cost seconds.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg

from scheduler import oracle, store
from scheduler.delivery.views import run_id
from scheduler.errors import ValidationError
from scheduler.planner import scheduled_time
from scheduler.schedule import format_instant
from scheduler.spec import build_schedule

_EPSILON = timedelta(microseconds=1)
MAX_WINDOW = timedelta(days=31)
"""Longest window one audit accepts (its cost grows with the slots in it)."""
LIST_LIMIT = 100
"""Default number of findings of each kind listed (the counts are always total)."""
EXHAUSTIVE_BUDGET = 5_000_000
"""Most wall-clock units (minutes or seconds, plus interval slots) ``--exhaustive`` tests
in one audit: about a minute of Python at worst (every second of a day matching)."""
FINDINGS = ("missing", "duplicates", "early", "unexpected", "skips_invalid", "expected_disagreements")
"""The kinds of finding, in report order; each is a count and a bounded list."""


@dataclasses.dataclass
class VerifyReport:
    """Counts of :func:`verify`; lateness in seconds (``None`` without runs).

    ``expected_disagreements`` is ``None`` unless the audit was exhaustive.
    ``findings`` maps each name of :data:`FINDINGS` to at most
    ``findings_limit`` dicts (JSON-ready: ids and instants as strings), in
    (job id, nominal time) order; the counts above are the totals.
    """

    expected: int = 0
    runs: int = 0
    missing: int = 0
    duplicates: int = 0
    unexpected: int = 0
    early: int = 0
    skips_invalid: int = 0
    expected_disagreements: int | None = None
    skipped: int = 0
    jobs_audited: int = 0
    jobs_excluded: int = 0
    lateness_p50_s: float | None = None
    lateness_p99_s: float | None = None
    lateness_max_s: float | None = None
    findings_limit: int = LIST_LIMIT
    findings: dict[str, list[dict]] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> dict[str, int]:
        """The findings that fail the audit, name → count (empty when it passed)."""
        return {name: getattr(self, name) for name in FINDINGS if getattr(self, name)}

    @property
    def ok(self) -> bool:
        """True when nothing is missing, duplicated, early or unexpected, every skip is
        valid and (exhaustive audits) the oracle agrees."""
        return not self.failed

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


def _in_segment(slot: datetime, segment: dict) -> bool:
    """Whether ``slot`` lies in a revision's interval (audit_segments row)."""
    low = segment["slots_from"]
    if not (slot > low or (segment["seamless"] and slot == low)):
        return False
    return segment["valid_until"] is None or slot < segment["valid_until"]


def segment_slots(segments: list[dict], since: datetime, until: datetime, slots_of) -> Iterator[tuple]:
    """Yield ``(partition_id, job_id, nominal, scheduled)`` for revisions audited one at a time.

    ``segments``: rows of the ``audit_segments`` query, ordered by job.
    ``slots_of(row, start, end)`` lists the row's schedule's slots in
    ``[start, end)``. A slot whose jittered time is after ``until`` is not
    expected yet; a job's slots are yielded once even if two revisions
    claim the same instant.
    """
    seen: set[tuple] = set()
    current = None
    for row in segments:
        if (row["partition_id"], row["job_id"]) != current:
            current, seen = (row["partition_id"], row["job_id"]), set()
        start = max(since, row["slots_from"])
        end = until if row["valid_until"] is None else min(until, row["valid_until"])
        if start >= end:
            continue
        for slot in slots_of(row, start, end):
            if slot in seen or not _in_segment(slot, row):
                continue
            at = scheduled_time(row["job_id"], slot, row["jitter_s"])
            if at > until:
                continue
            seen.add(slot)
            yield row["partition_id"], row["job_id"], slot, at


def _check_window(since: datetime, until: datetime, list_limit: int) -> None:
    """Raise ValidationError unless ``[since, until)`` is an audit window and ``list_limit`` a list bound."""
    for field, value in (("since", since), ("until", until)):
        if value.tzinfo is None:
            raise ValidationError(field, "must carry a UTC offset", value.isoformat())
    if since >= until:
        raise ValidationError("until", "must be later than {since}", until.isoformat())
    if until - since > MAX_WINDOW:
        raise ValidationError(
            "until",
            f"the window may span at most {MAX_WINDOW.days} days; audit a long period as several windows",
            until.isoformat(),
        )
    if isinstance(list_limit, bool) or not isinstance(list_limit, int) or not 0 <= list_limit <= 10_000:
        raise ValidationError("list_limit", "must be a whole number from 0 to 10000", list_limit)


def verify(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    exhaustive: bool = False,
    list_limit: int = LIST_LIMIT,
) -> VerifyReport:
    """Audit the runs with nominal time in ``[since, until)``; see the module doc.

    Both bounds must be aware datetimes with ``since < until``, at most
    :data:`MAX_WINDOW` apart, and ``until`` not after the store's now (else
    ValidationError, fields ``since``/``until``). ``exhaustive`` also
    recomputes every expected slot with :mod:`scheduler.oracle` (per job;
    ValidationError, field ``exhaustive``, when that would test more than
    :data:`EXHAUSTIVE_BUDGET` wall-clock units). ``list_limit`` (0-10,000)
    bounds each list of findings. Read-only: its working tables are
    temporary and dropped at commit; retried whole on 40001/40P01
    (store.run_transaction). Cost: one pass over ``jobs`` (and the
    ``job_revisions`` of candidates) and one over the window's runs in SQL;
    Python computes slots once per distinct cron schedule, plus per
    revision only for interval, one-shot and jittered ones.

    It sees only the store ``conn`` reads: runs that vanished with a failed
    asynchronous primary (or a backup restored) and whose slots fired again
    count once, so a clean report does not prove no slot fired twice
    (:mod:`scheduler.coordination.rewind` is what notices that).
    """
    _check_window(since, until, list_limit)
    window = {"since": since, "until": until}

    def audit(conn: psycopg.Connection) -> VerifyReport:
        now = store.now(conn)
        if until > now:
            raise ValidationError(
                "until",
                f"must not be in the future: slots after now (store time {now.isoformat()}) cannot have fired yet",
                until.isoformat(),
            )
        store.execute(conn, "create_audit_versions", window)
        store.execute(conn, "create_audit_tables")
        schedules = store.execute(conn, "audit_cron_schedules")
        segments = store.execute(conn, "audit_segments", {"all": exhaustive})
        oracle_slots = _oracle_slots(segments, since, until) if exhaustive else None  # refuses first
        with conn.cursor() as cur:
            with cur.copy(
                "COPY audit_cron_slots (cron_expr, cron_dialect, tz, nominal_time) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "text", "text", "timestamptz"])
                for row in schedules:
                    schedule = build_schedule(
                        "cron", row["cron_expr"], row["cron_dialect"], row["tz"], None, None, None
                    )
                    for slot in _slots(schedule, since, until):
                        copy.write_row((row["cron_expr"], row["cron_dialect"], row["tz"], slot))
            per_job = (
                segments
                if not exhaustive
                else [row for row in segments if row["kind"] != "cron" or row["jitter_s"] > 0]
            )
            with cur.copy(
                "COPY audit_expected (partition_id, job_id, nominal_time, scheduled_at) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["int4", "uuid", "timestamptz", "timestamptz"])
                for row in segment_slots(per_job, since, until, _schedule_slots(since, until)):
                    copy.write_row(row)
            if exhaustive:
                with cur.copy(
                    "COPY audit_oracle (partition_id, job_id, nominal_time) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(["int4", "uuid", "timestamptz"])
                    for partition_id, job_id, slot, _ in segment_slots(segments, since, until, oracle_slots):
                        copy.write_row((partition_id, job_id, slot))
        store.execute(conn, "analyze_audit_slots")
        store.execute(conn, "expand_audit_cron_slots")
        store.execute(conn, "analyze_audit_tables")
        store.execute(conn, "create_audit_runs", window)
        store.execute(conn, "create_audit_skips", window)
        store.execute(conn, "create_audit_unfired")
        store.execute(conn, "analyze_audit_results")
        counts = store.execute(conn, "summarize_audit", {**window, "exhaustive": exhaustive})[0]
        report = VerifyReport(**counts, findings_limit=list_limit)
        for name in FINDINGS:
            rows = []
            if getattr(report, name) and list_limit:
                query = "list_audit_disagreements" if name == "expected_disagreements" else f"list_audit_{name}"
                rows = [_jsonable(row) for row in store.execute(conn, query, {"limit": list_limit})]
            report.findings[name] = rows
        return report

    # Read-only, but at SERIALIZABLE (CockroachDB, or PostgreSQL set so) a
    # concurrent firing transaction can cancel it with 40001: retried whole
    # (its working tables vanish with the aborted transaction).
    return store.run_transaction(conn, audit)


def _jsonable(row: dict) -> dict:
    return {
        key: format_instant(value) if isinstance(value, datetime) else str(value) if key == "job_id" else value
        for key, value in row.items()
    }


def _schedule_slots(since: datetime, until: datetime):
    """``slots_of`` for :func:`segment_slots` from :mod:`scheduler.schedule`.

    Each distinct cron schedule is computed once over the whole window.
    """
    shared: dict[tuple, list[datetime]] = {}

    def slots_of(row: dict, start: datetime, end: datetime) -> list[datetime]:
        if row["kind"] == "cron":
            key = (row["cron_expr"], row["cron_dialect"], row["tz"])
            if key not in shared:
                shared[key] = _slots(build_schedule("cron", *key, None, None, None), since, until)
            listed = shared[key]
            return listed[bisect.bisect_left(listed, start) : bisect.bisect_left(listed, end)]
        schedule = build_schedule(row["kind"], None, None, None, row["interval_s"], row["anchor_at"], row["fire_at"])
        return _slots(schedule, start, end)

    return slots_of


def _oracle_slots(segments: list[dict], since: datetime, until: datetime):
    """``slots_of`` for :func:`segment_slots` from :mod:`scheduler.oracle`.

    Each distinct cron schedule is enumerated once over the whole window.
    Raises ValidationError (field ``exhaustive``) before any enumeration
    when the window holds more than :data:`EXHAUSTIVE_BUDGET` units.
    """
    schedules = {(r["cron_expr"], r["cron_dialect"], r["tz"]) for r in segments if r["kind"] == "cron"}
    days = (until - since) / timedelta(days=1) + 3  # the oracle's margin of local days
    units = 0.0
    for expr, dialect, _ in schedules:
        try:
            units += days * oracle.candidates_per_day(oracle.parse(expr, dialect))
        except oracle.OracleError:
            pass  # reported per job by slots_of below
    units += sum((until - since) / timedelta(seconds=r["interval_s"]) for r in segments if r["kind"] == "interval")
    if units > EXHAUSTIVE_BUDGET:
        raise ValidationError(
            "exhaustive",
            f"the window holds about {int(units):,} wall-clock minutes/seconds and interval slots "
            f"to enumerate, more than {EXHAUSTIVE_BUDGET:,}; audit a shorter window",
            f"{since.isoformat()}..",
        )
    shared: dict[tuple, list[datetime]] = {}

    def slots_of(row: dict, start: datetime, end: datetime) -> list[datetime]:
        try:
            if row["kind"] == "cron":
                key = (row["cron_expr"], row["cron_dialect"], row["tz"])
                if key not in shared:
                    shared[key] = oracle.cron_slots(*key, since, until, budget=EXHAUSTIVE_BUDGET)
                listed = shared[key]
                return listed[bisect.bisect_left(listed, start) : bisect.bisect_left(listed, end)]
            return oracle.slots(
                row["kind"],
                None,
                None,
                None,
                row["interval_s"],
                row["anchor_at"],
                row["fire_at"],
                start,
                end,
                budget=EXHAUSTIVE_BUDGET,
            )
        except oracle.OracleError as exc:
            raise ValidationError("exhaustive", f"the oracle cannot enumerate job {row['job_id']}: {exc}") from None

    return slots_of


# ---------------------------------------------------------------- delivery (verify --delivery)

SETTLE_INTERVAL_S = 1.0
"""How often a partition's owner settles expired leases and failed attempts (docs/delivery.md)."""

DELIVERY_FINDINGS = ("lost", "dead", "canceled", "stale")
"""The runs :func:`verify_delivery` lists, in report order."""


@dataclasses.dataclass
class DeliveryReport:
    """Counts of :func:`verify_delivery` over the runs with nominal time in the window.

    Every run is in exactly one of: ``succeeded``, ``dead``, ``canceled``
    (finished), ``pending``, ``leased``, ``failed`` (unfinished: still being
    delivered), ``lost`` (no delivery state though fired at or after
    ``state_since``) or ``predelivery`` (no delivery state, fired before
    it). ``stale`` counts the leased and failed runs among them whose lease
    ended more than the lease TTL + :data:`SETTLE_INTERVAL_S` ago (their
    owner should have settled them). ``state_since``: the earliest
    ``fired_at`` of a run in the window that carries a state (None: none
    does). ``findings`` lists, for each of :data:`DELIVERY_FINDINGS`, the
    first ``findings_limit`` runs (job id, nominal time, state, attempt,
    fired_at, leased_until, worker, last_error, and its ``run_id``) by job id then nominal time.
    """

    runs: int = 0
    succeeded: int = 0
    dead: int = 0
    canceled: int = 0
    pending: int = 0
    leased: int = 0
    failed: int = 0
    lost: int = 0
    predelivery: int = 0
    stale: int = 0
    state_since: datetime | None = None
    findings_limit: int = LIST_LIMIT
    findings: dict[str, list[dict]] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no run is lost (stale leases are reported, not failed: they are late, not lost)."""
        return self.lost == 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def verify_delivery(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    lease_ttl_s: float,
    list_limit: int = LIST_LIMIT,
    now: datetime | None = None,
) -> DeliveryReport:
    """The delivery audit (docs/delivery.md, "Seeing it") of the runs with nominal time in ``[since, until)``.

    The bounds are checked as :func:`verify` checks them (ValidationError,
    fields ``since``/``until``/``list_limit``); ``lease_ttl_s`` (> 0) is the
    fleet's lease TTL; ``now`` pins the store clock (tests; None: the
    store's now). Read-only, one transaction retried on 40001/40P01; one
    pass over the window's runs plus one per listed finding.
    """
    _check_window(since, until, list_limit)
    if not 0 < lease_ttl_s < float("inf"):
        raise ValidationError("lease_ttl_s", "must be a number of seconds > 0", lease_ttl_s)

    def audit(c: psycopg.Connection) -> DeliveryReport:
        at = store.now(c, now)
        params = {
            "since": since,
            "until": until,
            "stale_before": at - timedelta(seconds=lease_ttl_s + SETTLE_INTERVAL_S),
        }
        report = DeliveryReport(**store.execute(c, "summarize_delivery_audit", params)[0], findings_limit=list_limit)
        for kind in DELIVERY_FINDINGS:
            rows = []
            if getattr(report, kind) and list_limit:
                rows = [
                    _jsonable({"run_id": run_id(row["job_id"], row["nominal_time"]), **row})
                    for row in store.execute(c, "list_delivery_audit", {**params, "kind": kind, "limit": list_limit})
                ]
            report.findings[kind] = rows
        return report

    return store.run_transaction(conn, audit)
