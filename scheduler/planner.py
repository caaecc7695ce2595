"""The fire planner: which slots of a due job to fire now, which to skip (pure).

Given a job's next slot (nominal time), its misfire policy and the store's
``now``, :func:`plan_job` returns the runs to fire this tick (oldest first,
at most ``limit``), the range of slots to record as skipped, and the job's
new next slot. No I/O; ``now`` is an argument (CONTRIBUTING.md rule 1; Temporal's
``ProcessTimeRange``).

Misfire (catch-up) policies, docs/design.md §3. "Overdue" means the slot's
scheduled time (nominal + jitter) is ≤ now.

``all`` (default)
    Fire every overdue slot, oldest first. Slots whose nominal time is older
    than ``now − catchup_window_s`` (default 24 h) are recorded as skipped.
``once``
    Slots *missed* by more than ``misfire_grace_s`` (default 60 s) past their
    scheduled time collapse into one run carrying the *latest* missed
    nominal time; the earlier missed ones are recorded as skipped (reason
    ``once``). Overdue slots still within the grace fire normally, each, so
    slow ticks and pacing (seconds late) never drop a slot.
``skip``
    Slots later than ``misfire_grace_s`` (default 60 s) past their scheduled
    time are recorded as skipped; the rest fire.

Under the defaults, pacing and failover lateness (seconds) never become a
skipped slot. Skips are recorded as half-open ranges ``[first, until)`` of
nominal times with a slot count when it was cheap to count (≤
:data:`COUNT_CAP` slots), else ``None``: one row per decision however long
the outage, so a year-long outage of an every-second job costs one row, not
31 million.

Jitter: a deterministic offset in ``[0, jitter_s]`` seconds (millisecond
steps) seeded by (job id, nominal time) — see :func:`jitter_offset_s` — so a
failover never re-rolls it. The run keeps the nominal time as its identity;
lateness is measured from the jittered (scheduled) time. Jitter is smaller
than the smallest gap between consecutive slots (refused otherwise when the
job is saved, :func:`scheduler.spec.check_jitter`), so scheduled times
increase with nominal times and slots fall due in nominal order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the planner imports nothing of the engine at run time
    from scheduler.schedule import Schedule

MISFIRE_POLICIES = ("all", "once", "skip")
"""The misfire (catch-up) policies, in the order the CLI offers them."""
DEFAULT_MISFIRE = "all"
"""The policy of a job that names none (docs/design.md §3)."""
CATCHUP_WINDOW_S = 86_400
"""Default catch-up window of the ``all`` policy (docs/design.md §3)."""
MISFIRE_GRACE_S = 60
"""Default grace of the ``once`` and ``skip`` policies (docs/design.md §3)."""
COUNT_CAP = 10_000
"""Skipped slots are counted up to this many; beyond, the count is ``None``."""

_EPSILON = timedelta(microseconds=1)
_PROBES_S = (60, 3_600, 86_400, 31 * 86_400, 400 * 86_400)


@dataclasses.dataclass(frozen=True)
class SkipRange:
    """Slots ``first ≤ nominal < until`` recorded as skipped; ``slots`` counted or ``None``."""

    first: datetime
    until: datetime
    slots: int | None
    reason: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do with one due job this tick.

    ``fires``: ``(nominal, scheduled)`` pairs, oldest first. ``skip``: a range
    to record, or ``None``. ``next_nominal``/``next_due``: the job's new next
    slot and its scheduled time (``None`` when the schedule is exhausted).
    """

    fires: list[tuple[datetime, datetime]]
    skip: SkipRange | None
    next_nominal: datetime | None
    next_due: datetime | None


def jitter_offset_s(job_id: uuid.UUID, nominal: datetime, jitter_s: int) -> float:
    """Deterministic jitter in seconds, in ``[0, jitter_s]`` with 1 ms steps.

    ``SHA-256(job_id.bytes ‖ int64_be(nominal epoch seconds))``, first 8 bytes
    as an unsigned big-endian integer, modulo ``jitter_s × 1000 + 1``, in ms.
    """
    if jitter_s <= 0:
        return 0.0
    key = job_id.bytes + int(nominal.timestamp()).to_bytes(8, "big", signed=True)
    digest = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return (digest % (jitter_s * 1000 + 1)) / 1000.0


def scheduled_time(job_id: uuid.UUID, nominal: datetime, jitter_s: int) -> datetime:
    """Nominal time plus the job's deterministic jitter."""
    if jitter_s <= 0:
        return nominal
    return nominal + timedelta(seconds=jitter_offset_s(job_id, nominal, jitter_s))


def count_slots(schedule: Schedule, first: datetime, until: datetime) -> int | None:
    """Slots in ``[first, until)`` given ``first`` is a slot; ``None`` past :data:`COUNT_CAP`."""
    count, slot = 0, first
    while slot < until:
        count += 1
        if count > COUNT_CAP:
            return None
        following = schedule.next_after(slot)
        if following is None:
            break
        slot = following
    return count


def _latest_at_or_before(schedule: Schedule, first: datetime, now: datetime) -> datetime:
    """The latest slot ≤ ``now``, given slot ``first`` ≤ ``now``.

    Probes windows of growing length back from ``now`` so the walk is short
    for frequent schedules after a long outage.
    """
    start = first
    for probe_s in _PROBES_S:
        candidate = schedule.next_after(now - timedelta(seconds=probe_s) - _EPSILON)
        if candidate is not None and candidate <= now:
            start = max(candidate, first)
            break
    latest, slot = start, schedule.next_after(start)
    while slot is not None and slot <= now:
        latest, slot = slot, schedule.next_after(slot)
    return latest


def plan_job(
    schedule: Schedule,
    *,
    job_id: uuid.UUID,
    next_nominal: datetime | None,
    now: datetime,
    misfire: str = DEFAULT_MISFIRE,
    catchup_window_s: int = CATCHUP_WINDOW_S,
    misfire_grace_s: int = MISFIRE_GRACE_S,
    jitter_s: int = 0,
    limit: int = 1_000_000,
) -> Plan:
    """Plan one job at store time ``now`` (aware UTC). See the module doc.

    ``limit`` (≥ 1) caps the runs fired this tick; the job's next slot is
    then the first unfired one, still due, fired next tick. Raises
    ``ValueError`` for an unknown ``misfire`` policy.
    """
    if misfire not in MISFIRE_POLICIES:
        raise ValueError(f"unknown misfire policy {misfire!r}")

    def sched(slot: datetime) -> datetime:
        return scheduled_time(job_id, slot, jitter_s)

    def done(fires: list[tuple[datetime, datetime]], skip: SkipRange | None, slot: datetime | None) -> Plan:
        return Plan(fires, skip, slot, None if slot is None else sched(slot))

    slot = next_nominal
    if jitter_s <= 0 and slot is not None and limit >= 1:
        # Fast path, identical in result to the general one below: one
        # on-time slot without jitter (the whole herd goes this way).
        if slot > now:
            return Plan([], None, slot, slot)
        late_s = (now - slot).total_seconds()
        if (misfire == "all" and late_s <= catchup_window_s) or (misfire != "all" and late_s <= misfire_grace_s):
            following = schedule.next_after(slot)
            if following is None or following > now:
                return Plan([(slot, slot)], None, following, following)
    if slot is None or sched(slot) > now:
        return done([], None, slot)

    if misfire == "once":
        # A slot is *missed* when it is more than the grace past its scheduled
        # time; only missed slots collapse into one run (the latest missed
        # nominal time), the rest of the overdue slots fire as they are, so
        # slow ticks or pacing (seconds) never drop a slot.
        horizon = now - timedelta(seconds=misfire_grace_s)
        skip = None
        fires = []
        if sched(slot) < horizon:
            latest = _latest_at_or_before(schedule, slot, horizon - _EPSILON)
            while latest > slot and sched(latest) >= horizon:  # jitter pushed it into the grace
                prior = _latest_at_or_before(schedule, slot, latest - _EPSILON)
                if prior == latest:
                    break
                latest = prior
            if latest > slot:
                skip = SkipRange(slot, latest, count_slots(schedule, slot, latest), "once")
            fires.append((latest, sched(latest)))
            slot = schedule.next_after(latest)
        while slot is not None and len(fires) < limit:
            at = sched(slot)
            if at > now or at < horizon:  # not due yet, or missed after a fire: next tick's
                break
            fires.append((slot, at))
            slot = schedule.next_after(slot)
        return done(fires, skip, slot)

    if misfire == "all":
        horizon = now - timedelta(seconds=catchup_window_s)
        reason = "catchup_window"
    else:
        horizon = now - timedelta(seconds=misfire_grace_s + jitter_s)
        reason = "grace"
    skip = None
    if slot < horizon:
        kept = schedule.next_after(horizon - _EPSILON)
        until = kept if kept is not None else horizon
        skip = SkipRange(slot, until, count_slots(schedule, slot, until), reason)
        slot = kept

    fires = []
    grace = timedelta(seconds=misfire_grace_s)
    while slot is not None and len(fires) < limit:
        at = sched(slot)
        if at > now:
            break
        following = schedule.next_after(slot)
        if misfire == "skip" and now - at > grace:
            # Only reachable through jitter (the jump above used grace + jitter).
            if fires:
                # A plan records one contiguous skip range, and it must not
                # cover a fired slot: stop here; this slot is still overdue
                # and is skipped by the next tick's plan.
                break
            until = following if following is not None else slot + _EPSILON
            if skip is None:
                skip = SkipRange(slot, until, 1, reason)
            else:
                skip = dataclasses.replace(skip, until=until, slots=None if skip.slots is None else skip.slots + 1)
        else:
            fires.append((slot, at))
        slot = following
    return done(fires, skip, slot)
