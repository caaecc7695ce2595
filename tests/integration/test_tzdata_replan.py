"""Stored slots computed under other tzdata rules (scheduler/tzreplan.py).

A tzdata update is simulated by writing a job's stored slot as another
release would have computed it: the true slot (under the bundled rules)
moved by one hour, the size of America/Havana's change between releases.
The node must never fire the stored instant (an early run, then a second
one for the same local time): it replans the job to its true slot, and a
run carries that slot as its nominal time.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

import psycopg
from helpers import OneNode, json_log_records, store_now

from scheduler import jobs, store, tzreplan
from scheduler.schedule import CronSchedule
from scheduler.spec import JobSpec

ZONE = "America/Havana"
HOUR = timedelta(hours=1)
HAVANA = CronSchedule("* * * * *", ZONE).zone


def daily_job_at(conn: psycopg.Connection, local: datetime) -> tuple[uuid.UUID, CronSchedule]:
    """A job firing every day at ``local``'s wall-clock hour and minute in ZONE."""
    expr = f"{local.minute} {local.hour} * * *"
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", cron=expr, tz=ZONE)).job_id
    return job_id, CronSchedule(expr, ZONE)


def store_slot(conn: psycopg.Connection, job_id: uuid.UUID, stored: datetime, created: datetime) -> None:
    """Write ``stored`` as the job's next slot, as a node with other rules would have."""
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(s)s, next_due_at = %(s)s, created_at = %(c)s, "
        "changed_at = %(c)s WHERE job_id = %(j)s",
        {"s": stored, "c": created, "j": job_id},
    )


def future_job_stored_late(conn: psycopg.Connection) -> tuple[uuid.UUID, datetime]:
    """A job whose true slot is ~5 h ahead, created an hour ago, stored an hour
    late (as older rules computed it); returns its id and true slot."""
    now = store_now(conn)
    job_id, schedule = daily_job_at(conn, (now + timedelta(hours=5)).astimezone(HAVANA))
    true = schedule.next_after(now)
    store_slot(conn, job_id, true + HOUR, now - HOUR)
    return job_id, true


def runs_of(conn: psycopg.Connection, job_id: uuid.UUID) -> list[datetime]:
    return [
        r["nominal_time"]
        for r in conn.execute(
            "SELECT nominal_time FROM runs WHERE job_id = %s ORDER BY nominal_time", (job_id,)
        ).fetchall()
    ]


def test_a_slot_stored_an_hour_early_is_replanned_not_fired(pg_dsn, conn) -> None:
    """Old rules put 09:00 local an hour earlier in UTC: the stored instant is
    due now, but the true slot is still ahead. Nothing fires; the job waits
    for its true slot."""
    now = store_now(conn)
    job_id, schedule = daily_job_at(conn, (now + timedelta(minutes=20)).astimezone(HAVANA))
    true = schedule.next_after(now)
    assert now < true <= now + timedelta(minutes=21)
    stored = true - HOUR
    store_slot(conn, job_id, stored, stored - timedelta(minutes=1))
    node = OneNode(pg_dsn)
    try:
        result = node.firer.tick()
        again = node.firer.tick()
    finally:
        node.close()
    assert (result.fired, result.replanned) == (0, 1)
    assert (again.fired, again.replanned) == (0, 0)
    assert runs_of(conn, job_id) == []
    row = jobs.get_job(conn, job_id)
    assert (row["next_nominal_at"], row["next_due_at"]) == (true, true)
    assert node.metrics.value("scheduler_firing_slots_replanned_total") == 1


def test_a_slot_stored_an_hour_late_fires_at_its_true_nominal_time(pg_dsn, conn) -> None:
    """Old rules put the local time an hour later in UTC: the true slot has
    passed. The run carries the true slot, fired once; the next slot is the
    schedule's next under the current rules."""
    now = store_now(conn)
    job_id, schedule = daily_job_at(conn, (now - timedelta(minutes=80)).astimezone(HAVANA))
    true = schedule.next_after(now - timedelta(minutes=81))
    assert now - timedelta(minutes=81) < true <= now - timedelta(minutes=79)
    store_slot(conn, job_id, true + HOUR, true - timedelta(minutes=1))
    node = OneNode(pg_dsn)
    try:
        first = node.firer.tick()
        second = node.firer.tick()
    finally:
        node.close()
    assert (first.fired, first.replanned) == (0, 1)
    assert (second.fired, second.replanned) == (1, 0)
    assert runs_of(conn, job_id) == [true]
    assert jobs.get_job(conn, job_id)["next_nominal_at"] == schedule.next_after(true)


def test_the_true_slot_follows_the_last_run_not_the_creation(pg_dsn, conn) -> None:
    now = store_now(conn)
    job_id, schedule = daily_job_at(conn, (now - timedelta(minutes=80)).astimezone(HAVANA))
    true = schedule.next_after(now - timedelta(minutes=81))
    yesterday = true - timedelta(days=1)
    # Created a week ago; yesterday's slot ran; today's was stored an hour late.
    store_slot(conn, job_id, true + HOUR, true - timedelta(days=7))
    row = jobs.get_job(conn, job_id)
    conn.execute(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, "
        "node_id, epoch) VALUES (%s, %s, %s, 'acme', %s, %s, 'old', 1)",
        (row["partition_id"], job_id, yesterday, yesterday, yesterday),
    )
    node = OneNode(pg_dsn)
    try:
        node.firer.tick()
        node.firer.tick()
    finally:
        node.close()
    assert runs_of(conn, job_id) == [yesterday, true]


def test_replan_store_moves_future_slots_once_per_release(conn) -> None:
    """A store whose slots were computed by another release: the pass replans
    the future slots that are no slots under the bundled rules, leaves the
    others, and records the release so the next pass reads nothing."""
    wrong_id, true = future_job_stored_late(conn)
    right_id = jobs.add_job(conn, JobSpec.build(tenant="acme", cron="0 9 * * *", tz=ZONE)).job_id
    right = jobs.get_job(conn, right_id)
    store.execute(conn, "set_store_meta", {"key": "tzdata_version", "value": "2000a"})

    report = tzreplan.replan_store(conn, batch_size=1)

    assert (report.checked, report.replanned, report.previous, report.current) == (
        2,
        1,
        "2000a",
        tzreplan.tzdata_version(),
    )
    assert jobs.get_job(conn, wrong_id)["next_nominal_at"] == true
    assert jobs.get_job(conn, right_id) == right
    assert tzreplan.recorded_version(conn) == tzreplan.tzdata_version()
    assert tzreplan.replan_store(conn).checked == 0


def test_a_large_replan_logs_a_few_jobs_and_counts_the_rest(conn) -> None:
    """Every replanned job was one WARNING line: a trial's 35,000 off-slot timers wrote
    35,000 lines in 25 s, as a tzdata release moving a zone with many jobs would. Each batch
    now names its first SLOTS_REPLANNED_LOGGED jobs (job, stored and true slot) and counts
    the rest in one ``slot_replanned_more`` line; every job is still moved."""
    moved = [future_job_stored_late(conn) for _ in range(tzreplan.SLOTS_REPLANNED_LOGGED + 3)]
    items = [tzreplan.replan_item(jobs.get_job(conn, job_id)) for job_id, _ in moved]
    with json_log_records() as records:
        assert tzreplan.replan_jobs(conn, items) == len(moved)
    named = [r for r in records if r["event"] == "slot_replanned"]
    more = [r for r in records if r["event"] == "slot_replanned_more"]
    assert len(named) == tzreplan.SLOTS_REPLANNED_LOGGED
    assert all(r["level"] == "warning" and r["true_slot"] for r in named)
    assert [(r["level"], r["jobs"]) for r in more] == [("warning", 3)]
    assert all(jobs.get_job(conn, job_id)["next_nominal_at"] == true for job_id, true in moved)


def test_replan_never_overwrites_a_concurrent_edit(conn) -> None:
    job_id, true = future_job_stored_late(conn)
    item = tzreplan.replan_item(jobs.get_job(conn, job_id))
    jobs.set_paused(conn, job_id, True)  # an edit between the read and the replan
    assert tzreplan.replan_jobs(conn, [item]) == 0
    assert jobs.get_job(conn, job_id)["next_nominal_at"] is None


def test_a_node_started_with_another_release_replans_the_store(pg_dsn, conn) -> None:
    from scheduler.node import Node
    from scheduler.settings import Settings

    job_id, true = future_job_stored_late(conn)
    store.execute(conn, "set_store_meta", {"key": "tzdata_version", "value": "2000a"})
    node = Node(Settings(dsn=pg_dsn, node_id="replanner"))
    node.start()
    try:
        deadline = time.monotonic() + 30
        while tzreplan.recorded_version(conn) != tzreplan.tzdata_version() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        node.stop()
        node.join(30)
    assert tzreplan.recorded_version(conn) == tzreplan.tzdata_version()
    assert jobs.get_job(conn, job_id)["next_nominal_at"] == true


def test_cli_replan_slots_reports_and_dry_runs(pg_dsn, conn) -> None:
    from click.testing import CliRunner

    from scheduler.cli import cli

    job_id, true = future_job_stored_late(conn)
    runner = CliRunner()
    dry = runner.invoke(cli, ["jobs", "replan-slots", "--dsn", pg_dsn, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert (
        f"checked 1 cron jobs; would move 1 to their true slot (tzdata unrecorded -> {tzreplan.tzdata_version()})"
        in dry.output
    )
    assert jobs.get_job(conn, job_id)["next_nominal_at"] == true + HOUR
    done = runner.invoke(cli, ["jobs", "replan-slots", "--dsn", pg_dsn])
    assert done.exit_code == 0, done.output
    assert "moved 1" in done.output
    assert jobs.get_job(conn, job_id)["next_nominal_at"] == true
    again = runner.invoke(cli, ["jobs", "replan-slots", "--dsn", pg_dsn])
    assert "nothing to do" in again.output


def test_a_started_node_warms_the_zones_of_the_stored_schedules_and_of_new_ones(
    pg_dsn, conn, caplog, monkeypatch
) -> None:
    """After the replan pass, the node computes the transition tables of every
    zone a registered schedule uses (two here), off the firing thread; a zone
    registered later is warmed at the next look (the interval scaled down)."""
    import logging

    from scheduler import node as node_module
    from scheduler import zones
    from scheduler.node import Node
    from scheduler.settings import Settings

    monkeypatch.setattr(node_module, "ZONE_WARM_INTERVAL_S", 0.2)
    jobs.add_jobs(
        conn,
        [
            JobSpec.build(tenant="acme", cron="0 9 * * *", tz="America/Havana"),
            JobSpec.build(tenant="acme", cron="0 9 * * *", tz="Asia/Kathmandu"),
            JobSpec.build(tenant="acme", cron="0 10 * * *", tz="Asia/Kathmandu"),
            JobSpec.build(tenant="acme", interval_s=60),
        ],
    )
    zones._year.cache_clear()
    caplog.set_level(logging.INFO, logger="scheduler")

    def warm_events() -> list:
        return [r.fields for r in caplog.records if getattr(r, "event", None) == "zones_warmed"]

    def wait_for_events(count: int) -> None:
        deadline = time.monotonic() + 30
        while len(warm_events()) < count:
            assert time.monotonic() < deadline, warm_events()
            time.sleep(0.05)

    node = Node(Settings(dsn=pg_dsn, node_id="warmer"))
    node.start()
    try:
        wait_for_events(1)
        jobs.add_job(conn, JobSpec.build(tenant="acme", cron="0 9 * * *", tz="Pacific/Chatham"))
        wait_for_events(2)
        time.sleep(0.5)  # later looks find nothing new: no more events
    finally:
        node.stop()
        node.join(30)
    assert warm_events() == [{"node": "warmer", "zones": 2}, {"node": "warmer", "zones": 1}]
    year = store_now(conn).year
    for name in ("America/Havana", "Asia/Kathmandu", "Pacific/Chatham"):
        zone = zones.load_zone(name)
        for y in (year, year + 1):
            misses = zones._year.cache_info().misses
            zones._year(zone, y)
            assert zones._year.cache_info().misses == misses, (name, y)
