"""One node, in process, firing against a real store (scheduler/firing/).

Each test registers jobs through the public API (``scheduler.jobs``), then
simulates an outage, so the exact nominal times that must fire are
computable here. Then it calls ``Firer.tick()`` directly (no loop, no sleep)
and asserts the exact rows of ``runs`` and ``skips``.

Cron slots are tied to the wall clock, so the cron and one-shot tests pin
the store's clock instead (``ManualClock(store_at=...)``, scheduler/clock.py,
"The pinned store clock"): the node comes back at an instant computed from
the job's first slot, and the slots due, each run's ``fired_at`` and its
lateness have one exact value. Interval tests move the job's next slot (and
its anchor and creation time) into the past relative to the STORE's clock,
every slot at least 10 s away from ``now`` and from every policy boundary
(window, grace, jitter), so they are exact whatever the tick's timing.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import psycopg
import pytest
from helpers import OneNode, store_now

from scheduler import jobs, store
from scheduler.clock import ManualClock
from scheduler.firing import batch
from scheduler.planner import scheduled_time
from scheduler.spec import JobSpec

S = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)


@pytest.fixture
def node(pg_dsn: str):
    n = OneNode(pg_dsn)
    yield n
    n.close()


@pytest.fixture
def pinned(pg_dsn: str):
    """``pinned(at)``: a node (``t1``, every lease) whose store clock is pinned at ``at``."""
    made: list[OneNode] = []

    def build(at: datetime) -> OneNode:
        made.append(OneNode(pg_dsn, clock=ManualClock(store_at=at)))
        return made[-1]

    yield build
    for n in made:
        n.close()


# ---------------------------------------------------------------- helpers


def whole_second(instant: datetime) -> datetime:
    return instant.replace(microsecond=0)


def add(conn: psycopg.Connection, **spec) -> uuid.UUID:
    spec.setdefault("tenant", "acme")
    result = jobs.add_job(conn, JobSpec.build(**spec))
    assert result.outcome == "created"
    return result.job_id


def job_row(conn: psycopg.Connection, job_id: uuid.UUID) -> dict:
    return jobs.get_job(conn, job_id)


def backdate(
    conn: psycopg.Connection, job_id: uuid.UUID, next_nominal: datetime, anchor: datetime | None = None
) -> None:
    """Move an interval job's next slot (and its anchor and creation) into the past."""
    row = job_row(conn, job_id)
    created = min(row["created_at"], next_nominal - S, anchor or next_nominal)
    count = conn.execute(
        """
        UPDATE jobs
        SET next_nominal_at = %(nominal)s, next_due_at = %(due)s,
            anchor_at = coalesce(%(anchor)s, anchor_at),
            created_at = %(created)s, changed_at = %(created)s
        WHERE job_id = %(job_id)s
        """,
        {
            "nominal": next_nominal,
            "due": scheduled_time(job_id, next_nominal, row["jitter_s"]),
            "anchor": anchor,
            "created": created,
            "job_id": job_id,
        },
    ).rowcount
    assert count == 1


def interval_job(
    conn: psycopg.Connection, interval_s: int, slots_before_now: int, margin_s: int = 30, **spec
) -> tuple[uuid.UUID, datetime]:
    """An interval job whose slots k = 1..slots_before_now are overdue, the last one
    ``margin_s`` before the store's now; returns ``(job_id, anchor)``."""
    job_id = add(conn, interval_s=interval_s, **spec)
    anchor = whole_second(store_now(conn)) - timedelta(seconds=slots_before_now * interval_s + margin_s)
    backdate(conn, job_id, anchor + timedelta(seconds=interval_s), anchor=anchor)
    return job_id, anchor


def runs_of(conn: psycopg.Connection, job_id: uuid.UUID) -> list[dict]:
    return conn.execute("SELECT * FROM runs WHERE job_id = %s ORDER BY nominal_time", (job_id,)).fetchall()


def nominals(conn: psycopg.Connection, job_id: uuid.UUID) -> list[datetime]:
    return [row["nominal_time"] for row in runs_of(conn, job_id)]


def skips_of(conn: psycopg.Connection, job_id: uuid.UUID) -> list[tuple]:
    return [
        (r["first_nominal"], r["until_nominal"], r["slots"], r["reason"])
        for r in conn.execute("SELECT * FROM skips WHERE job_id = %s ORDER BY first_nominal", (job_id,)).fetchall()
    ]


def count(conn: psycopg.Connection, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS c FROM {table}").fetchone()["c"]  # noqa: S608 (fixed names)


def lateness(now: datetime, slots: list[datetime]) -> list[float]:
    """Seconds from each slot to ``now``, ascending (TickResult.lags_s, sorted)."""
    return sorted((now - slot).total_seconds() for slot in slots)


# ---------------------------------------------------------------- schedule kinds


def test_cron_every_minute_fires_each_slot_of_a_five_minute_outage(conn, pinned) -> None:
    job_id = add(conn, cron="* * * * *")
    first = job_row(conn, job_id)["next_nominal_at"]
    now = first + 5 * MINUTE + 30 * S  # the store's clock when the node is back
    node = pinned(now)

    result = node.firer.tick()

    slots = [first + i * MINUTE for i in range(6)]  # 00..05 minutes after the first slot
    assert nominals(conn, job_id) == slots
    assert (result.fired, result.skipped_ranges) == (6, 0)
    assert sorted(result.lags_s) == lateness(now, slots)
    assert skips_of(conn, job_id) == []
    row = job_row(conn, job_id)
    assert row["next_nominal_at"] == row["next_due_at"] == first + 6 * MINUTE
    pid = row["partition_id"]
    for run in runs_of(conn, job_id):
        assert run["scheduled_at"] == run["nominal_time"]
        assert run["node_id"] == "t1"
        assert run["epoch"] == node.epoch(pid) == 1  # first claim of a fresh store
        assert run["tenant"] == "acme"
        assert run["partition_id"] == pid
        assert run["fired_at"] == now
    assert node.metrics.value("scheduler_firing_runs_fired_total") == 6


def test_a_cron_slot_is_due_at_its_instant_not_a_microsecond_before(conn, pinned) -> None:
    job_id = add(conn, cron="* * * * *")
    first = job_row(conn, job_id)["next_nominal_at"]
    node = pinned(first - timedelta(microseconds=1))

    before = node.firer.tick()
    node.clock.advance(1e-6)
    at = node.firer.tick()

    assert (before.fired, before.due_read) == (0, 0)
    assert (at.fired, at.lags_s) == (1, [0.0])
    assert [(r["nominal_time"], r["fired_at"]) for r in runs_of(conn, job_id)] == [(first, first)]
    assert job_row(conn, job_id)["next_nominal_at"] == first + MINUTE


def test_interval_job_fires_every_overdue_slot(conn, node) -> None:
    job_id, anchor = interval_job(conn, 60, slots_before_now=5)

    result = node.firer.tick()

    assert nominals(conn, job_id) == [anchor + timedelta(seconds=60 * k) for k in range(1, 6)]
    assert result.fired == 5
    assert skips_of(conn, job_id) == []
    row = job_row(conn, job_id)
    assert row["next_nominal_at"] == row["next_due_at"] == anchor + timedelta(seconds=360)


def test_one_shot_fires_once_then_never_again(conn, pinned) -> None:
    at = whole_second(store_now(conn)) + timedelta(hours=1)
    job_id = add(conn, at=at)
    assert job_row(conn, job_id)["next_nominal_at"] == at
    node = pinned(at + 20 * S)  # back 20 s after the instant

    first = node.firer.tick()
    node.clock.advance(5.0)  # within the leases' TTL: the second tick still scans
    second = node.firer.tick()

    assert nominals(conn, job_id) == [at]
    assert (first.fired, first.lags_s) == (1, [20.0])
    assert runs_of(conn, job_id)[0]["fired_at"] == at + 20 * S
    assert second.fired == 0 and second.due_read == 0
    row = job_row(conn, job_id)
    assert row["next_nominal_at"] is None and row["next_due_at"] is None
    assert count(conn, "runs") == 1


def test_seconds_dialect_job_fires_every_ten_seconds(conn, pinned) -> None:
    job_id = add(conn, cron="*/10 * * * * *", dialect="seconds")
    first = job_row(conn, job_id)["next_nominal_at"]
    now = first + 65 * S
    node = pinned(now)

    result = node.firer.tick()

    slots = [first + 10 * i * S for i in range(7)]
    assert nominals(conn, job_id) == slots
    assert (result.fired, sorted(result.lags_s)) == (7, lateness(now, slots))
    assert job_row(conn, job_id)["next_nominal_at"] == first + 70 * S


# ---------------------------------------------------------------- misfire policies


def test_misfire_all_fires_the_window_and_records_older_slots(conn, node) -> None:
    # Slots anchor+60 .. anchor+600 are overdue (the last one 30 s ago); the
    # window of 300 s starts at anchor+330: five slots before it are skipped.
    job_id, anchor = interval_job(conn, 60, slots_before_now=10, misfire="all", catchup_window_s=300)
    at = lambda k: anchor + timedelta(seconds=60 * k)  # noqa: E731

    result = node.firer.tick()

    assert nominals(conn, job_id) == [at(k) for k in range(6, 11)]
    assert skips_of(conn, job_id) == [(at(1), at(6), 5, "catchup_window")]
    assert (result.fired, result.skipped_ranges) == (5, 1)
    assert job_row(conn, job_id)["next_nominal_at"] == at(11)
    skip = conn.execute("SELECT node_id, epoch FROM skips WHERE job_id = %s", (job_id,)).fetchone()
    assert skip == {"node_id": "t1", "epoch": node.epoch(job_row(conn, job_id)["partition_id"])}
    assert node.metrics.value("scheduler_firing_slots_skipped_total") == 1


def test_misfire_once_collapses_the_missed_slots_into_the_latest(conn, node) -> None:
    # now = anchor+630, grace 60 s: slots 1-9 are missed (90 s late and more):
    # one run for slot 9, 1-8 skipped; slot 10 (30 s late) is within the grace.
    job_id, anchor = interval_job(conn, 60, slots_before_now=10, misfire="once")
    at = lambda k: anchor + timedelta(seconds=60 * k)  # noqa: E731

    result = node.firer.tick()

    assert nominals(conn, job_id) == [at(9), at(10)]
    assert skips_of(conn, job_id) == [(at(1), at(9), 8, "once")]
    assert (result.fired, result.skipped_ranges) == (2, 1)
    assert job_row(conn, job_id)["next_nominal_at"] == at(11)


def test_misfire_skip_drops_slots_past_the_grace(conn, node) -> None:
    # now = anchor+630; grace 100 s: slots before anchor+530 are skipped.
    job_id, anchor = interval_job(conn, 60, slots_before_now=10, misfire="skip", misfire_grace_s=100)
    at = lambda k: anchor + timedelta(seconds=60 * k)  # noqa: E731

    result = node.firer.tick()

    assert nominals(conn, job_id) == [at(9), at(10)]
    assert skips_of(conn, job_id) == [(at(1), at(9), 8, "grace")]
    assert (result.fired, result.skipped_ranges) == (2, 1)
    assert job_row(conn, job_id)["next_nominal_at"] == at(11)


def test_each_policy_in_one_tick(conn, node) -> None:
    """Three jobs, same outage, one tick: the policies do not leak into each other."""
    ids = {
        policy: interval_job(
            conn, 60, slots_before_now=4, misfire=policy, **({} if policy == "all" else {"misfire_grace_s": 100})
        )
        for policy in ("all", "once", "skip")
    }

    result = node.firer.tick()

    def at(policy: str, k: int) -> datetime:
        return ids[policy][1] + timedelta(seconds=60 * k)

    assert nominals(conn, ids["all"][0]) == [at("all", k) for k in range(1, 5)]
    assert nominals(conn, ids["once"][0]) == [at("once", k) for k in range(2, 5)]
    assert nominals(conn, ids["skip"][0]) == [at("skip", 3), at("skip", 4)]
    assert skips_of(conn, ids["all"][0]) == []
    assert skips_of(conn, ids["once"][0]) == [(at("once", 1), at("once", 2), 1, "once")]
    assert skips_of(conn, ids["skip"][0]) == [(at("skip", 1), at("skip", 3), 2, "grace")]
    assert (result.fired, result.skipped_ranges) == (9, 2)


# ---------------------------------------------------------------- jitter


def test_jitter_runs_keep_the_nominal_time_and_carry_the_offset(conn, node) -> None:
    # Jitter ≤ 20 s; the last overdue slot is 30 s old, the next one 30 s ahead.
    job_id, anchor = interval_job(conn, 60, slots_before_now=5, jitter_s=20)
    slots = [anchor + timedelta(seconds=60 * k) for k in range(1, 6)]

    node.firer.tick()

    runs = runs_of(conn, job_id)
    assert [r["nominal_time"] for r in runs] == slots
    assert [r["scheduled_at"] for r in runs] == [scheduled_time(job_id, s, 20) for s in slots]
    offsets = [(r["scheduled_at"] - r["nominal_time"]).total_seconds() for r in runs]
    assert all(0 <= o <= 20 for o in offsets)
    assert len(set(offsets)) > 1  # seeded per slot, not one offset per job
    row = job_row(conn, job_id)
    nxt = anchor + timedelta(seconds=360)
    assert row["next_nominal_at"] == nxt
    assert row["next_due_at"] == scheduled_time(job_id, nxt, 20)


# ---------------------------------------------------------------- pacing


def test_budget_fires_the_oldest_jobs_first_and_the_rest_next_tick(pg_dsn, conn) -> None:
    paced = OneNode(pg_dsn, max_rate_per_s=3.0)
    try:
        assert paced.settings.tick_budget == 3
        now = whole_second(store_now(conn))
        due = []  # job i has one overdue slot, 100 - 10 i seconds old
        for i in range(5):
            job_id = add(conn, interval_s=3600)
            slot = now - timedelta(seconds=100 - 10 * i)
            backdate(conn, job_id, slot, anchor=slot - timedelta(seconds=3600))
            due.append((job_id, slot))

        first = paced.firer.tick()
        fired_first = {r["job_id"]: r["nominal_time"] for r in conn.execute("SELECT * FROM runs").fetchall()}
        second = paced.firer.tick()
        fired_all = {r["job_id"]: r["nominal_time"] for r in conn.execute("SELECT * FROM runs").fetchall()}
        third = paced.firer.tick()
    finally:
        paced.close()

    assert fired_first == dict(due[:3])
    assert (first.fired, first.budget_exhausted) == (3, True)
    assert fired_all == dict(due)
    assert (second.fired, second.budget_exhausted) == (2, False)
    assert third.fired == 0 and third.due_read == 0
    assert count(conn, "runs") == 5


def test_budget_splits_one_jobs_backlog_across_ticks_oldest_first(pg_dsn, conn) -> None:
    paced = OneNode(pg_dsn, max_rate_per_s=3.0)
    try:
        job_id, anchor = interval_job(conn, 60, slots_before_now=5)
        at = lambda k: anchor + timedelta(seconds=60 * k)  # noqa: E731

        first = paced.firer.tick()
        after_first = nominals(conn, job_id)
        next_after_first = job_row(conn, job_id)["next_nominal_at"]
        second = paced.firer.tick()
    finally:
        paced.close()

    assert after_first == [at(1), at(2), at(3)]
    assert next_after_first == at(4)
    assert (first.fired, first.budget_exhausted) == (3, True)
    assert nominals(conn, job_id) == [at(k) for k in range(1, 6)]
    assert second.fired == 2
    assert job_row(conn, job_id)["next_nominal_at"] == at(6)


# ---------------------------------------------------------------- fence, edits, idempotency


def two_jobs_in_different_partitions(conn) -> tuple[tuple[uuid.UUID, datetime], tuple[uuid.UUID, datetime]]:
    a = interval_job(conn, 60, slots_before_now=2)
    while True:
        b = interval_job(conn, 60, slots_before_now=2)
        if job_row(conn, b[0])["partition_id"] != job_row(conn, a[0])["partition_id"]:
            return a, b
        jobs.delete_job(conn, b[0])  # same partition (1 in 1,024): out of the way


def test_fence_a_taken_over_partition_commits_nothing(conn, node) -> None:
    (victim, _), (other, other_anchor) = two_jobs_in_different_partitions(conn)
    pid = job_row(conn, victim)["partition_id"]
    before = job_row(conn, victim)
    # A takeover behind the firer's back: another node claims the partition, bumping the epoch.
    conn.execute(
        "UPDATE partitions SET owner_node = 'thief', owner_epoch = owner_epoch + 1 WHERE partition_id = %s", (pid,)
    )

    result = node.firer.tick()

    assert result.fence_rejected == [pid]
    assert runs_of(conn, victim) == []
    assert skips_of(conn, victim) == []
    after = job_row(conn, victim)
    assert (after["next_nominal_at"], after["revision"]) == (before["next_nominal_at"], before["revision"])
    assert node.metrics.value("scheduler_firing_fence_rejections_total") == 1
    assert pid not in node.table.held() and pid not in node.table.firable()
    assert len(node.table.held()) == 1023
    # The rest of the tick committed: the other partition's job fired both slots.
    assert nominals(conn, other) == [other_anchor + timedelta(seconds=60 * k) for k in (1, 2)]
    assert result.fired == 2
    # The partition is no longer fired from: the next tick does not touch it.
    again = node.firer.tick()
    assert (again.fired, again.fence_rejected, again.due_read) == (0, [], 0)
    assert runs_of(conn, victim) == []


def test_fence_refusing_the_lowest_partition_still_fires_every_other_one(conn, node) -> None:
    """The statement finds a job's partition at its position in the fenced list;
    a refused partition shifts every later position, so the exact test must
    take over for them (sql/queries.sql, fire_runs)."""
    made = {}
    while len(made) < 12:
        job_id, anchor = interval_job(conn, 60, slots_before_now=2)
        pid = job_row(conn, job_id)["partition_id"]
        if pid in made:
            jobs.delete_job(conn, job_id)
        else:
            made[pid] = (job_id, anchor)
    victim_pid = min(made)
    conn.execute(
        "UPDATE partitions SET owner_node = 'thief', owner_epoch = owner_epoch + 1 WHERE partition_id = %s",
        (victim_pid,),
    )

    result = node.firer.tick()

    assert result.fence_rejected == [victim_pid]
    assert runs_of(conn, made[victim_pid][0]) == []
    for pid, (job_id, anchor) in made.items():
        if pid != victim_pid:
            assert nominals(conn, job_id) == [anchor + timedelta(seconds=60 * k) for k in (1, 2)], pid
    assert (result.fired, result.stale_jobs) == (2 * 11, 0)


def test_fence_with_the_same_owner_but_an_older_epoch_commits_nothing(conn, node) -> None:
    """A restart under the same node id claims afresh: the old process's epoch is stale."""
    job_id, _ = interval_job(conn, 60, slots_before_now=3)
    pid = job_row(conn, job_id)["partition_id"]
    conn.execute("UPDATE partitions SET owner_epoch = owner_epoch + 1 WHERE partition_id = %s", (pid,))

    result = node.firer.tick()

    assert (result.fired, result.fence_rejected) == (0, [pid])
    assert runs_of(conn, job_id) == []
    assert node.metrics.value("scheduler_firing_fence_rejections_total") == 1


def test_fence_a_partition_row_naming_no_owner_commits_nothing(conn, node) -> None:
    """The fence checks the owner as well as the epoch: a partition row at our
    epoch that does not name us fences us out."""
    job_id, _ = interval_job(conn, 60, slots_before_now=3)
    pid = job_row(conn, job_id)["partition_id"]
    conn.execute("UPDATE partitions SET owner_node = NULL WHERE partition_id = %s", (pid,))

    result = node.firer.tick()

    assert (result.fired, result.fence_rejected) == (0, [pid])
    assert runs_of(conn, job_id) == []
    assert node.metrics.value("scheduler_firing_fence_rejections_total") == 1


def test_a_job_edited_between_read_and_fire_is_not_advanced(conn, node, pg_dsn, monkeypatch) -> None:
    job_id, anchor = interval_job(conn, 60, slots_before_now=3, name="edited")
    before = job_row(conn, job_id)
    real_plan_job = batch.plan_job
    edits = []

    def plan_job(*args, **kwargs):
        # The tick has read the job and is planning it; before its firing
        # statement runs, someone edits the job (jobs add --name edited --replace).
        if not edits:
            with store.connect(pg_dsn, application_name="editor") as other:
                edits.append(
                    jobs.add_job(other, JobSpec.build(tenant="acme", name="edited", interval_s=7200), replace=True)
                )
        return real_plan_job(*args, **kwargs)

    monkeypatch.setattr(batch, "plan_job", plan_job)  # the per-timer path's planner
    result = node.firer.tick()
    monkeypatch.undo()

    assert [e.outcome for e in edits] == ["replaced"]
    assert edits[0].job_id == job_id
    assert runs_of(conn, job_id) == []
    assert result.fired == 0
    assert result.stale_jobs == 1
    assert node.metrics.value("scheduler_firing_stale_jobs_total") == 1
    after = job_row(conn, job_id)
    assert after["revision"] == before["revision"] + 1
    assert after["interval_s"] == 7200
    # Its next slot is the one the edit computed (one interval after the edit), not the old spec's.
    assert after["next_nominal_at"] == after["anchor_at"] + timedelta(seconds=7200)
    assert after["next_nominal_at"] > store_now(conn)
    assert result.fence_rejected == []
    # The edit dropped the three overdue slots of the old spec: recorded, not lost.
    assert [(first, until, slots, reason) for first, until, slots, reason in skips_of(conn, job_id)] == [
        (anchor + timedelta(seconds=60), anchor + timedelta(seconds=240), 3, "edited")
    ]


def test_a_chunk_committing_late_never_moves_a_job_backwards(pg_dsn, conn, monkeypatch) -> None:
    """A chunk whose client gave up but which the store still commits later, under
    the same epoch, after the next tick has advanced the job: it must neither move
    the job's next slot back nor fire again a slot whose run retention pruned."""
    paced = OneNode(pg_dsn, max_rate_per_s=1.0)
    try:
        job_id, anchor = interval_job(conn, 60, slots_before_now=3)
        at = lambda k: anchor + timedelta(seconds=60 * k)  # noqa: E731
        chunks: list[tuple[str, dict]] = []
        real_send = store.Pipeline.send

        def send(self, query, params, partitions, batch=None):
            chunks.append((query, params))
            return real_send(self, query, params, partitions, batch)

        monkeypatch.setattr(store.Pipeline, "send", send)
        assert paced.firer.tick().fired == 1  # slot 1; next: slot 2
        monkeypatch.undo()
        assert paced.firer.tick().fired == 1  # slot 2; next: slot 3
    finally:
        paced.close()
    assert job_row(conn, job_id)["next_nominal_at"] == at(3)
    conn.execute("DELETE FROM runs WHERE job_id = %s AND nominal_time = %s", (job_id, at(1)))  # pruned

    [(query, params)] = chunks  # the first tick's chunk, delivered again (the late commit)
    [row] = store.execute(conn, query, params)

    assert (row["advanced"], row["inserted"]) == (0, 0)
    assert job_row(conn, job_id)["next_nominal_at"] == at(3)
    assert nominals(conn, job_id) == [at(2)]


def test_a_second_tick_with_nothing_due_writes_nothing(conn, node) -> None:
    job_id, anchor = interval_job(conn, 60, slots_before_now=2)
    add(conn, cron="0 0 1 1 *")  # not due for months
    first = node.firer.tick()
    snapshot = lambda: (  # noqa: E731
        conn.execute("SELECT * FROM runs ORDER BY job_id, nominal_time").fetchall(),
        conn.execute("SELECT * FROM skips ORDER BY job_id").fetchall(),
        conn.execute("SELECT * FROM jobs ORDER BY job_id").fetchall(),
    )
    state = snapshot()

    second = node.firer.tick()

    assert first.fired == 2
    assert (second.fired, second.due_read, second.skipped_ranges, second.stale_jobs) == (0, 0, 0, 0)
    assert snapshot() == state
    assert nominals(conn, job_id) == [anchor + timedelta(seconds=60), anchor + timedelta(seconds=120)]


def test_paused_and_deleted_jobs_do_not_fire(conn, node) -> None:
    paused, _ = interval_job(conn, 60, slots_before_now=2)
    deleted, _ = interval_job(conn, 60, slots_before_now=2)
    live, anchor = interval_job(conn, 60, slots_before_now=2)
    jobs.set_paused(conn, paused, True)
    jobs.delete_job(conn, deleted)

    result = node.firer.tick()

    assert runs_of(conn, paused) == [] and runs_of(conn, deleted) == []
    assert nominals(conn, live) == [anchor + timedelta(seconds=60), anchor + timedelta(seconds=120)]
    assert result.fired == 2


def test_write_lanes_follow_the_share_of_partitions_held(conn, node) -> None:
    """Two firing connections while holding more than half of the partitions, one otherwise
    (FiringLimits.write_lanes), and the work is the same either way."""

    def lanes() -> list[str]:
        return sorted(role for role, c in node.firer._sessions.items() if role.startswith("write") and c.open)

    job_id, anchor = interval_job(conn, 60, slots_before_now=1)
    pid = job_row(conn, job_id)["partition_id"]
    assert node.firer.tick().fired == 1
    assert lanes() == ["write0", "write1"]

    node.table.drop([p for p in range(1024) if p != pid][:600])  # 424 held, the job's among them
    later, _ = interval_job(conn, 60, slots_before_now=1)
    while job_row(conn, later)["partition_id"] not in node.table.held():
        jobs.delete_job(conn, later)
        later, _ = interval_job(conn, 60, slots_before_now=1)
    result = node.firer.tick()
    assert lanes() == ["write0"]
    assert result.fired == 1
    assert nominals(conn, later) == [job_row(conn, later)["anchor_at"] + timedelta(seconds=60)]
