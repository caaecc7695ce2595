"""The engine's statements are planned for the table they run against, not the one it was.

A statement the engine repeats (a poll of the delivery loops, a claim) must
keep using its index after ``runs`` grows from empty: psycopg prepares a
statement server-side on its 5th execution, and PostgreSQL then caches a
*generic* plan, which it keeps until the table is analyzed again. Made while
``runs`` was empty (a fresh install, or after a bulk delete), that plan was a
sequential scan, and the push loop's poll then read every run four times a
second (measured: a third of the store's CPU during a 300,000-run herd).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from helpers import OneNode

from scheduler import jobs, store
from scheduler.delivery import lifecycle
from scheduler.partition import partition_of
from scheduler.spec import JobSpec

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PAST = datetime(2020, 1, 1, tzinfo=UTC)  # available for claims


def fill_runs(conn, n: int) -> None:
    """``n`` pending pulled runs (queue set), the shape a herd leaves."""
    conn.execute(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,"
        " state, queue, origin, available_at)"
        " SELECT g %% 1024, gen_random_uuid(), %(t)s, 'acme', %(t)s, %(t)s, 'n', 1, 'pending', 'default',"
        " 'schedule', %(t)s FROM generate_series(1, %(n)s) AS g",
        {"t": T0, "n": n},
    )


def copy_pending_runs(conn, n: int, queue: str | None = "default") -> None:
    """``n`` pending runs of tenant acme's ``queue`` (None: pushed runs), with their true
    partitions, run ``i`` available at PAST + ``i`` ms (no two at the same instant) (COPY)."""
    with conn.cursor().copy(
        "COPY runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,"
        " state, queue, origin, available_at) FROM STDIN"
    ) as copy:
        for i in range(n):
            job_id = uuid.uuid4()
            at = PAST + timedelta(milliseconds=i)
            copy.write_row((partition_of(job_id), job_id, at, "acme", at, at, "n", 1, "pending", queue, "schedule", at))


def runs_reads(conn, table: str = "runs") -> dict[str, int]:
    """This session's running counts of scans and rows read on ``table`` (not yet reported)."""
    row = conn.execute(
        "SELECT seq_scan, coalesce(idx_tup_fetch, 0) AS idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()
    return {"seq_scan": int(row["seq_scan"]), "idx_tup_fetch": int(row["idx_tup_fetch"])}


def runs_seq_scans(conn) -> int:
    """Sequential scans of ``runs`` counted by this session and not yet reported (a running count)."""
    row = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'runs'").fetchone()
    return int(row["seq_scan"])


def test_a_poll_repeated_while_runs_was_empty_still_uses_its_index_once_runs_fills(pg_dsn):
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        conn.execute("ANALYZE runs")  # the statistics of an empty table
        params = {"pids": list(range(1024)), "now": None, "limit": 1000}
        for _ in range(20):  # past psycopg's prepare threshold (5) and PostgreSQL's 5 custom plans after it
            assert store.execute(conn, "due_push_partitions", params) == []
        fill_runs(conn, 20_000)
        with conn.transaction():
            before = runs_seq_scans(conn)
            assert store.execute(conn, "due_push_partitions", params) == []
            assert runs_seq_scans(conn) - before == 0
    finally:
        conn.close()


def test_engine_sessions_never_prepare_statements_server_side(pg_dsn):
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        for _ in range(8):
            store.execute(conn, "store_now", {"now": None})
        assert conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()["n"] == 0
    finally:
        conn.close()


BATCH = 1_000


@contextlib.contextmanager
def pending_backlog(pg_dsn: str, statistics: str, session: str) -> Iterator[psycopg.Connection]:
    """A connection to a store holding 50 × :data:`BATCH` pending runs of acme (a herd's
    backlog), ``runs`` analyzed after they were written (``statistics`` "current") or
    before (those of the empty table a herd starts from: autovacuum analyzes at most once
    a minute); ``session`` "probe session" makes it a worker's probe session
    (:func:`scheduler.store.make_probe_session`), else statements run in transactions."""
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    if session == "probe session":
        store.make_probe_session(conn)
    try:
        if statistics != "current":
            conn.execute("ANALYZE runs")
        copy_pending_runs(conn, 50 * BATCH)
        if statistics == "current":
            conn.execute("ANALYZE runs")
        yield conn
    finally:
        conn.close()


@pytest.mark.parametrize("session", ["transaction", "probe session"])
@pytest.mark.parametrize("statistics", ["current", "of an empty table"])
def test_a_claim_reads_the_runs_it_leases_not_every_pending_run(pg_dsn, statistics, session):
    """A table that is nearly all pending runs (the minutes after a herd) made PostgreSQL's
    planner join the picked keys to ``runs`` by hashing every pending run: a claim of 1,000
    read 50,000 rows, and the drain slowed as the backlog grew. A claim probes the primary
    key once per run it leases, with current statistics or with those of the empty table a
    herd starts from (autovacuum analyzes at most once a minute); in a transaction of its own
    (``SET LOCAL``) or alone on a worker's probe session (settings for the session)."""
    with pending_backlog(pg_dsn, statistics, session) as conn:
        before = runs_reads(conn)
        claimed = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=BATCH)
        after = runs_reads(conn)
        assert len(claimed) == BATCH
        assert after["seq_scan"] - before["seq_scan"] == 0
        assert after["idx_tup_fetch"] - before["idx_tup_fetch"] <= 3 * BATCH


def _finish(conn, kind: str, claimed: list) -> dict[str, str]:
    leases = [(c.key, c.token) for c in claimed]
    if kind == "heartbeat":
        return lifecycle.heartbeat(conn, leases, lease_s=60)
    if kind == "ack":
        return lifecycle.ack(conn, leases)
    fails = [lifecycle.Nack(run_id=c.key.run_id, token=c.token, retryable=True, error="boom") for c in claimed]
    return lifecycle.nack(conn, fails)


@pytest.mark.parametrize("session", ["transaction", "probe session"])
@pytest.mark.parametrize("statistics", ["current", "taken while every run was pending"])
@pytest.mark.parametrize("kind", ["heartbeat", "ack", "nack"])
def test_a_batch_of_heartbeats_acks_or_nacks_reads_its_runs_not_every_leased_run(pg_dsn, kind, statistics, session):
    """With 20,000 runs leased and the statistics of the minute before (every run pending,
    none leased: autovacuum analyzes at most once a minute), the planner estimated one
    leased run and reached the batch through ``runs_inflight_idx``: every ack of 1,000 read
    all 20,000 leased runs (42 ms instead of 15; a herd's acks slowed as its workers fell
    behind). A batch probes the primary key once per pair, whatever the statistics say, in a
    transaction of its own or alone on a worker's probe session."""
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    if session == "probe session":
        store.make_probe_session(conn)
    try:
        copy_pending_runs(conn, 20 * BATCH)
        conn.execute("ANALYZE runs")
        claimed = []
        for _ in range(20):
            claimed += lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=BATCH, lease_s=60)
        assert len(claimed) == 20 * BATCH
        if statistics == "current":
            conn.execute("ANALYZE runs")
        batch = claimed[:BATCH]
        before = runs_reads(conn)
        answers = _finish(conn, kind, batch)
        after = runs_reads(conn)
        want = {"heartbeat": "leased", "ack": "succeeded", "nack": "failed"}[kind]
        assert answers == {c.key.run_id: want for c in batch}
        assert after["seq_scan"] - before["seq_scan"] == 0
        assert after["idx_tup_fetch"] - before["idx_tup_fetch"] <= 3 * BATCH
    finally:
        conn.close()


@pytest.mark.parametrize("statistics", ["current", "of an empty table"])
def test_a_schedule_quota_check_does_not_read_every_job(pg_dsn, statistics):
    """Each schedule write counts its tenant's live jobs against the quota. With no index on
    live jobs by tenant that count was a sequential scan of the whole jobs table: on a store
    of 5 M jobs, a second of store CPU per PUT, and PUTs far past their 50 ms while a herd
    fired. It reads the tenant's named jobs from their index, at most quota + 1 of them
    (unnamed jobs, which only the operator's CLI adds, are not counted: an index of every
    live job by tenant cost each fired job one more index entry, ~1 s more per herd)."""
    from scheduler import jobs as jobs_mod

    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        if statistics != "current":
            conn.execute("ANALYZE jobs")
        conn.execute("INSERT INTO tenants (tenant) VALUES ('acme'), ('big') ON CONFLICT (tenant) DO NOTHING")
        conn.execute(
            "INSERT INTO jobs (partition_id, job_id, tenant, name, kind, interval_s, anchor_at, next_due_at)"
            " SELECT g %% 1024, gen_random_uuid(), CASE WHEN g <= 30 THEN 'acme' ELSE 'big' END, 's' || g,"
            " 'interval', 3600, %(t)s, %(t)s FROM generate_series(1, 20000) AS g",
            {"t": T0},
        )
        conn.execute(
            "INSERT INTO jobs (partition_id, job_id, tenant, kind, interval_s, anchor_at, next_due_at)"
            " VALUES (1, gen_random_uuid(), 'acme', 'interval', 3600, %(t)s, %(t)s)",
            {"t": T0},
        )
        if statistics == "current":
            conn.execute("ANALYZE jobs")
        with conn.transaction():
            before = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs'").fetchone()[
                "seq_scan"
            ]
            jobs_mod._check_quota(conn, "acme", 1, 100)
            with pytest.raises(jobs_mod.ValidationError, match="it has 30 and this request would make 31"):
                jobs_mod._check_quota(conn, "acme", 1, 30)
            after = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs'").fetchone()[
                "seq_scan"
            ]
        assert after - before == 0
    finally:
        conn.close()


def runs_rows_read(conn, name: str, params: dict) -> int:
    """Rows (or index entries) of ``runs`` that named query ``name`` reads: EXPLAIN ANALYZE's
    rows each scan of ``runs`` (sequential, index, bitmap) returned or filtered out, times
    its loops. It runs the query."""
    (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + store.QUERIES[name], params).fetchone()["QUERY PLAN"]

    def walk(node: dict) -> int:
        own = 0
        if node.get("Relation Name") == "runs" and node["Node Type"] != "ModifyTable":
            removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
            own = (node["Actual Rows"] + removed) * node["Actual Loops"]
        return own + sum(walk(child) for child in node.get("Plans", ()))

    return walk(plan["Plan"])


@pytest.mark.parametrize("statistics", ["current", "of an empty table"])
def test_the_push_loop_reads_about_what_it_claims_however_long_the_backlog(pg_dsn, statistics):
    """A push backlog (an endpoint down for a while, a herd of pushed runs) made every poll of
    the push loop and every claim read the whole backlog: both take the oldest due runs of
    the node's partitions (``ORDER BY available_at LIMIT n``), and over an index led by
    partition_id PostgreSQL read every due entry and kept the top n (90 ms a poll with
    250,000 pending, four polls a second: the loop fell to ~400 pushes/s and the backlog
    grew). Over an index on available_at both read about n entries per node sharing the
    partitions: here the node holds half of them, so about 2n."""
    limit = 100
    ours = list(range(0, 1024, 2))
    node = OneNode(pg_dsn)
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        if statistics != "current":
            conn.execute("ANALYZE runs")
        copy_pending_runs(conn, 20_000, queue=None)  # ~20 per partition
        if statistics == "current":
            conn.execute("ANALYZE runs")
        oldest_ours = conn.execute(
            "SELECT partition_id, job_id, nominal_time FROM runs WHERE partition_id = ANY(%s)"
            " ORDER BY available_at LIMIT %s",
            (ours, limit),
        ).fetchall()
        polled = {"pids": ours, "now": None, "limit": limit}
        assert runs_rows_read(conn, "due_push_partitions", polled) <= 3 * limit
        due = sorted(row["partition_id"] for row in store.execute(conn, "due_push_partitions", polled))
        assert due == sorted({row["partition_id"] for row in oldest_ours})
        params = lifecycle.claim_push_params(
            node_id=node.settings.node_id, epochs={pid: node.epoch(pid) for pid in due}, limit=limit
        )
        assert runs_rows_read(conn, "claim_push", params) <= 3 * limit + limit  # + the UPDATE's key probes
        leased = conn.execute(
            "SELECT partition_id, job_id, nominal_time FROM runs WHERE state = 'leased' ORDER BY available_at"
        ).fetchall()
        assert leased == oldest_ours  # the same runs: the oldest due of the partitions polled
    finally:
        conn.close()
        node.close()


@pytest.mark.parametrize("session", ["transaction", "probe session"])
@pytest.mark.parametrize("statistics", ["current", "of an empty table"])
def test_a_workers_ready_probe_reads_an_index_entry_per_tenant_not_every_pending_run(pg_dsn, statistics, session):
    """A worker serving many tenants asks, each claim round, which of them have runs
    (``tenants_with_pending_runs``). Written as a semi-join (``WHERE EXISTS``), it was
    planned from ``runs``' statistics: with those of the table before a herd (a few
    pending runs), PostgreSQL hashed every pending run of the queue (22 ms a probe with
    50,000 pending), and on a worker's probe session (hash joins off) joined every tenant
    against every pending run (277 ms: 2.5 M comparisons). Four workers probing several
    times a second spent 41 s of store CPU in a 300,000-run herd. Each tenant's probe reads
    at most one index entry, whatever the statistics say."""
    tenants = ["acme", *(f"small-{i:02d}" for i in range(50))]
    with pending_backlog(pg_dsn, statistics, session) as conn:  # all acme's
        before = runs_reads(conn)
        assert lifecycle.tenants_with_runs(conn, tenants=tenants, queue="default") == {"acme"}
        after = runs_reads(conn)
        assert after["seq_scan"] - before["seq_scan"] == 0
        assert after["idx_tup_fetch"] - before["idx_tup_fetch"] <= len(tenants)
        assert lifecycle.tenants_with_runs(conn, tenants=tenants[1:], queue="default") == set()
        assert lifecycle.tenants_with_runs(conn, tenants=tenants, queue="other") == set()


@pytest.mark.parametrize("session", ["transaction", "probe session"])
@pytest.mark.parametrize("statistics", ["current", "of an empty table"])
def test_a_workers_next_due_probe_reads_a_few_index_entries_per_tenant_not_every_job(pg_dsn, statistics, session):
    """An idle worker asks when its tenants' next timer falls due (``tenants_next_due``)
    before each longer wait. Among 20,000 jobs of acme due over the next hours, every
    one of queue ``other`` but the 30th, the probe walks acme's first due entries in
    order (at most NEXT_DUE_SCAN) and never scans the table, whatever the statistics."""
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        if session == "probe session":
            store.make_probe_session(conn)
        if statistics != "current":
            conn.execute("ANALYZE jobs")
        jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=3600))
        columns = [
            r["column_name"]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' ORDER BY ordinal_position"
            ).fetchall()
        ]
        fresh = {"job_id": "gen_random_uuid()", "next_due_at": "%(t)s::timestamptz + g * interval '1 second'",
                 "next_nominal_at": "%(t)s::timestamptz + g * interval '1 second'",
                 "queue": "CASE WHEN g = 30 THEN 'default' ELSE 'other' END"}  # fmt: skip
        select = ", ".join(fresh.get(c, c) for c in columns)
        conn.execute(
            f"INSERT INTO jobs ({', '.join(columns)}) SELECT {select}"  # noqa: S608 (column names from the catalog)
            " FROM (SELECT * FROM jobs LIMIT 1) AS j, generate_series(1, 20000) AS g",
            {"t": T0},
        )
        if statistics == "current":
            conn.execute("ANALYZE jobs")
        tenants = ["acme", *(f"small-{i:02d}" for i in range(50))]
        before = runs_reads(conn, "jobs")
        assert lifecycle.next_due(conn, tenants=tenants, queue="default", now=T0) == 30.0
        assert lifecycle.next_due(conn, tenants=tenants, queue="reports", now=T0) is None
        after = runs_reads(conn, "jobs")
        assert after["seq_scan"] - before["seq_scan"] == 0
        assert after["idx_tup_fetch"] - before["idx_tup_fetch"] <= 2 * lifecycle.NEXT_DUE_SCAN
    finally:
        conn.close()
