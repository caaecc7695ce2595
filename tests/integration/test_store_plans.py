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

from datetime import UTC, datetime

from scheduler import store

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def fill_runs(conn, n: int) -> None:
    """``n`` pending pulled runs (queue set), the shape a herd leaves."""
    conn.execute(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,"
        " state, queue, origin, available_at)"
        " SELECT g %% 1024, gen_random_uuid(), %(t)s, 'acme', %(t)s, %(t)s, 'n', 1, 'pending', 'default',"
        " 'schedule', %(t)s FROM generate_series(1, %(n)s) AS g",
        {"t": T0, "n": n},
    )


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
