"""The fire planner (scheduler/planner.py): pure, ``now`` is an argument.

Worked examples pin each misfire policy to exact instants; property tests
compare :func:`plan_job` with a straightforward reference model that walks
every slot one by one (the planner jumps over long outages), and check the
invariants the firing transaction relies on: fires strictly increasing and
in the past, at most ``limit`` of them, the next slot after every fired one,
skip ranges holding no fired slot, and deterministic jitter in
``[0, jitter_s]``.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner import (
    COUNT_CAP,
    Plan,
    SkipRange,
    jitter_offset_s,
    plan_job,
    scheduled_time,
)
from scheduler.schedule import CronSchedule, IntervalSchedule, OnceSchedule

UTC = UTC
JOB = uuid.UUID("12345678-1234-5678-1234-567812345678")
S = timedelta(seconds=1)


def t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def minutes(start: str, count: int) -> list[datetime]:
    first = t(start)
    return [first + timedelta(minutes=i) for i in range(count)]


# ---------------------------------------------------------------- worked examples

EVERY_MINUTE = CronSchedule("* * * * *")


def test_not_due_yet_changes_nothing() -> None:
    plan = plan_job(EVERY_MINUTE, job_id=JOB, next_nominal=t("2030-01-01T00:01:00Z"), now=t("2030-01-01T00:00:59.999Z"))
    assert plan == Plan([], None, t("2030-01-01T00:01:00Z"), t("2030-01-01T00:01:00Z"))


def test_exhausted_job_changes_nothing() -> None:
    plan = plan_job(EVERY_MINUTE, job_id=JOB, next_nominal=None, now=t("2030-01-01T00:00:00Z"))
    assert plan == Plan([], None, None, None)


def test_on_time_slot_fires_and_advances() -> None:
    plan = plan_job(EVERY_MINUTE, job_id=JOB, next_nominal=t("2030-01-01T00:01:00Z"), now=t("2030-01-01T00:01:00.020Z"))
    assert plan.fires == [(t("2030-01-01T00:01:00Z"), t("2030-01-01T00:01:00Z"))]
    assert plan.skip is None
    assert plan.next_nominal == plan.next_due == t("2030-01-01T00:02:00Z")


def test_all_fires_every_overdue_slot_oldest_first() -> None:
    plan = plan_job(
        EVERY_MINUTE, job_id=JOB, next_nominal=t("2030-01-01T00:01:00Z"), now=t("2030-01-01T00:05:30Z"), misfire="all"
    )
    assert [n for n, _ in plan.fires] == minutes("2030-01-01T00:01:00Z", 5)
    assert all(n == s for n, s in plan.fires)
    assert plan.skip is None
    assert plan.next_nominal == t("2030-01-01T00:06:00Z")


def test_all_records_slots_older_than_the_catchup_window() -> None:
    # Outage from 00:01 to 00:10:30, window 300 s: horizon 00:05:30.
    plan = plan_job(
        EVERY_MINUTE,
        job_id=JOB,
        next_nominal=t("2030-01-01T00:01:00Z"),
        now=t("2030-01-01T00:10:30Z"),
        misfire="all",
        catchup_window_s=300,
    )
    assert plan.skip == SkipRange(t("2030-01-01T00:01:00Z"), t("2030-01-01T00:06:00Z"), 5, "catchup_window")
    assert [n for n, _ in plan.fires] == minutes("2030-01-01T00:06:00Z", 5)
    assert plan.next_nominal == t("2030-01-01T00:11:00Z")


def test_all_slot_exactly_at_the_window_edge_fires() -> None:
    plan = plan_job(
        EVERY_MINUTE,
        job_id=JOB,
        next_nominal=t("2030-01-01T00:01:00Z"),
        now=t("2030-01-01T00:06:00Z"),
        misfire="all",
        catchup_window_s=300,
    )
    assert plan.skip is None
    assert [n for n, _ in plan.fires] == minutes("2030-01-01T00:01:00Z", 6)


def test_all_respects_the_limit_and_resumes_at_the_first_unfired_slot() -> None:
    plan = plan_job(
        EVERY_MINUTE, job_id=JOB, next_nominal=t("2030-01-01T00:01:00Z"), now=t("2030-01-01T00:05:30Z"), limit=2
    )
    assert [n for n, _ in plan.fires] == minutes("2030-01-01T00:01:00Z", 2)
    assert plan.next_nominal == plan.next_due == t("2030-01-01T00:03:00Z")
    rest = plan_job(EVERY_MINUTE, job_id=JOB, next_nominal=plan.next_nominal, now=t("2030-01-01T00:05:31Z"), limit=10)
    assert [n for n, _ in rest.fires] == minutes("2030-01-01T00:03:00Z", 3)
    assert rest.next_nominal == t("2030-01-01T00:06:00Z")


def test_once_collapses_the_missed_slots_and_fires_those_within_the_grace() -> None:
    # now 00:05:30, grace 60 s: 00:01-00:04 are missed (more than 60 s late):
    # one run for the latest of them (00:04), 00:01-00:03 skipped; 00:05 is
    # 30 s late, within the grace: it fires as it is.
    plan = plan_job(
        EVERY_MINUTE,
        job_id=JOB,
        next_nominal=t("2030-01-01T00:01:00Z"),
        now=t("2030-01-01T00:05:30Z"),
        misfire="once",
        misfire_grace_s=60,
    )
    assert plan.fires == [
        (t("2030-01-01T00:04:00Z"), t("2030-01-01T00:04:00Z")),
        (t("2030-01-01T00:05:00Z"), t("2030-01-01T00:05:00Z")),
    ]
    assert plan.skip == SkipRange(t("2030-01-01T00:01:00Z"), t("2030-01-01T00:04:00Z"), 3, "once")
    assert plan.next_nominal == t("2030-01-01T00:06:00Z")


def test_once_with_a_zero_grace_fires_only_the_latest_overdue_slot() -> None:
    plan = plan_job(
        EVERY_MINUTE,
        job_id=JOB,
        next_nominal=t("2030-01-01T00:01:00Z"),
        now=t("2030-01-01T00:05:30Z"),
        misfire="once",
        misfire_grace_s=0,
    )
    assert plan.fires == [(t("2030-01-01T00:05:00Z"), t("2030-01-01T00:05:00Z"))]
    assert plan.skip == SkipRange(t("2030-01-01T00:01:00Z"), t("2030-01-01T00:05:00Z"), 4, "once")
    assert plan.next_nominal == t("2030-01-01T00:06:00Z")


def test_once_under_slow_ticks_loses_no_slot() -> None:
    """An every-second job ticked every 1.3 s (or 2 s) for 10 minutes: every
    slot is seconds late, never missed, so every slot fires exactly once
    (before the grace rule, 138 of 599 were collapsed away at 1.3 s)."""
    every_second = IntervalSchedule(1, t("2030-01-01T00:00:00Z"))
    for step_s in (1.3, 2.0):
        slot, fired, skipped = t("2030-01-01T00:00:01Z"), [], []
        now = t("2030-01-01T00:00:01Z")
        end = t("2030-01-01T00:10:00Z")
        while now < end:
            now += timedelta(seconds=step_s)
            plan = plan_job(every_second, job_id=JOB, next_nominal=slot, now=now, misfire="once")
            fired += [n for n, _ in plan.fires]
            skipped.append(plan.skip)
            slot = plan.next_nominal
        expected = [t("2030-01-01T00:00:01Z") + i * S for i in range(len(fired))]
        assert fired == expected, step_s
        assert fired[-1] >= end - 2 * S
        assert skipped == [None] * len(skipped)


def test_once_with_a_single_overdue_slot_fires_it_normally() -> None:
    plan = plan_job(
        EVERY_MINUTE, job_id=JOB, next_nominal=t("2030-01-01T00:01:00Z"), now=t("2030-01-01T00:01:59Z"), misfire="once"
    )
    assert plan.fires == [(t("2030-01-01T00:01:00Z"), t("2030-01-01T00:01:00Z"))]
    assert plan.skip is None
    assert plan.next_nominal == t("2030-01-01T00:02:00Z")


def test_skip_drops_slots_later_than_the_grace() -> None:
    # now 00:05:30, grace 60 s: 00:04:30 is the oldest slot still in grace.
    plan = plan_job(
        EVERY_MINUTE,
        job_id=JOB,
        next_nominal=t("2030-01-01T00:01:00Z"),
        now=t("2030-01-01T00:05:30Z"),
        misfire="skip",
        misfire_grace_s=60,
    )
    assert plan.skip == SkipRange(t("2030-01-01T00:01:00Z"), t("2030-01-01T00:05:00Z"), 4, "grace")
    assert plan.fires == [(t("2030-01-01T00:05:00Z"), t("2030-01-01T00:05:00Z"))]
    assert plan.next_nominal == t("2030-01-01T00:06:00Z")


def test_skip_slot_exactly_grace_late_fires() -> None:
    plan = plan_job(
        EVERY_MINUTE,
        job_id=JOB,
        next_nominal=t("2030-01-01T00:04:00Z"),
        now=t("2030-01-01T00:05:00Z"),
        misfire="skip",
        misfire_grace_s=60,
    )
    assert plan.skip is None
    assert [n for n, _ in plan.fires] == minutes("2030-01-01T00:04:00Z", 2)


def test_pacing_lateness_under_default_policies_is_never_a_skip() -> None:
    # Seconds late (pacing, failover): none of the defaults skips anything.
    for policy in ("all", "skip"):
        plan = plan_job(
            EVERY_MINUTE,
            job_id=JOB,
            next_nominal=t("2030-01-01T00:01:00Z"),
            now=t("2030-01-01T00:01:13Z"),
            misfire=policy,
        )
        assert plan.skip is None
        assert [n for n, _ in plan.fires] == [t("2030-01-01T00:01:00Z")]


def test_one_shot_fires_once_then_is_exhausted() -> None:
    at = t("2030-01-01T09:00:00Z")
    plan = plan_job(OnceSchedule(at), job_id=JOB, next_nominal=at, now=at + 3 * S)
    assert plan.fires == [(at, at)]
    assert plan.skip is None
    assert plan.next_nominal is None and plan.next_due is None


def test_one_shot_older_than_the_window_is_skipped_not_fired() -> None:
    at = t("2030-01-01T09:00:00Z")
    plan = plan_job(OnceSchedule(at), job_id=JOB, next_nominal=at, now=at + timedelta(hours=2), catchup_window_s=3600)
    assert plan.fires == []
    assert plan.skip == SkipRange(at, at + timedelta(hours=1), 1, "catchup_window")
    assert plan.next_nominal is None


def test_a_year_long_outage_costs_one_uncounted_skip_range() -> None:
    every_second = IntervalSchedule(1, t("2029-01-01T00:00:00Z"))
    now = t("2030-01-01T00:00:00.5Z")
    plan = plan_job(every_second, job_id=JOB, next_nominal=t("2029-01-01T00:00:00Z"), now=now, misfire="all", limit=10)
    assert plan.skip == SkipRange(t("2029-01-01T00:00:00Z"), t("2029-12-31T00:00:01Z"), None, "catchup_window")
    assert [n for n, _ in plan.fires] == [t("2029-12-31T00:00:01Z") + i * S for i in range(10)]
    assert plan.next_nominal == t("2029-12-31T00:00:11Z")

    once = plan_job(every_second, job_id=JOB, next_nominal=t("2029-01-01T00:00:00Z"), now=now, misfire="once")
    # Missed: everything before 23:59:00.5 (grace 60 s); the latest of those,
    # 23:59:00, carries the collapsed run; the 60 slots in the grace fire.
    latest_missed = t("2029-12-31T23:59:00Z")
    assert once.fires == [(latest_missed + i * S, latest_missed + i * S) for i in range(61)]
    assert once.skip == SkipRange(t("2029-01-01T00:00:00Z"), latest_missed, None, "once")
    assert once.next_nominal == t("2030-01-01T00:00:01Z")


def test_skip_count_is_exact_up_to_the_cap() -> None:
    every_second = IntervalSchedule(1, t("2030-01-01T00:00:00Z"))
    first = t("2030-01-01T00:00:00Z")
    plan = plan_job(
        every_second,
        job_id=JOB,
        next_nominal=first,
        now=first + COUNT_CAP * S + S / 2,
        misfire="once",
        misfire_grace_s=0,
    )
    assert plan.skip == SkipRange(first, first + COUNT_CAP * S, COUNT_CAP, "once")
    plan = plan_job(
        every_second,
        job_id=JOB,
        next_nominal=first,
        now=first + (COUNT_CAP + 1) * S + S / 2,
        misfire="once",
        misfire_grace_s=0,
    )
    assert plan.skip.slots is None


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="bogus"):
        plan_job(
            EVERY_MINUTE,
            job_id=JOB,
            next_nominal=t("2030-01-01T00:01:00Z"),
            now=t("2030-01-01T00:02:00Z"),
            misfire="bogus",
        )


# ---------------------------------------------------------------- jitter


def test_jitter_pinned_values() -> None:
    nominal = t("2030-01-01T00:00:00Z")
    assert jitter_offset_s(JOB, nominal, 1) == 0.91
    assert jitter_offset_s(JOB, nominal, 20) == 19.324
    assert jitter_offset_s(JOB, nominal, 300) == 161.382
    assert jitter_offset_s(JOB, nominal, 0) == 0.0
    assert scheduled_time(JOB, nominal, 20) == t("2030-01-01T00:00:19.324Z")
    assert scheduled_time(JOB, nominal, 0) == nominal


def reference_jitter_ms(job_id: uuid.UUID, nominal: datetime, jitter_s: int) -> int:
    epoch_s = int((nominal - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() // 1)
    digest = hashlib.sha256(job_id.bytes + epoch_s.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_s * 1000 + 1)


@settings(max_examples=300, deadline=None)
@given(
    job=st.uuids(),
    epoch_s=st.integers(min_value=0, max_value=4_000_000_000),
    jitter_s=st.integers(min_value=1, max_value=86_400),
)
def test_jitter_is_deterministic_bounded_and_documented(job: uuid.UUID, epoch_s: int, jitter_s: int) -> None:
    nominal = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=epoch_s)
    offset = jitter_offset_s(job, nominal, jitter_s)
    assert offset == jitter_offset_s(job, nominal, jitter_s)
    assert offset == jitter_offset_s(job, nominal.astimezone(timezone(timedelta(hours=5))), jitter_s)
    assert 0.0 <= offset <= jitter_s
    assert offset * 1000 == pytest.approx(round(offset * 1000), abs=1e-6)  # millisecond steps
    assert round(offset * 1000) == reference_jitter_ms(job, nominal, jitter_s)
    assert scheduled_time(job, nominal, jitter_s) - nominal == timedelta(milliseconds=round(offset * 1000))


def test_jitter_varies_by_job_and_slot() -> None:
    nominal = t("2030-01-01T00:00:00Z")
    by_slot = {jitter_offset_s(JOB, nominal + i * S, 60) for i in range(50)}
    by_job = {jitter_offset_s(uuid.UUID(int=i), nominal, 60) for i in range(50)}
    assert len(by_slot) > 40 and len(by_job) > 40


# ---------------------------------------------------------------- properties against a reference model

# (schedule, nominal period in seconds) — the period bounds the outages drawn.
SCHEDULES = [
    (CronSchedule("* * * * *"), 60),
    (CronSchedule("*/5 * * * *", "Europe/Berlin"), 300),
    (CronSchedule("0 * * * *", "America/New_York"), 3600),
    (CronSchedule("30 2 * * *", "America/New_York"), 86_400),
    (CronSchedule("*/10 * * * * *", "UTC", "seconds"), 10),
    (IntervalSchedule(1, t("2030-03-01T00:00:00Z")), 1),
    (IntervalSchedule(7, t("2030-03-01T00:00:03Z")), 7),
    (IntervalSchedule(3600, t("2030-03-01T00:17:00Z")), 3600),
]


@st.composite
def situations(draw, max_jitter: int = 0):
    index = draw(st.integers(0, len(SCHEDULES) - 1))
    schedule, period = SCHEDULES[index]
    start = t("2030-03-01T00:00:00Z") + timedelta(seconds=draw(st.integers(0, 300 * 86_400)))
    first = schedule.next_after(start)
    outage_s = draw(st.integers(0, 200)) * period + draw(st.integers(0, period))
    now = first + timedelta(seconds=outage_s, microseconds=draw(st.integers(0, 999_999)))
    return {
        "schedule": schedule,
        "job_id": draw(st.uuids()),
        "first": first,
        "now": now,
        "jitter_s": draw(st.integers(0, max_jitter)) if max_jitter else 0,
        "limit": draw(st.one_of(st.integers(1, 50), st.just(1_000_000))),
        "window_s": draw(st.integers(0, outage_s + period)),
        "grace_s": draw(st.integers(0, 5 * period)),
    }


def walk(schedule, first: datetime, stop) -> list[datetime]:
    """Slots from ``first`` on while ``stop(slot)`` is false (one by one)."""
    out, slot = [], first
    while slot is not None and not stop(slot):
        out.append(slot)
        slot = schedule.next_after(slot)
    return out


def check_invariants(plan: Plan, sit: dict) -> None:
    fired = [n for n, _ in plan.fires]
    assert all(a < b for a, b in zip(fired, fired[1:], strict=False)), "fires strictly increasing"
    assert len(fired) <= sit["limit"]
    assert all(n >= sit["first"] for n in fired)
    for nominal, scheduled in plan.fires:
        assert scheduled == scheduled_time(sit["job_id"], nominal, sit["jitter_s"])
        assert scheduled <= sit["now"]
    if plan.next_nominal is not None:
        assert all(plan.next_nominal > n for n in fired)
        assert plan.next_due == scheduled_time(sit["job_id"], plan.next_nominal, sit["jitter_s"])
    else:
        assert plan.next_due is None
    if plan.skip is not None:
        assert plan.skip.first == sit["first"]
        assert plan.skip.first < plan.skip.until
        assert not any(plan.skip.first <= n < plan.skip.until for n in fired), "a fired slot inside a skip range"
        if plan.next_nominal is not None:
            assert plan.skip.until <= plan.next_nominal


def plan_for(sit: dict, misfire: str) -> Plan:
    return plan_job(
        sit["schedule"],
        job_id=sit["job_id"],
        next_nominal=sit["first"],
        now=sit["now"],
        misfire=misfire,
        catchup_window_s=sit["window_s"],
        misfire_grace_s=sit["grace_s"],
        jitter_s=sit["jitter_s"],
        limit=sit["limit"],
    )


@settings(max_examples=250, deadline=None)
@given(sit=situations())
def test_all_matches_the_reference(sit: dict) -> None:
    plan = plan_for(sit, "all")
    check_invariants(plan, sit)
    schedule, now = sit["schedule"], sit["now"]
    horizon = now - timedelta(seconds=sit["window_s"])
    skipped = walk(schedule, sit["first"], lambda s: s >= horizon)
    rest_first = schedule.next_after(skipped[-1]) if skipped else sit["first"]
    due = walk(schedule, rest_first, lambda s: s > now)
    fired = due[: sit["limit"]]
    assert [n for n, _ in plan.fires] == fired
    if skipped:
        assert plan.skip == SkipRange(sit["first"], rest_first, len(skipped), "catchup_window")
    else:
        assert plan.skip is None
    expected_next = schedule.next_after(fired[-1]) if fired else rest_first
    assert plan.next_nominal == expected_next


@settings(max_examples=250, deadline=None)
@given(sit=situations())
def test_all_with_a_window_covering_the_outage_skips_nothing(sit: dict) -> None:
    outage = sit["now"] - sit["first"]
    sit = {**sit, "window_s": int(outage.total_seconds()) + 1, "limit": 1_000_000}
    plan = plan_for(sit, "all")
    assert plan.skip is None
    assert [n for n, _ in plan.fires] == walk(sit["schedule"], sit["first"], lambda s: s > sit["now"])
    assert plan.next_nominal > sit["now"]


@settings(max_examples=250, deadline=None)
@given(sit=situations())
def test_once_matches_the_reference(sit: dict) -> None:
    plan = plan_for(sit, "once")
    check_invariants(plan, sit)
    now, grace = sit["now"], timedelta(seconds=sit["grace_s"])
    due = walk(sit["schedule"], sit["first"], lambda s: s > now)
    missed = [s for s in due if now - s > grace]
    fired = missed[-1:] + [s for s in due if now - s <= grace]
    fired = fired[: sit["limit"]]
    assert [n for n, _ in plan.fires] == fired
    if len(missed) > 1:
        assert plan.skip == SkipRange(due[0], missed[-1], len(missed) - 1, "once")
    else:
        assert plan.skip is None
    assert plan.next_nominal == sit["schedule"].next_after(fired[-1])
    if len(fired) < sit["limit"]:
        assert plan.next_nominal > now


@settings(max_examples=250, deadline=None)
@given(sit=situations())
def test_skip_matches_the_reference(sit: dict) -> None:
    plan = plan_for(sit, "skip")
    check_invariants(plan, sit)
    now, grace = sit["now"], timedelta(seconds=sit["grace_s"])
    skipped = walk(sit["schedule"], sit["first"], lambda s: now - s <= grace)
    rest_first = sit["schedule"].next_after(skipped[-1]) if skipped else sit["first"]
    due = walk(sit["schedule"], rest_first, lambda s: s > now)
    assert [n for n, _ in plan.fires] == due[: sit["limit"]]
    if skipped:
        assert plan.skip == SkipRange(sit["first"], rest_first, len(skipped), "grace")
    else:
        assert plan.skip is None


@settings(max_examples=400, deadline=None)
@given(sit=situations(max_jitter=120), misfire=st.sampled_from(["all", "once", "skip"]))
def test_invariants_hold_with_jitter(sit: dict, misfire: str) -> None:
    plan = plan_for(sit, misfire)
    check_invariants(plan, sit)
    if sit["jitter_s"] == 0 or scheduled_time(sit["job_id"], sit["first"], sit["jitter_s"]) > sit["now"]:
        return
    # Something was due: the job made progress (fired or skipped its first slot).
    assert plan.fires or plan.skip is not None
    # Every slot before the new next slot is accounted for: fired or inside the skip range.
    fired = {n for n, _ in plan.fires}
    if plan.next_nominal is not None:
        for slot in walk(sit["schedule"], sit["first"], lambda s: s >= plan.next_nominal):
            assert slot in fired or (plan.skip is not None and plan.skip.first <= slot < plan.skip.until)


@settings(max_examples=300, deadline=None)
@given(sit=situations(max_jitter=120))
def test_skip_with_jitter_matches_the_reference(sit: dict) -> None:
    """Slot by slot: too late (more than grace past its jittered time) and nothing
    fired yet → skipped; too late after a fire → left for the next tick (one
    contiguous skip range per plan); otherwise fired, up to the limit."""
    plan = plan_for(sit, "skip")
    check_invariants(plan, sit)
    schedule, now, grace = sit["schedule"], sit["now"], timedelta(seconds=sit["grace_s"])
    skipped, fired, slot = [], [], sit["first"]
    while slot is not None and len(fired) < sit["limit"]:
        at = scheduled_time(sit["job_id"], slot, sit["jitter_s"])
        if at > now:
            break
        if now - at > grace:
            if fired:
                break
            skipped.append(slot)
        else:
            fired.append(slot)
        slot = schedule.next_after(slot)
    assert [n for n, _ in plan.fires] == fired
    assert plan.next_nominal == slot
    if skipped:
        assert plan.skip == SkipRange(skipped[0], schedule.next_after(skipped[-1]), len(skipped), "grace")
    else:
        assert plan.skip is None
