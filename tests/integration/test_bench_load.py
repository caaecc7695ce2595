"""The bench's bulk load (bench/load.py) writes jobs the engine reads as its own: every
COPYed row carries the schedule key registered for its spec, and a herd of many
distinct schedules (bench/pairs.py) loaded that way fires exactly once per timer."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import psycopg
import pytest
from helpers import OneNode

from bench import queries
from bench.load import (
    copy_jobs,
    cron_row,
    cron_spec,
    ensure_tenants,
    interval_spec,
    job_row,
    register_specs,
    reset_store,
)
from bench.pairs import herd_plan, popularity
from scheduler import tzreplan
from scheduler.audit import verify
from scheduler.firing import FiringLimits
from scheduler.firing.limits import DEFAULT_LIMITS
from scheduler.identity import identity_of

JOBS = 120
PAIRS = 30


def past_minute(conn: psycopg.Connection) -> datetime:
    """The minute boundary two to three minutes before the store's now."""
    return conn.execute("SELECT date_trunc('minute', now()) - interval '2 minutes' AS t").fetchone()["t"]


def load_herd(conn: psycopg.Connection, t: datetime, created: datetime) -> list[tuple[str, str]]:
    """JOBS timers of tenant ``big`` over PAIRS distinct pairs due at ``t``, as bench herd loads them."""
    pairs, pair_of = herd_plan(t, JOBS, PAIRS)
    values = register_specs(conn, [cron_spec(expr, zone) for expr, zone in pairs])
    ensure_tenants(conn, ["big"])
    assert copy_jobs(conn, (job_row("big", values[pair_of[i]], t, created) for i in range(JOBS))) == JOBS
    return pairs


@pytest.fixture
def bench_conn(pg_dsn: str):
    conn = reset_store(pg_dsn)
    yield conn
    conn.close()


def test_copied_rows_carry_the_keys_registered_for_their_specs(bench_conn) -> None:
    conn = bench_conn
    t = past_minute(conn)
    pairs = load_herd(conn, t, t - timedelta(hours=1))

    rows = conn.execute("SELECT * FROM jobs").fetchall()
    assert len(rows) == JOBS
    # The key of what the row holds (every column the key covers, as stored) is the key it carries.
    assert [r for r in rows if r["schedule_key"] != identity_of(r).key] == []
    expected = {identity_of(cron_spec(expr, zone)) for expr, zone in pairs}
    assert len(expected) == PAIRS
    stored = {(r["schedule_key"], r["canonical"]) for r in conn.execute("SELECT * FROM schedules").fetchall()}
    assert stored == {(i.key, i.canonical) for i in expected}
    per_key = Counter(r["schedule_key"] for r in rows)
    assert sorted(per_key.values(), reverse=True) == popularity(PAIRS, JOBS)


def test_interval_and_cron_rows_carry_their_keys(bench_conn) -> None:
    conn = bench_conn
    now = conn.execute("SELECT date_trunc('second', now()) AS t").fetchone()["t"]
    ensure_tenants(conn, ["steady"])
    specs = [interval_spec(10, now + timedelta(seconds=i)) for i in range(3)] + [
        cron_spec("* * * * * *", "UTC", "seconds")
    ]
    values = register_specs(conn, specs)
    assert len({s["schedule_key"] for s in specs}) == 4
    assert [v[-1] for v in values] == [s["schedule_key"] for s in specs]
    cron = cron_spec("0 0 1 1 *", "Europe/Berlin")
    register_specs(conn, [cron])
    rows = [job_row("steady", v, now + timedelta(seconds=30), now) for v in values]
    rows.append(cron_row("steady", "0 0 1 1 *", "Europe/Berlin", now, now, schedule_key=cron["schedule_key"]))
    copy_jobs(conn, rows)
    stored = conn.execute("SELECT * FROM jobs").fetchall()
    assert len(stored) == 5
    assert [r for r in stored if r["schedule_key"] is None or r["schedule_key"] != identity_of(r).key] == []


@pytest.mark.parametrize(
    "limits",
    [DEFAULT_LIMITS, FiringLimits(herd_min_jobs=20, first_pass_herd_quota=20)],
    ids=["default-limits", "herds-of-20"],
)
def test_a_loaded_herd_of_distinct_schedules_fires_each_timer_once(pg_dsn, bench_conn, limits) -> None:
    conn = bench_conn
    t = past_minute(conn)
    load_herd(conn, t, t - timedelta(hours=1))
    node = OneNode(pg_dsn, node_id="bench", limits=limits)
    try:
        fired = herd_fired = 0
        for _ in range(20):
            tick = node.firer.tick()
            if not tick.fired:
                break
            fired += tick.fired
            herd_fired += tick.herd_fired
    finally:
        node.close()
    assert fired == JOBS
    if limits is not DEFAULT_LIMITS:  # one tenant's 120 timers at one instant: a herd
        assert herd_fired > 0
    assert queries.execute(conn, "any_due_at", {"nominal": t})[0]["due"] is False
    runs = conn.execute("SELECT nominal_time, count(*) AS n FROM runs GROUP BY 1").fetchall()
    assert [(r["nominal_time"], r["n"]) for r in runs] == [(t, JOBS)]
    audit = verify(conn, t, t + timedelta(seconds=1))
    assert (audit.runs, audit.missing, audit.duplicates, audit.unexpected) == (JOBS, 0, 0, 0)


def test_delete_jobs_created_at_forgets_one_herd_only(bench_conn) -> None:
    conn = bench_conn
    t = past_minute(conn)
    first, second = t - timedelta(hours=2), t - timedelta(hours=1)
    load_herd(conn, t, first)
    load_herd(conn, t, second)
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == 2 * JOBS

    queries.execute(conn, "delete_jobs_created_at", {"created": first})

    left = conn.execute("SELECT created_at, count(*) AS n FROM jobs GROUP BY 1").fetchall()
    assert [(r["created_at"], r["n"]) for r in left] == [(second, JOBS)]


def test_a_reset_store_records_this_tzdata_release_so_a_node_start_walks_no_loaded_job(pg_dsn) -> None:
    # A node replans every cron slot at start unless the store's recorded tzdata
    # release is this one (scheduler/tzreplan.py). Bench computes the slots it
    # COPYs with this process's tzdata into an emptied store, so it records the
    # release: a node started on a fresh bench database must not walk millions
    # of loaded jobs during the measurement.
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute("DELETE FROM store_meta WHERE key = %s", (tzreplan.META_KEY,))
    conn.close()
    conn = reset_store(pg_dsn)
    try:
        assert tzreplan.recorded_version(conn) == tzreplan.tzdata_version()
        t = past_minute(conn)
        load_herd(conn, t, t - timedelta(hours=1))
        report = tzreplan.replan_store(conn)
        assert (report.checked, report.replanned, report.previous) == (0, 0, tzreplan.tzdata_version())
    finally:
        conn.close()
