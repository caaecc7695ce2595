"""A COMMIT waiting on synchronous replication for a standby that never answers.

With ``synchronous_commit = on`` and ``synchronous_standby_names`` naming a
standby that is not there, every COMMIT that wrote something writes its WAL
locally, then waits for the standby's acknowledgement; PostgreSQL disarms
``statement_timeout`` before that wait, so only a cancel request ends it, with
a WARNING ("canceling wait for synchronous replication ...") and the
transaction committed locally. The node's watchdog (scheduler/watchdog.py)
bounds every store call at ``statement_timeout_s`` + ``store_call_margin_s``,
which covers the commit wait; the node must say why its commits took that
long (``store_commit_wait_cancelled``, naming the bound) and carry on: a tick
whose commit wait was cancelled is committed, so no slot fires twice and
none is missed.

The stall is a sighup setting (``ALTER DATABASE`` cannot set it), so the test
runs on a private PostgreSQL server of its own
(:func:`scheduler.devtools.embedded.start_private_postgres`): nothing leaks
into the shared test cluster. Every COMMIT takes the whole bound while the
stall lasts, and a lease cycle commits twice (heartbeat, then renewal, whose
lease counts from its start): the bound is a quarter of the TTL here (TTL
4 s; statement timeout 0.5 s + margin 0.5 s = 1 s), so the leases stay
firable through the stall and the node keeps firing, one slow tick after
another.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import psycopg.sql
import pytest
from harness import MARGIN_S, Cluster, Timings, add_interval_jobs

from scheduler import migrate, store
from scheduler.devtools.embedded import PrivatePostgres, start_private_postgres

pytestmark = pytest.mark.cluster

JOBS = 20
"""Interval jobs firing every second."""

TIMINGS = Timings(lease_ttl_s=4.0, renew_interval_s=1.0, poll_interval_s=0.5, tick_interval_s=0.5)
"""The node's lease timings."""

CALL_MARGIN_S = 0.5
"""``--store-call-margin-s`` of the node."""

STATEMENT_TIMEOUT_S = 0.5
"""``--statement-timeout-s`` of the node."""

BOUND_S = STATEMENT_TIMEOUT_S + CALL_MARGIN_S
"""The watchdog cancels a store call running this long (below the TTL)."""

STALLED_COMMITS = 3
"""Firing commits whose wait the watchdog must have cancelled before the stall ends."""


@pytest.fixture
def private_store() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL server (a database ``scheduler`` at the schema's head, with the
    suite's ``SCHEDULER_TEST_ISOLATION`` as its default isolation), stopped after the test."""
    with start_private_postgres(handle_sigterm=False) as pg:
        migrate.upgrade(pg.dsn)
        isolation = os.environ.get("SCHEDULER_TEST_ISOLATION")
        if isolation:
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                conn.execute(
                    psycopg.sql.SQL("ALTER DATABASE scheduler SET default_transaction_isolation = {}").format(
                        psycopg.sql.Literal(isolation)
                    )
                )
        yield pg


def stall_commits(conn: psycopg.Connection, on: bool) -> None:
    """Make every COMMIT that wrote something wait for a standby that does not exist (or stop doing so)."""
    if on:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nosuchstandby'")
        conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
    else:
        conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("ALTER SYSTEM RESET synchronous_commit")
    conn.execute("SELECT pg_reload_conf()")


def test_a_commit_stalled_on_synchronous_replication_is_cancelled_logged_and_not_fired_twice(
    private_store: PrivatePostgres, tmp_path: Path
) -> None:
    assert BOUND_S < TIMINGS.lease_ttl_s  # a stalled owner's call ends before its leases can be taken
    with store.connect(private_store.dsn) as conn:
        cluster = Cluster(private_store.dsn, conn, tmp_path, TIMINGS)
        try:
            add_interval_jobs(conn, JOBS)
            since = cluster.now()
            flags = ["--statement-timeout-s", str(STATEMENT_TIMEOUT_S), "--store-call-margin-s", str(CALL_MARGIN_S)]
            node = cluster.spawn("n1", flags)
            cluster.wait_balanced(["n1"])
            cluster.wait_fired("n1", cluster.now())

            stall_commits(conn, on=True)
            stalled_at, stalled_mono = cluster.now(), time.monotonic()
            cancelled = cluster.wait_for(
                f"{STALLED_COMMITS} firing commits cancelled in their wait on replication",
                lambda: [
                    e
                    for e in node.events_named("store_commit_wait_cancelled", since_mono=stalled_mono)
                    if e["session"].startswith("scheduler-fire-") and e["session"].endswith(":n1")
                ],
                lambda events: len(events) >= STALLED_COMMITS,
                timeout_s=STALLED_COMMITS * (BOUND_S + TIMINGS.tick_interval_s) + 10 * MARGIN_S,
            )
            # Committed locally, so visible on this store: the ticks carried on through the stall.
            assert cluster.wait_fired("n1", stalled_at + timedelta(seconds=1))
            stall_commits(conn, on=False)
            resumed_at = cluster.now()

            for event in cancelled:
                assert event["level"] == "warning", event
                assert event["bound_s"] == BOUND_S, event
                assert "synchronous replication" in event["reason"], event
                assert "committed locally" in event["reason"], event
            cancels = node.events_named("store_call_cancelled", since_mono=stalled_mono)
            assert len(cancels) >= len(cancelled), node.tail()
            assert not node.events_named("store_call_stuck"), node.tail()

            history = cluster.finish(since, covering=resumed_at, timeout_s=20 + MARGIN_S)
            assert (history.report.missing, history.report.duplicates) == (0, 0), history.report
            assert history.report.runs == history.report.expected > 0
            cluster.stop_all()
        finally:
            cluster.teardown()
