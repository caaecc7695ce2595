"""Loading bench workloads into the store fast (COPY), and starting node processes.

The bench uses the engine's own pieces for everything that has a meaning
(partition hash, jitter, schedule math, migrations, the ``scheduler node``
CLI); only the bulk load bypasses ``scheduler jobs add`` (one job per
statement would take minutes for millions of jobs) and writes the same
columns ``scheduler.jobs.add_job`` would, with COPY.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

import psycopg

from bench.process import NodeProcess
from scheduler import store
from scheduler.migrate import upgrade
from scheduler.partition import partition_of

JOB_COLUMNS = (
    "partition_id",
    "job_id",
    "tenant",
    "kind",
    "cron_expr",
    "cron_dialect",
    "tz",
    "interval_s",
    "anchor_at",
    "misfire",
    "next_nominal_at",
    "next_due_at",
    "created_at",
    "changed_at",
)
JOB_TYPES = (
    "int4",
    "uuid",
    "text",
    "text",
    "text",
    "text",
    "text",
    "int8",
    "timestamptz",
    "text",
    "timestamptz",
    "timestamptz",
    "timestamptz",
    "timestamptz",
)


BENCH_MARKER_TENANT = "bench.reserved"
"""A tenant every bench run creates: a database holding jobs but not this
tenant was not made by bench, and bench refuses to empty it."""


def reset_store(dsn: str) -> psycopg.Connection:
    """Migrate, then empty jobs/runs/skips/tenants/nodes and free every lease.

    Epochs are kept (they only ever increase). Returns an autocommit
    connection. Raises SystemExit with a message, touching nothing, if the
    database holds jobs that bench did not create (a DSN pointing at a real
    store by mistake).
    """
    upgrade(dsn)
    conn = store.connect(dsn, application_name="bench")
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs) AS jobs, EXISTS (SELECT 1 FROM tenants WHERE tenant = %s) AS marked",
        (BENCH_MARKER_TENANT,),
    ).fetchone()
    if row["jobs"] and not row["marked"]:
        conn.close()
        raise SystemExit(
            f"bench: refusing to empty {store.redact_dsn(dsn)}: it holds {row['jobs']} jobs that bench did not "
            "create. Point --dsn / SCHEDULER_DSN at a dedicated database."
        )
    conn.execute("TRUNCATE runs, skips, jobs, tenants, nodes")
    conn.execute("UPDATE leases SET owner_node = NULL, lease_expires_at = NULL")
    ensure_tenants(conn, [BENCH_MARKER_TENANT])
    return conn


def copy_rows(
    conn: psycopg.Connection,
    table: str,
    columns: Iterable[str],
    types: Iterable[str],
    rows: Iterable[tuple],
    progress=None,
) -> int:
    """COPY ``rows`` (binary, ``columns`` order) into ``table``; return the count.

    ``progress(n)`` is called every 10,000 rows and once at the end.
    """
    count = 0
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)
            count += 1
            if progress is not None and count % 10_000 == 0:
                progress(10_000)
    if progress is not None:
        progress(count % 10_000)
    return count


def copy_jobs(conn: psycopg.Connection, rows: Iterable[tuple], progress=None) -> int:
    """COPY job rows (``JOB_COLUMNS`` order) into ``jobs``; return the count."""
    return copy_rows(conn, "jobs", JOB_COLUMNS, JOB_TYPES, rows, progress)


def cron_row(
    tenant: str, expr: str, tz: str, nominal: datetime, created: datetime, job_id: uuid.UUID | None = None
) -> tuple:
    """A ``jobs`` row for a unix-dialect cron job whose next slot is ``nominal``."""
    job_id = job_id or uuid.uuid4()
    return (
        partition_of(job_id),
        job_id,
        tenant,
        "cron",
        expr,
        "unix",
        tz,
        None,
        None,
        "all",
        nominal,
        nominal,
        created,
        created,
    )


def ensure_tenants(conn: psycopg.Connection, tenants: Iterable[str]) -> None:
    store.execute(conn, "ensure_tenants", {"tenants": sorted(set(tenants))})


def start_node(dsn: str, node_id: str, log_dir: Path, extra: Iterable[str] = ()) -> NodeProcess:
    """Start ``scheduler node --node-id NODE_ID EXTRA`` against ``dsn`` (JSON logs to ``log_dir/NODE_ID.log``).

    The store and the log format come from ``SCHEDULER_DSN`` and
    ``SCHEDULER_LOG_FORMAT`` in the child's environment (the bench's own,
    plus those two).
    """
    env = {**os.environ, "SCHEDULER_DSN": dsn, "SCHEDULER_LOG_FORMAT": "json"}
    return NodeProcess(node_id, log_dir / f"{node_id}.log", ["node", "--node-id", node_id, *extra], env).start()


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1, what: str = "condition") -> float:
    """Poll ``predicate()`` until true; return seconds waited. Raises TimeoutError."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic() - start


def chunks(items: Iterator, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
