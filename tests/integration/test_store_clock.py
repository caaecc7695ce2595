"""The store clock a node's queries run on (scheduler/clock.py, "The pinned store clock").

Production never pins it: a node built from default settings (and its
system clock) sends NULL as the ``now`` of every time-dependent query, so
the store's own ``now()`` judges, as the CLI does. A test pins it with
``ManualClock(store_at=...)`` and every store time those queries compare
or write is exactly the pinned instant (an instant years from the real
clock here, to show that nothing else leaks in): heartbeats, lease expiries
and takeovers to the microsecond, status ages, retention's cutoff.
Firing under a pinned clock: tests/integration/test_firing.py.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import psycopg
from click.testing import CliRunner
from helpers import PINNABLE_QUERIES, closed_port, record_named_queries, stamp_schedule_keys

from scheduler import jobs
from scheduler.cli import cli
from scheduler.clock import ManualClock
from scheduler.coordination import Lease, SqlCoordinator
from scheduler.firing import DEFAULT_LIMITS
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.partition import partition_of
from scheduler.retention import RetentionLoop
from scheduler.settings import Settings
from scheduler.spec import JobSpec
from scheduler.status import cluster_status

AT = datetime(2031, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
"""The pinned instant: years away from the real clock."""
MICROSECOND = timedelta(microseconds=1)
WEEK = timedelta(days=7)

ETCD_ONLY = {"claim_partitions_at_epoch"}
"""Pinnable queries a SQL-coordinated node never sends (the etcd coordinator's,
checked in tests/cluster/test_etcd_coordinator.py)."""

WORKER_ONLY = {"claim_runs", "tenants_with_pending_runs", "tenants_next_due"}
"""Pinnable queries of the workers' side of delivery (scheduler/delivery/lifecycle.py),
which a node never sends; the pin is theirs to pass (tests/integration/test_delivery_lifecycle.py)."""

UNSENT_HERE = {"heartbeat_runs", "ack_runs"}
"""Sent by workers, and by a node's push loop when an attempt succeeds or waits
for its host's turn; this test's one push fails at once (its nack is sent)."""

API_KEYS_ONLY = {"insert_api_key", "revoke_api_key", "touch_api_key"}
"""Pinnable queries of the tenant API's keys (scheduler/api/keys.py): a node started
without ``--api-port`` (this test's) serves no API and never sends them."""

CLI_ONLY = {"insert_run_request", "insert_backfill_runs", "cancel_run"}
"""Pinnable queries of `jobs trigger`, `jobs backfill` (scheduler/delivery/manual.py,
tests/integration/test_overlap.py pins them) and `runs cancel` (scheduler/delivery/views.py),
which a node never sends."""


def test_a_node_built_from_default_settings_sends_null_as_now_in_every_time_dependent_query(
    pg_dsn: str, conn: psycopg.Connection, monkeypatch
) -> None:
    sent = record_named_queries(monkeypatch)
    # A herd (one tenant's timers at one instant: fire_group) and a lone timer
    # (the per-timer path: fire_runs), both due 10 s ago by the store's clock.
    jobs.add_jobs(conn, [JobSpec.build(tenant="big", interval_s=86_400) for _ in range(DEFAULT_LIMITS.herd_min_jobs)])
    small = jobs.add_job(conn, JobSpec.build(tenant="small", interval_s=86_400)).job_id
    # ... pushed to an HTTP target (nothing listens: the attempt fails and is nacked).
    conn.execute("UPDATE jobs SET queue = NULL WHERE job_id = %s", (small,))
    conn.execute(
        "INSERT INTO job_delivery (partition_id, job_id, url, max_attempts, backoff_base_s, backoff_cap_s)"
        " VALUES (%s, %s, %s, 5, 1, 300)",
        (partition_of(small), small, f"http://127.0.0.1:{closed_port()}/"),
    )
    conn.execute(
        "UPDATE jobs SET anchor_at = x.t - interval '1 day', next_nominal_at = x.t, next_due_at = x.t,"
        " created_at = x.t - interval '2 days', changed_at = x.t - interval '2 days'"
        " FROM (SELECT date_trunc('second', now()) - interval '10 seconds' AS t) AS x"
    )
    stamp_schedule_keys(conn)  # the anchor moved: the keys follow it
    node = Node(Settings(dsn=pg_dsn, node_id="n1", retention_s=WEEK.total_seconds(), push_allow="127.0.0.1/32"))
    try:
        node.lease_loop.run_once()  # join, heartbeat, live nodes, claim, prune
        assert len(node.table.held()) == 1024
        assert len(node.coordinator.renew(list(node.table.held().values()))) == 1024
        result = node.firer.tick()
        assert node.retention.run_once() == 0  # the cutoff, then a batch with nothing that old
        assert node.delivery.run_once() == 0  # the settle step: nothing leased or failed
        assert [o.outcome for o in node.push.run_once()] == ["retry"]  # claim, signing secrets, nack
    finally:
        node.delivery.close()
        node.push.close()
        node.firer.close()
        node.coordinator.close()
        node.retention.close()
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    status = CliRunner().invoke(cli, ["status", "--json"], env={**env, "SCHEDULER_DSN": pg_dsn}, catch_exceptions=False)
    for args in (["tenants", "secret", "rotate", "small"], ["tenants", "secret", "list", "small"]):
        secret = CliRunner().invoke(cli, args, env={**env, "SCHEDULER_DSN": pg_dsn}, catch_exceptions=False)
        assert secret.exit_code == 0, secret.stderr

    assert (result.fired, result.herd_fired) == (DEFAULT_LIMITS.herd_min_jobs + 1, DEFAULT_LIMITS.herd_min_jobs)
    assert status.exit_code == 0, status.stderr
    pinnable = [(name, params) for name, params in sent if name in PINNABLE_QUERIES]
    assert {
        name for name, _ in pinnable
    } == PINNABLE_QUERIES - ETCD_ONLY - WORKER_ONLY - UNSENT_HERE - CLI_ONLY - API_KEYS_ONLY
    assert [(name, params["now"]) for name, params in pinnable if params["now"] is not None] == []


def lease_rows(conn: psycopg.Connection, pids: list[int]) -> dict[int, tuple]:
    rows = conn.execute(
        "SELECT partition_id, owner_node, owner_epoch, acquired_at, renewed_at, lease_expires_at"
        " FROM leases WHERE partition_id = ANY(%s)",
        (pids,),
    ).fetchall()
    return {
        row["partition_id"]: (
            row["owner_node"],
            row["owner_epoch"],
            row["acquired_at"],
            row["renewed_at"],
            row["lease_expires_at"],
        )
        for row in rows
    }


def test_lease_times_shares_and_takeovers_follow_a_pinned_store_clock_exactly(
    pg_dsn: str, conn: psycopg.Connection
) -> None:
    settings = Settings(dsn=pg_dsn, node_id="n1").validated()
    ttl = timedelta(seconds=settings.lease_ttl_s)
    responsive = timedelta(seconds=settings.responsive_s)
    clock = ManualClock(store_at=AT)
    a = SqlCoordinator(settings, Metrics(), clock)
    b_clock = ManualClock(store_at=AT)
    b = SqlCoordinator(Settings(dsn=pg_dsn, node_id="n2").validated(), Metrics(), b_clock)
    try:
        a.join()
        held = a.claim(4)
        pids = sorted(pid for pid, _ in held)
        assert lease_rows(conn, pids) == {pid: ("n1", epoch, AT, AT, AT + ttl) for pid, epoch in held}
        assert conn.execute("SELECT started_at, heartbeat_at FROM nodes").fetchall() == [
            {"started_at": AT, "heartbeat_at": AT}
        ]
        assert a.live_nodes() == ["n1"]

        clock.advance(settings.responsive_s - 1e-6)  # a heartbeat a microsecond younger than the bound counts
        assert a.live_nodes() == ["n1"]
        clock.advance(1e-6)  # exactly as old as the bound: it no longer does
        assert a.live_nodes() == []
        renewed = a.renew([Lease(pid, epoch, 0.0) for pid, epoch in held])
        assert sorted(renewed) == sorted(held)
        assert lease_rows(conn, pids) == {
            pid: ("n1", epoch, AT, AT + responsive, AT + responsive + ttl) for pid, epoch in held
        }
        status = cluster_status(conn, settings.lease_ttl_s, settings.responsive_s, now=clock.store_now_or_none())
        assert [(n["node_id"], n["state"], n["heartbeat_age_s"], n["lease_left_s"]) for n in status["nodes"]] == [
            ("n1", "suspect", settings.responsive_s, settings.lease_ttl_s)
        ]

        # Another node, its store clock a microsecond before the renewed leases
        # expire, claims every other partition but none of them...
        b_clock.pin_store(AT + responsive + ttl - MICROSECOND)
        b.join()
        others = b.claim(1024)
        assert len(others) == 1020 and not {pid for pid, _ in others} & set(pids)
        # ... and at the expiry itself takes them all over, one epoch later.
        b_clock.advance(1e-6)
        taken = b.claim(4)
        assert sorted(taken) == sorted((pid, epoch + 1) for pid, epoch in held)
        expiry = AT + responsive + ttl
        assert lease_rows(conn, pids) == {pid: ("n2", epoch + 1, expiry, expiry, expiry + ttl) for pid, epoch in held}
        # The old holder's renewal is keyed on its epochs: it renews nothing.
        assert a.renew([Lease(pid, epoch, 0.0) for pid, epoch in held]) == []
    finally:
        a.close()
        b.close()


def test_a_nodes_retention_cutoff_is_its_pinned_store_clock_minus_the_retention(
    pg_dsn: str, conn: psycopg.Connection
) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
    pid = partition_of(job_id)
    cutoff = AT - WEEK
    nominals = [cutoff - timedelta(days=1), cutoff - MICROSECOND, cutoff, cutoff + MICROSECOND]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at,"
            " node_id, epoch) VALUES (%s, %s, %s, 'acme', %s, %s, 'n', 1)",
            [(pid, job_id, t, t, t) for t in nominals],
        )
    settings = Settings(dsn=pg_dsn, node_id="n1", retention_s=WEEK.total_seconds()).validated()
    loop = RetentionLoop(settings, lambda: [pid], ManualClock(store_at=AT), Metrics())
    try:
        deleted = 0
        for _ in range(10):  # one pass over one partition: a batch per table
            deleted += loop.run_once()
            if loop.passes:
                break
    finally:
        loop.close()

    assert (loop.passes, deleted) == (1, 2)
    left = conn.execute("SELECT nominal_time FROM runs WHERE job_id = %s ORDER BY nominal_time", (job_id,)).fetchall()
    assert [row["nominal_time"] for row in left] == [cutoff, cutoff + MICROSECOND]
