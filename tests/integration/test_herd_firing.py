"""Herds: many timers of one tenant due at one instant, fired by ``fire_group``
(scheduler/firing/herds.py; sql/queries.sql herd_heads, herd_counts,
herd_schedule_keys, fire_group).

Herds are sized down (the firer's ``FiringLimits.herd_min_jobs``) so a few dozen timers form one. Each
test asserts the exact runs and next slots in the store, and that the herd
path (``TickResult.herd_fired``) or the per-timer path fired them.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from helpers import OneNode, stamp_schedule_keys

from scheduler import jobs, store
from scheduler.audit import verify
from scheduler.clock import ManualClock
from scheduler.firing import FiringLimits
from scheduler.firing.herds import HerdFinder
from scheduler.partition import partition_of
from scheduler.planner import scheduled_time
from scheduler.schedule import CronSchedule
from scheduler.spec import JobSpec
from scheduler.zones import load_zone

HOUR = timedelta(hours=1)


SMALL_HERDS = FiringLimits(herd_min_jobs=20, first_pass_herd_quota=20)
"""Herds of 20 timers and more, looked for in every pass with a share of 20."""


def Node(dsn: str, limits: FiringLimits = SMALL_HERDS, **overrides) -> OneNode:  # noqa: N802 (reads as the class it builds)
    """A node's firing half holding all 1,024 leases, named ``herd``, firing with ``limits``."""
    return OneNode(dsn, node_id="herd", limits=limits, **overrides)


def tick_once(dsn: str, limits: FiringLimits = SMALL_HERDS, **overrides):
    """One tick of a fresh node with these limits and settings; returns its TickResult."""
    n = Node(dsn, limits, **overrides)
    try:
        return n.firer.tick()
    finally:
        n.close()


@pytest.fixture
def node(pg_dsn: str):
    n = Node(pg_dsn)
    yield n
    n.close()


def instant(conn: psycopg.Connection, ago_s: int = 120) -> datetime:
    """A whole second ``ago_s`` before the store's now: the herd's instant."""
    return conn.execute("SELECT date_trunc('second', now()) - make_interval(secs => %s) AS t", (ago_s,)).fetchone()["t"]


def job_id_in(partitions: set[int] | None) -> uuid.UUID:
    while True:
        job_id = uuid.uuid4()
        if partitions is None or partition_of(job_id) in partitions:
            return job_id


def load_herd(
    conn: psycopg.Connection,
    tenant: str,
    count: int,
    due: datetime,
    intervals: tuple[int, ...] = (3600, 7200, 86400),
    partitions: set[int] | None = None,
) -> dict[uuid.UUID, int]:
    """``count`` interval jobs of ``tenant`` (in ``partitions`` if given) whose next
    slot is ``due`` (their anchor one interval earlier), intervals taken in turn;
    returns {job id: interval}."""
    jobs.add_tenant(conn, tenant)
    made = {}
    rows = []
    for i in range(count):
        job_id = job_id_in(partitions)
        interval = intervals[i % len(intervals)]
        made[job_id] = interval
        created = due - timedelta(seconds=interval) - HOUR
        rows.append(
            (
                partition_of(job_id),
                job_id,
                tenant,
                interval,
                due - timedelta(seconds=interval),
                due,
                due,
                created,
                created,
            )
        )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO jobs (partition_id, job_id, tenant, kind, interval_s, anchor_at, next_nominal_at,"
            " next_due_at, created_at, changed_at) VALUES (%s, %s, %s, 'interval', %s, %s, %s, %s, %s, %s)",
            rows,
        )
    stamp_schedule_keys(conn)
    return made


def runs(conn: psycopg.Connection, tenant: str | None = None) -> list[dict]:
    return conn.execute(
        "SELECT * FROM runs WHERE %(t)s::text IS NULL OR tenant = %(t)s ORDER BY partition_id, job_id, nominal_time",
        {"t": tenant},
    ).fetchall()


def job(conn: psycopg.Connection, job_id: uuid.UUID) -> dict:
    return jobs.get_job(conn, job_id)


def in_order(job_ids) -> list[uuid.UUID]:
    """Job ids in (partition, job id) order: the order of a herd's timers."""
    return sorted(job_ids, key=lambda j: (partition_of(j), str(j)))


def epochs(conn: psycopg.Connection) -> dict[int, int]:
    return {
        r["partition_id"]: r["owner_epoch"]
        for r in conn.execute("SELECT partition_id, owner_epoch FROM partitions").fetchall()
    }


def test_a_herd_fires_every_timer_once_with_its_schedules_next_slot(conn, node) -> None:
    """60 interval and 6 cron timers of one tenant due at the top of the hour (one
    herd, four schedules); 5 of another tenant (too few: per timer)."""
    due = conn.execute("SELECT date_trunc('hour', now()) AS t").fetchone()["t"]
    herd = load_herd(conn, "big", 60, due)
    cron_ids = []
    for i in range(6):
        created = jobs.add_job(conn, JobSpec.build(tenant="big", cron="0 * * * *", name=f"cron-{i}" if i else None))
        cron_ids.append(created.job_id)
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(d)s, next_due_at = %(d)s WHERE job_id = ANY(%(ids)s)",
        {"d": due, "ids": cron_ids},
    )
    small = load_herd(conn, "small", 5, due)

    result = node.firer.tick()

    assert (result.fired, result.herd_fired) == (71, 66)
    epoch_of = epochs(conn)
    fired = runs(conn)
    assert len(fired) == 71
    assert {r["job_id"] for r in fired} == {*herd, *small, *cron_ids}
    for run in fired:
        assert run["nominal_time"] == run["scheduled_at"] == due
        assert run["node_id"] == "herd"
        assert run["epoch"] == epoch_of[run["partition_id"]]
        assert run["fired_at"] >= run["scheduled_at"]
    # Each run carries its job's name as of firing ('' for none), as the per-timer path's do.
    assert {r["job_id"]: r["job_name"] for r in fired} == {
        **{j: "" for j in (*herd, *small, cron_ids[0])},
        **{j: f"cron-{i}" for i, j in enumerate(cron_ids) if i},
    }
    for job_id, interval in {**herd, **small}.items():
        row = job(conn, job_id)
        assert row["next_nominal_at"] == row["next_due_at"] == due + timedelta(seconds=interval)
        assert row["revision"] == 1
    for job_id in cron_ids:
        row = job(conn, job_id)
        assert row["next_nominal_at"] == row["next_due_at"] == CronSchedule("0 * * * *").next_after(due) == due + HOUR
    assert node.metrics.value("scheduler_firing_runs_fired_total") == 71
    assert node.metrics.value("scheduler_firing_herd_runs_fired_total") == 66
    again = node.firer.tick()
    assert (again.fired, again.herd_fired) == (0, 0)
    assert len(runs(conn)) == 71


def test_the_quota_takes_whole_partitions_in_partition_order(pg_dsn, conn) -> None:
    """Budget 40 a tick, one tenant with 100 timers at one instant: each tick fires
    the next partitions, whole, while they fit; every timer fires exactly once."""
    due = instant(conn)
    herd = load_herd(conn, "big", 100, due)
    n = Node(pg_dsn, max_rate_per_s=40.0)
    try:
        fire_in_whole_partitions(n, conn, in_order(herd), 40)
    finally:
        n.close()
    assert len(runs(conn)) == 100


def fire_in_whole_partitions(node: OneNode, conn: psycopg.Connection, order: list[uuid.UUID], quota: int) -> int:
    """Tick ``node`` until the timers ``order`` (in (partition, job id) order) have all
    fired, at most ``quota`` a tick, asserting each tick continues that order exactly
    and a herd tick stops at a partition boundary, short of the next partition's
    timers; returns how many ticks fired a herd."""
    fired_so_far: list[uuid.UUID] = []
    herd_ticks = 0
    for _ in range(20):
        result = node.firer.tick()
        new = [j for j in in_order(r["job_id"] for r in runs(conn)) if j not in fired_so_far]
        assert len(new) == result.fired <= quota
        # The tick's timers continue the (partition, job id) order exactly ...
        assert new == order[len(fired_so_far) : len(fired_so_far) + len(new)]
        fired_so_far += new
        if len(fired_so_far) == len(order):
            break
        if result.herd_fired:
            # ... and a herd stops at a partition boundary, short of the next partition's timers.
            herd_ticks += 1
            assert result.herd_fired == result.fired
            nxt = order[len(fired_so_far)]
            assert partition_of(nxt) != partition_of(fired_so_far[-1])
            left = [j for j in order[len(fired_so_far) :] if partition_of(j) == partition_of(nxt)]
            assert result.fired + len(left) > quota
    assert fired_so_far == order
    return herd_ticks


def test_a_pass_continues_a_herd_from_the_per_timer_cursor_inside_a_partition(pg_dsn, conn, monkeypatch) -> None:
    """Budget 100, four tenants: the first pass's shares (25) are below the herd
    size (30), so the big tenant's first 25 timers go per timer and its cursor
    stops inside a partition; its surplus (60) is a herd that must start right
    after that cursor, in the same partition."""
    limits = dataclasses.replace(SMALL_HERDS, herd_min_jobs=30)
    due = instant(conn)
    # 40 timers in partition 0, the first partition in order: the cursor (the
    # 25th timer) stops inside it; 160 more in partitions 1-9.
    herd = {
        **load_herd(conn, "big", 40, due, partitions={0}),
        **load_herd(conn, "big", 160, due, partitions=set(range(1, 10))),
    }
    for tenant in ("s1", "s2", "s3"):
        load_herd(conn, tenant, 5, due)
    order = in_order(herd)
    result = tick_once(pg_dsn, limits, max_rate_per_s=100.0)
    fired = in_order(r["job_id"] for r in runs(conn, "big"))
    assert result.herd_fired > 0
    assert result.fired == len(fired) + 15
    assert fired == order[: len(fired)]  # an exact prefix: nothing skipped, nothing twice
    assert 25 + limits.herd_min_jobs <= len(fired) <= 85
    assert partition_of(order[24]) == partition_of(order[39]) == 0


def test_a_jittered_timer_at_the_herds_instant_is_fired_per_timer(conn, node) -> None:
    due = instant(conn)
    herd = load_herd(conn, "big", 40, due)
    jittered = jobs.add_job(conn, JobSpec.build(tenant="big", interval_s=3600, jitter_s=30)).job_id
    # Its slot is the herd's instant and, as it happens, its due time too.
    conn.execute(
        "UPDATE jobs SET anchor_at = %(a)s, next_nominal_at = %(d)s, next_due_at = %(d)s,"
        " created_at = %(c)s, changed_at = %(c)s WHERE job_id = %(j)s",
        {"a": due - HOUR, "d": due, "c": due - 2 * HOUR, "j": jittered},
    )
    stamp_schedule_keys(conn)

    first = node.firer.tick()
    second = node.firer.tick()

    assert (first.fired, first.herd_fired) == (40, 40)
    assert (second.fired, second.herd_fired) == (1, 0)
    [run] = [r for r in runs(conn) if r["job_id"] == jittered]
    assert run["nominal_time"] == due
    assert run["scheduled_at"] == scheduled_time(jittered, due, 30)
    assert job(conn, jittered)["next_nominal_at"] == due + HOUR
    assert {r["job_id"] for r in runs(conn)} == {*herd, jittered}


def test_a_herd_needing_catch_up_goes_per_timer(conn, node) -> None:
    """Every-minute timers three slots behind: the herd's plan would leave them due,
    so the per-timer planner fires all three slots of each."""
    anchor = instant(conn, ago_s=3 * 60 + 30)
    load_herd(conn, "big", 30, anchor + timedelta(seconds=60), intervals=(60,))
    conn.execute("UPDATE jobs SET anchor_at = %s", (anchor,))
    stamp_schedule_keys(conn)

    result = node.firer.tick()

    assert (result.fired, result.herd_fired) == (90, 0)
    got = conn.execute("SELECT nominal_time, count(*) AS n FROM runs GROUP BY 1 ORDER BY 1").fetchall()
    assert [(r["nominal_time"], r["n"]) for r in got] == [(anchor + timedelta(seconds=60 * k), 30) for k in (1, 2, 3)]


def test_a_herd_partition_taken_over_commits_nothing(conn, node) -> None:
    due = instant(conn)
    herd = load_herd(conn, "big", 50, due)
    victim = partition_of(next(iter(herd)))
    in_victim = {j for j in herd if partition_of(j) == victim}
    conn.execute(
        "UPDATE partitions SET owner_node = 'thief', owner_epoch = owner_epoch + 1 WHERE partition_id = %s", (victim,)
    )

    result = node.firer.tick()

    assert result.fence_rejected == [victim]
    assert result.fired == result.herd_fired == 50 - len(in_victim)
    assert {r["job_id"] for r in runs(conn)} == set(herd) - in_victim
    for job_id in in_victim:
        assert job(conn, job_id)["next_nominal_at"] == due
    assert victim not in node.table.held()
    assert node.metrics.value("scheduler_firing_fence_rejections_total") == 1


def test_a_timer_edited_after_the_herd_was_planned_is_left_to_its_new_schedule(pg_dsn, conn, node, monkeypatch) -> None:
    due = instant(conn)
    herd = load_herd(conn, "big", 30, due)
    edited = jobs.add_job(conn, JobSpec.build(tenant="big", name="edited", interval_s=3600)).job_id
    conn.execute(
        "UPDATE jobs SET anchor_at = %(a)s, next_nominal_at = %(d)s, next_due_at = %(d)s,"
        " created_at = %(c)s, changed_at = %(c)s WHERE job_id = %(j)s",
        {"a": due - HOUR, "d": due, "c": due - 2 * HOUR, "j": edited},
    )
    stamp_schedule_keys(conn)
    real = HerdFinder.plan
    edits = []

    def herd_plan(self, key, due, now):
        if not edits:  # someone replaces the job's spec between the plan and the statement
            with store.connect(pg_dsn, application_name="editor") as other:
                edits.append(
                    jobs.add_job(other, JobSpec.build(tenant="big", name="edited", interval_s=7200), replace=True)
                )
        return real(self, key, due, now)

    monkeypatch.setattr(HerdFinder, "plan", herd_plan)
    result = node.firer.tick()

    assert [e.outcome for e in edits] == ["replaced"]
    assert (result.fired, result.herd_fired) == (30, 30)
    assert {r["job_id"] for r in runs(conn)} == set(herd)
    row = job(conn, edited)
    assert row["interval_s"] == 7200
    assert row["next_nominal_at"] == row["anchor_at"] + timedelta(seconds=7200)
    assert row["next_nominal_at"] > conn.execute("SELECT now() AS n").fetchone()["n"]


def test_a_tick_that_spends_its_budget_on_herds_reports_it_exhausted(pg_dsn, conn) -> None:
    """Budget 100: the big tenant's fair share and its surplus are both herds cut
    short by their quota; the tick must report its budget spent, so the
    loop starts the next tick one interval later instead of waiting for the next
    second (docs: Firer.run)."""
    due = instant(conn)
    load_herd(conn, "big", 300, due, partitions=set(range(20)))  # ~15 a partition: cuts fall short
    load_herd(conn, "small", 5, due)
    result = tick_once(pg_dsn, max_rate_per_s=100.0)
    assert result.herd_fired == result.fired - 5
    assert 2 * SMALL_HERDS.herd_min_jobs <= result.herd_fired <= 95
    assert result.budget_exhausted


def test_by_default_a_big_tenants_herd_is_found_in_the_surplus_pass(pg_dsn, conn, monkeypatch) -> None:
    """With first-pass herds reserved for shares of first_pass_herd_quota, the
    big tenant's fair share (50 of 100) goes per timer and its surplus (45) is
    a herd continuing from that cursor: together an exact prefix of its timers."""
    limits = dataclasses.replace(SMALL_HERDS, first_pass_herd_quota=1_000)
    due = instant(conn)
    herd = load_herd(conn, "big", 300, due)
    load_herd(conn, "small", 5, due)
    result = tick_once(pg_dsn, limits, max_rate_per_s=100.0)
    fired = in_order(r["job_id"] for r in runs(conn, "big"))
    assert fired == in_order(herd)[: len(fired)]
    assert 50 + limits.herd_min_jobs <= len(fired) <= 95
    assert result.herd_fired == len(fired) - 50
    assert result.fired == len(fired) + 5


# ------------------------------------------------------------- many schedules

AT = datetime(2031, 3, 4, 5, 6, tzinfo=UTC)
"""A herd instant (a minute boundary) years away from the real clock: the
store clock is pinned just after it."""
ZONES = (
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Sydney",
    "Asia/Kathmandu",
    "America/St_Johns",
    "Pacific/Chatham",
    "Africa/Cairo",
    "America/Sao_Paulo",
)


def pairs_at(t: datetime) -> list[tuple[str, str]]:
    """Distinct (expression, zone) pairs of several shapes, all firing at ``t``."""
    out = []
    for zone in ZONES:
        lt = t.astimezone(load_zone(zone))
        m, h, d, dow = lt.minute, lt.hour, lt.day, (lt.weekday() + 1) % 7
        out += [
            (f"{m} {h} * * *", zone),
            (f"{m} {h} * * {dow}", zone),
            (f"{m} {h},{(h + 12) % 24} * * *", zone),
            (f"{m} {h} {d} * *", zone),
            (f"{m} */1 * * *", zone),
        ]
    for expr, zone in out:
        assert CronSchedule(expr, zone).next_after(t - timedelta(seconds=1)) == t, (expr, zone)
    return out


def load_cron_herd(conn: psycopg.Connection, tenant: str, per_pair: int, t: datetime, **policy) -> dict:
    """``per_pair`` timers of ``tenant`` per pair of :func:`pairs_at`, registered
    through the engine's write path, their slot moved to ``t``; {job id: pair}."""
    made = {}
    specs = [(pair, JobSpec.build(tenant=tenant, cron=pair[0], tz=pair[1], **policy)) for pair in pairs_at(t)]
    ids = jobs.add_jobs(conn, [spec for _, spec in specs for _ in range(per_pair)])
    for job_id, (pair, _) in zip(ids, [item for item in specs for _ in range(per_pair)], strict=True):
        made[job_id] = pair
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(t)s, next_due_at = %(t)s, created_at = %(c)s, changed_at = %(c)s"
        " WHERE job_id = ANY(%(ids)s)",
        {"t": t, "c": t - timedelta(days=1), "ids": list(made)},
    )
    return made


def test_a_herd_of_many_distinct_schedules_fires_exactly_its_runs_on_the_herd_path(pg_dsn, conn, monkeypatch) -> None:
    """50 distinct (expression, zone) pairs, 3 timers each: one herd, every timer
    fired once at the instant by fire_group and moved to its own schedule's
    next slot; the per-timer path fires nothing. One timer is paused between
    the plan and the statement: not fired, its due slot recorded as skipped,
    and the audit of the instant is clean."""
    t = instant(conn, ago_s=120).replace(second=0)  # a minute boundary 2-3 minutes ago
    made = load_cron_herd(conn, "big", 3, t)
    keys = {r["schedule_key"] for r in conn.execute("SELECT schedule_key FROM jobs").fetchall()}
    assert len(keys) == 50 and None not in keys
    paused = sorted(made)[0]
    real = HerdFinder.plan

    def plan_then_pause(self, key, due, now):
        if not getattr(plan_then_pause, "done", False):
            plan_then_pause.done = True
            with store.connect(pg_dsn, application_name="operator") as other:
                jobs.set_paused(other, paused, True)
        return real(self, key, due, now)

    monkeypatch.setattr(HerdFinder, "plan", plan_then_pause)
    node = Node(pg_dsn, clock=ManualClock(store_at=t + timedelta(seconds=2)))
    try:
        result = node.firer.tick()
        again = node.firer.tick()
    finally:
        node.close()

    assert (result.fired, result.herd_fired) == (149, 149)
    assert (again.fired, again.herd_fired) == (0, 0)
    fired = runs(conn)
    assert sorted(r["job_id"] for r in fired) == sorted(set(made) - {paused})
    for run in fired:
        assert (run["nominal_time"], run["scheduled_at"], run["fired_at"]) == (t, t, t + timedelta(seconds=2))
    for job_id, (expr, zone) in made.items():
        row = job(conn, job_id)
        if job_id == paused:
            assert (row["paused"], row["next_nominal_at"]) == (True, None)
        else:
            assert row["next_nominal_at"] == row["next_due_at"] == CronSchedule(expr, zone).next_after(t)
    skipped = conn.execute("SELECT job_id, first_nominal, reason FROM skips").fetchall()
    assert [(r["job_id"], r["first_nominal"], r["reason"]) for r in skipped] == [(paused, t, "paused")]
    report = verify(conn, t, t + timedelta(seconds=1))
    assert (report.expected, report.runs, report.missing, report.duplicates, report.unexpected) == (150, 149, 0, 0, 0)
    assert (report.skipped, report.skips_invalid) == (1, 0)


def test_spellings_of_one_schedule_share_a_key_and_its_plan(pg_dsn, conn) -> None:
    """``0 6 * * 2``, ``0 6 * * TUE`` and the seconds dialect's ``0 0 6 * * 2`` are
    one schedule: one key, one plan, every timer fired by the herd path."""
    t = datetime(2031, 3, 4, 6, 0, tzinfo=UTC)  # a Tuesday
    specs = [
        JobSpec.build(tenant="big", cron="0 6 * * 2"),
        JobSpec.build(tenant="big", cron="0 6 * * TUE"),
        JobSpec.build(tenant="big", cron="0 0 6 * * 2", dialect="seconds"),
    ]
    ids = jobs.add_jobs(conn, [spec for spec in specs for _ in range(10)])
    conn.execute("UPDATE jobs SET next_nominal_at = %(t)s, next_due_at = %(t)s", {"t": t})
    assert len({r["schedule_key"] for r in conn.execute("SELECT schedule_key FROM jobs").fetchall()}) == 1
    node = Node(pg_dsn, clock=ManualClock(store_at=t + timedelta(seconds=1)))
    try:
        result = node.firer.tick()
    finally:
        node.close()

    assert (result.fired, result.herd_fired) == (30, 30)
    for job_id in ids:
        assert job(conn, job_id)["next_nominal_at"] == t + timedelta(days=7)


def test_a_key_whose_policy_refuses_the_lateness_is_left_to_the_per_timer_path(pg_dsn, conn) -> None:
    """90 s late: timers with ``misfire skip`` (grace 60 s) are skipped by the
    per-timer planner, timers with the default policy fire on the herd path."""
    late = load_cron_herd(conn, "big", 1, AT, misfire="skip")
    on_time = load_cron_herd(conn, "big", 1, AT)
    node = Node(pg_dsn, clock=ManualClock(store_at=AT + timedelta(seconds=90)))
    try:
        first = node.firer.tick()  # the herd: the keys whose plan fires this slot
        second = node.firer.tick()  # what is left forms no herd: per timer
    finally:
        node.close()

    assert (first.fired, first.herd_fired) == (50, 50)
    assert (second.fired, second.herd_fired, second.skipped_ranges) == (0, 0, 50)
    assert {r["job_id"] for r in runs(conn)} == set(on_time)
    skipped = conn.execute("SELECT job_id, first_nominal, reason FROM skips").fetchall()
    assert sorted((r["job_id"], r["first_nominal"], r["reason"]) for r in skipped) == sorted(
        (job_id, AT, "grace") for job_id in late
    )


def test_a_timer_whose_key_was_taken_by_another_spec_fires_per_timer(pg_dsn, conn, monkeypatch) -> None:
    """A hash collision (forced): the second spec's jobs are stored with no key
    and fire per timer, with their own schedule's next slot."""
    from scheduler import identity

    real = identity.identity_of
    monkeypatch.setattr(jobs, "identity_of", lambda row: identity.ScheduleIdentity(42, real(row).canonical))
    hourly = jobs.add_jobs(conn, [JobSpec.build(tenant="big", cron="0 * * * *") for _ in range(25)])
    half = jobs.add_jobs(conn, [JobSpec.build(tenant="big", cron="30 * * * *") for _ in range(25)])
    monkeypatch.undo()
    keys = {r["job_id"]: r["schedule_key"] for r in conn.execute("SELECT job_id, schedule_key FROM jobs").fetchall()}
    assert {keys[j] for j in hourly} == {42} and {keys[j] for j in half} == {None}
    t1, t2 = AT.replace(minute=0), AT.replace(minute=30)
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(t)s, next_due_at = %(t)s WHERE job_id = ANY(%(ids)s)",
        {"t": t1, "ids": hourly},
    )
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(t)s, next_due_at = %(t)s WHERE job_id = ANY(%(ids)s)",
        {"t": t2, "ids": half},
    )
    node = Node(pg_dsn, clock=ManualClock(store_at=t2 + timedelta(seconds=1)))
    try:
        first = node.firer.tick()  # the herd at t1 (its timers after it wait)
        second = node.firer.tick()  # t2: keyless timers form no herd
    finally:
        node.close()

    assert (first.fired, first.herd_fired) == (25, 25)
    assert (second.fired, second.herd_fired) == (25, 0)
    for job_id in hourly:
        assert job(conn, job_id)["next_nominal_at"] == t1 + HOUR
    for job_id in half:
        assert job(conn, job_id)["next_nominal_at"] == t2 + HOUR


def test_the_wait_before_an_instant_prepares_its_schedules(pg_dsn, conn, monkeypatch) -> None:
    """Three seconds before a herd of 50 schedules (and a small tenant's timers
    of the same pairs), the firer's look-ahead prepares every (key, instant);
    when the instant comes, the tick computes no schedule at all."""
    made = load_cron_herd(conn, "big", 2, AT)
    made.update(load_cron_herd(conn, "small", 1, AT))
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    # The big tenant's 100 timers are a herd, the small one's 50 go per timer.
    node = Node(pg_dsn, FiringLimits(herd_min_jobs=60, first_pass_herd_quota=20), clock=clock)
    try:
        before = node.firer.tick()  # nothing due yet; learns the tenants
        node.firer.look_ahead(clock.monotonic() + 60)
        assert (before.fired, node.firer._lookahead.prepared) == (0, 50)
        computed = []
        real = CronSchedule.next_after
        monkeypatch.setattr(CronSchedule, "next_after", lambda self, t: computed.append(t) or real(self, t))
        clock.pin_store(AT + timedelta(seconds=1))
        result = node.firer.tick()
    finally:
        node.close()

    assert (result.fired, result.herd_fired) == (150, 100)
    assert computed == []
    assert sorted(r["job_id"] for r in runs(conn)) == sorted(made)
    for job_id, (expr, zone) in made.items():
        assert job(conn, job_id)["next_nominal_at"] == CronSchedule(expr, zone).next_after(AT)


def test_the_look_ahead_reads_each_timer_once_and_never_past_its_deadline(pg_dsn, conn, monkeypatch) -> None:
    """Each read starts where the last one ended (a timer's index entry is read
    once), at most one read a second, and none once the wait is over."""
    from helpers import record_named_queries

    load_cron_herd(conn, "big", 1, AT)
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    node = Node(pg_dsn, clock=clock)
    try:
        node.firer.tick()
        sent = record_named_queries(monkeypatch)
        node.firer.look_ahead(clock.monotonic() - 1)  # the wait is already over: nothing read
        node.firer.look_ahead(clock.monotonic() + 60)
        node.firer.look_ahead(clock.monotonic() + 60)  # within the same second: no second read
        clock.advance(1.0)
        clock.pin_store(AT - timedelta(seconds=2))
        node.firer.look_ahead(clock.monotonic() + 60)
        measure = node.firer._herds._ahead[("big", AT)]
    finally:
        node.close()
    reads = [params for name, params in sent if name == "lookahead_schedule_keys"]
    assert [(p["after"], p["until"]) for p in reads] == [
        (AT - timedelta(seconds=3), AT + timedelta(seconds=2)),
        (AT + timedelta(seconds=2), AT + timedelta(seconds=3)),
    ]
    assert node.firer._lookahead.prepared == 50
    # The herds are measured over the same windows, only where a timer falls due.
    measured = [(p["after"], p["until"]) for name, p in sent if name == "lookahead_herds"]
    assert measured == [(AT - timedelta(seconds=3), AT + timedelta(seconds=2))]
    assert sum(measure.counts.values()) == 50
    assert sum(n for keys in measure.keys.values() for _, n in keys) == 50


# ------------------------------------------------------------- herds measured ahead

AHEAD = FiringLimits(herd_min_jobs=60, first_pass_herd_quota=20)
"""Herds of 60 timers and more (the big tenant's 100; the small tenant's 50 go per timer)."""


def measured_node(pg_dsn: str, limits: FiringLimits = AHEAD, **overrides) -> tuple[OneNode, ManualClock]:
    """A node whose look-ahead ran 3 s before :data:`AT` (the store clock then pinned
    1 s after it): every herd due at AT is measured."""
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    node = Node(pg_dsn, limits, clock=clock, **overrides)
    node.firer.tick()  # nothing due yet; learns the tenants
    node.firer.look_ahead(clock.monotonic() + 60)
    clock.pin_store(AT + timedelta(seconds=1))
    return node, clock


def count_reads(sent: list) -> list[list[int]]:
    """The partition lists of the herd_counts reads among ``sent``."""
    return [list(params["pids"]) for name, params in sent if name == "herd_counts"]


def test_a_herd_measured_ahead_is_fired_without_counting_it_at_its_instant(pg_dsn, conn, monkeypatch) -> None:
    """The wait before the instant measures the big tenant's herd (its timers and
    keys per partition); at the instant the tick takes its partitions and keys
    from that measure, reading neither herd_counts nor herd_schedule_keys, and
    fires exactly the same runs, each timer moved to its schedule's next slot."""
    from helpers import record_named_queries

    made = load_cron_herd(conn, "big", 2, AT)
    made.update(load_cron_herd(conn, "small", 1, AT))
    node, _ = measured_node(pg_dsn)
    try:
        sent = record_named_queries(monkeypatch)
        result = node.firer.tick()
    finally:
        node.close()

    names = [name for name, _ in sent]
    assert ("herd_counts" in names, "herd_schedule_keys" in names, "fire_group" in names) == (False, False, True)
    assert (result.fired, result.herd_fired) == (150, 100)
    fired = runs(conn)
    assert sorted(r["job_id"] for r in fired) == sorted(made)
    assert {(r["nominal_time"], r["fired_at"]) for r in fired} == {(AT, AT + timedelta(seconds=1))}
    for job_id, (expr, zone) in made.items():
        assert job(conn, job_id)["next_nominal_at"] == CronSchedule(expr, zone).next_after(AT)


def test_a_herd_measured_ahead_fires_over_several_ticks_whole_partitions_each_once(pg_dsn, conn, monkeypatch) -> None:
    """Budget 40 a tick, one tenant's 100 timers at AT, measured ahead: each tick
    fires the next partitions, whole, while they fit (the partitions fired by
    the ticks before count for nothing), in (partition, job id) order, every
    timer once; only a cursor's own partition is ever counted at the instant."""
    from helpers import record_named_queries

    herd = load_herd(conn, "big", 100, AT)
    node, _ = measured_node(pg_dsn, SMALL_HERDS, max_rate_per_s=40.0)
    sent = record_named_queries(monkeypatch)
    try:
        herd_ticks = fire_in_whole_partitions(node, conn, in_order(herd), 40)
    finally:
        node.close()
    assert herd_ticks >= 2
    assert all(len(pids) <= 1 for pids in count_reads(sent))


@pytest.mark.parametrize("why", ["epoch", "closed", "cut"])
def test_a_herd_measured_under_other_epochs_before_a_failure_or_cut_is_counted_at_the_instant(
    pg_dsn, conn, monkeypatch, why
) -> None:
    """A partition whose fencing epoch changed since the measure (lost and taken
    again: its timers may have moved meanwhile) makes the whole herd counted at
    the instant, as does a firer closed since (after a failed tick: which herd
    partitions fired is not known) and a measure cut at ``lookahead_herd_rows``
    (never kept: it would under-count); the runs are exactly the same."""
    from helpers import record_named_queries

    made = load_cron_herd(conn, "big", 2, AT)
    node, _ = measured_node(pg_dsn, dataclasses.replace(AHEAD, lookahead_herd_rows=10) if why == "cut" else AHEAD)
    try:
        if why == "cut":
            assert node.firer._herds._ahead == {}
        elif why == "epoch":
            measure = node.firer._herds._ahead[("big", AT)]
            pid = min(measure.counts)
            measure.epochs = {**measure.epochs, pid: measure.epochs[pid] + 1}
        else:
            assert node.firer._herds._ahead
            node.firer.close()
            assert node.firer._herds._ahead == {}
        sent = record_named_queries(monkeypatch)
        result = node.firer.tick()
    finally:
        node.close()
    assert (result.fired, result.herd_fired) == (100, 100)
    assert sorted(r["job_id"] for r in runs(conn)) == sorted(made)
    assert sorted(p for pids in count_reads(sent) for p in pids) == list(range(1024))
    assert [name for name, _ in sent].count("herd_schedule_keys") == 1


def test_only_tenants_with_a_herd_coming_are_measured(pg_dsn, conn, monkeypatch) -> None:
    """The look-ahead's read counts each tenant's timers per instant: the herds are
    measured for the big tenant alone (100 timers at AT, herds from 60), and not at
    all in a window holding no herd (a steady load pays nothing for the measure)."""
    from helpers import record_named_queries

    load_cron_herd(conn, "big", 2, AT)
    load_cron_herd(conn, "small", 1, AT)
    load_herd(conn, "small", 50, AT + timedelta(seconds=5))
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    node = Node(pg_dsn, AHEAD, clock=clock)
    try:
        node.firer.tick()
        sent = record_named_queries(monkeypatch)
        node.firer.look_ahead(clock.monotonic() + 60)  # (AT-3, AT+2]: big's herd and small's 50
        clock.advance(4.0)
        clock.pin_store(AT + timedelta(seconds=1))
        node.firer.look_ahead(clock.monotonic() + 60)  # (AT+2, AT+6]: small's 50 alone
    finally:
        node.close()
    reads = [p["after"] for name, p in sent if name == "lookahead_schedule_keys"]
    measured = [(p["after"], p["tenants"]) for name, p in sent if name == "lookahead_herds"]
    assert reads == [AT - timedelta(seconds=3), AT + timedelta(seconds=2)]
    assert measured == [(AT - timedelta(seconds=3), ["big"])]


def test_the_herds_kept_are_bounded_by_lookahead_herd_rows_oldest_instant_first(pg_dsn, conn) -> None:
    """Two herds of 10 partitions each, measured by two reads, with room for 15
    partitions in all: the herd of the older instant is forgotten (counted at
    its instant, if still due), the newer one kept."""
    for pid in range(10):
        load_herd(conn, "a", 3, AT, partitions={pid})
        load_herd(conn, "b", 3, AT + timedelta(seconds=4), partitions={10 + pid})
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    node = Node(pg_dsn, dataclasses.replace(SMALL_HERDS, lookahead_herd_rows=15), clock=clock)
    try:
        node.firer.tick()
        node.firer.look_ahead(clock.monotonic() + 60)  # reads (AT-3, AT+2]: a's herd
        first = sorted(node.firer._herds._ahead)
        clock.advance(2.0)
        clock.pin_store(AT - timedelta(seconds=1))
        node.firer.look_ahead(clock.monotonic() + 60)  # reads (AT+2, AT+4]: b's herd
        second = {key: len(herd.counts) for key, herd in node.firer._herds._ahead.items()}
    finally:
        node.close()
    assert first == [("a", AT)]
    assert second == {("b", AT + timedelta(seconds=4)): 10}


def canceling(calls: list, times: int):
    """A HerdFinder.read_ahead that records each call's window start in ``calls`` and
    is canceled (as past its wait) the first ``times`` calls."""
    real = HerdFinder.read_ahead

    def read_ahead(self, *args, **kwargs):
        calls.append(args[3])
        if len(calls) <= times:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return real(self, *args, **kwargs)

    return read_ahead


def test_a_herd_measure_canceled_past_its_wait_is_read_in_the_next_wait(pg_dsn, conn, monkeypatch) -> None:
    """The herds' read comes after the schedules' read has queued its pairs: canceled
    (the wait ran out), it takes nothing from them, and it is read first in the next
    wait while its instant is still ahead; the tick at the instant then counts nothing."""
    from helpers import record_named_queries

    load_cron_herd(conn, "big", 2, AT)
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    node = Node(pg_dsn, AHEAD, clock=clock)
    calls: list[datetime] = []
    try:
        node.firer.tick()
        monkeypatch.setattr(HerdFinder, "read_ahead", canceling(calls, 1))
        node.firer.look_ahead(clock.monotonic() + 60)
        prepared, kept = node.firer._lookahead.prepared, dict(node.firer._herds._ahead)
        clock.advance(1.0)
        clock.pin_store(AT - timedelta(seconds=2))
        node.firer.look_ahead(clock.monotonic() + 60)
        measured = sum(node.firer._herds._ahead[("big", AT)].counts.values())
        sent = record_named_queries(monkeypatch)
        clock.pin_store(AT + timedelta(seconds=1))
        result = node.firer.tick()
    finally:
        node.close()
    assert (prepared, kept, measured) == (50, {}, 100)
    assert calls == [AT - timedelta(seconds=3)] * 2
    assert "herd_counts" not in [name for name, _ in sent]
    assert (result.fired, result.herd_fired) == (100, 100)


def test_a_herd_measure_canceled_in_its_next_wait_too_is_dropped(pg_dsn, conn, monkeypatch) -> None:
    """A measure canceled again in the wait of its own it was given is dropped (no
    wait before the herd is spent on a read that does not fit); the herd is counted
    at its instant, the runs the same."""
    made = load_cron_herd(conn, "big", 2, AT)
    clock = ManualClock(store_at=AT - timedelta(seconds=3))
    node = Node(pg_dsn, AHEAD, clock=clock)
    calls: list[datetime] = []
    try:
        node.firer.tick()
        monkeypatch.setattr(HerdFinder, "read_ahead", canceling(calls, 99))
        node.firer.look_ahead(clock.monotonic() + 60)  # window (AT-3, AT+2]: canceled
        clock.advance(1.0)
        clock.pin_store(AT - timedelta(seconds=2))
        node.firer.look_ahead(clock.monotonic() + 60)  # canceled again, in a wait of its own: dropped
        clock.advance(1.0)
        node.firer.look_ahead(clock.monotonic() + 60)  # nothing owed, no herd ahead
        clock.pin_store(AT + timedelta(seconds=1))
        result = node.firer.tick()
    finally:
        node.close()
    assert calls == [AT - timedelta(seconds=3)] * 2
    assert (result.fired, result.herd_fired) == (100, 100)
    assert sorted(r["job_id"] for r in runs(conn)) == sorted(made)


def test_timers_added_edited_or_deleted_after_the_measure_fire_by_what_the_store_holds(pg_dsn, conn) -> None:
    """After the measure: 30 timers join the herd with a schedule it never saw,
    one timer is deleted and one moved to another instant. Every timer due at AT
    fires exactly once (the newcomers per timer or in a later herd), the deleted
    and the moved ones not at all."""
    herd = load_herd(conn, "big", 100, AT, intervals=(3600, 7200))
    node, _ = measured_node(pg_dsn, SMALL_HERDS)
    try:
        added = load_herd(conn, "big", 30, AT, intervals=(5400,))
        gone, moved = in_order(herd)[:2]
        jobs.delete_job(conn, gone)
        conn.execute("UPDATE jobs SET next_due_at = next_due_at + interval '1 hour' WHERE job_id = %s", (moved,))
        results = [node.firer.tick() for _ in range(3)]
    finally:
        node.close()
    assert sum(r.herd_fired for r in results) > 0
    fired = [r["job_id"] for r in runs(conn)]
    assert sorted(fired) == sorted((set(herd) | set(added)) - {gone, moved})
    assert sum(r.fired for r in results) == len(fired) == 128


def test_a_herd_holding_jobs_with_overlap_policies_fires_skips_and_replaces_them_in_the_same_tick(conn, node) -> None:
    """A 40-timer herd: 30 allow timers, and 10 that each have an unfinished run
    of the previous slot: 3 forbid (skipped), 3 buffer_one (a waiting run), 4
    replace (the old run canceled, the new one delivered). fire_group handles
    them (the same tick, the herd path), and verify accounts for every slot."""
    due = instant(conn)
    herd = load_herd(conn, "big", 40, due, intervals=(3600,))
    order = in_order(herd)
    policies = {**dict.fromkeys(order[:3], "forbid"), **dict.fromkeys(order[3:6], "buffer_one")}
    policies.update(dict.fromkeys(order[6:10], "replace"))
    for job_id, policy in policies.items():
        conn.execute("UPDATE jobs SET overlap = %s WHERE job_id = %s", (policy, job_id))
        conn.execute(
            "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,"
            " state, queue, origin, available_at, overlap, attempt, lease_token, leased_until)"
            " VALUES (%s, %s, %s, 'big', %s, %s, 'herd', 1, 'leased', 'default', 'schedule', %s, %s, 1,"
            " gen_random_uuid(), %s)",
            (partition_of(job_id), job_id, due - HOUR, due - HOUR, due - HOUR, due - HOUR, policy, due + HOUR),
        )

    result = node.firer.tick()

    assert (result.fired, result.herd_fired, result.skipped_ranges) == (37, 37, 3)
    got = {
        (r["job_id"], r["nominal_time"]): (r["state"], r["overlap"], r["available_at"] is None, r["last_error"])
        for r in runs(conn)
    }
    for job_id in order:
        policy = policies.get(job_id)
        now_run = got.get((job_id, due))
        old_run = got.get((job_id, due - HOUR))
        if policy is None:
            assert now_run == ("pending", None, False, None)
        elif policy == "forbid":
            assert now_run is None and old_run == ("leased", "forbid", False, None)
        elif policy == "buffer_one":
            assert now_run == ("pending", "buffer_one", True, None)  # waits: available_at NULL
            assert old_run == ("leased", "buffer_one", False, None)
        else:
            assert now_run == ("pending", "replace", False, None)
            assert old_run == ("canceled", "replace", False, f"replaced by run {job_id}.{int(due.timestamp())}000000")
        assert job(conn, job_id)["next_nominal_at"] == due + HOUR  # every timer advanced
    skipped = conn.execute("SELECT job_id, first_nominal, until_nominal, slots, reason FROM skips").fetchall()
    assert sorted((s["job_id"], s["first_nominal"], s["until_nominal"], s["slots"], s["reason"]) for s in skipped) == [
        (j, due, due + HOUR, 1, "overlap") for j in sorted(order[:3])
    ]
    report = verify(conn, since=due, until=due + timedelta(seconds=1))
    assert report.ok, report.findings
    assert (report.expected, report.runs, report.skipped, report.missing) == (40, 37, 3, 0)
