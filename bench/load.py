"""Loading bench workloads into the store fast (COPY), and starting node processes.

The bench uses the engine's own pieces for everything that has a meaning
(partition hash, jitter, schedule math, migrations, the ``scheduler node``
CLI); only the bulk load bypasses ``scheduler jobs add`` (one job per
statement would take minutes for millions of jobs) and writes the same
columns ``scheduler.jobs.add_job`` would, with COPY, including each job's
``schedule_key``: a loader registers every distinct spec it is about to
COPY first (:func:`register_specs`, the engine's own
:func:`scheduler.jobs.register_schedules`, committed), then stamps the key
on every row of that spec (:func:`job_row`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.process import NodeProcess
from scheduler import store, tzreplan
from scheduler.identity import SPEC_COLUMNS
from scheduler.jobs import register_schedules
from scheduler.migrate import upgrade
from scheduler.partition import partition_of

JOB_COLUMNS = (
    "partition_id",
    "job_id",
    "tenant",
    *SPEC_COLUMNS,
    "schedule_key",
    "next_nominal_at",
    "next_due_at",
    "created_at",
    "changed_at",
)
"""Columns of a COPYed job row: every column a schedule key covers
(:data:`scheduler.identity.SPEC_COLUMNS`) is written explicitly, so the key
registered for a spec (:func:`register_specs`) is the key of the row."""
JOB_TYPES = (
    "int4",
    "uuid",
    "text",
    # SPEC_COLUMNS: kind, cron_expr, cron_dialect, tz, interval_s, anchor_at,
    # fire_at, misfire, catchup_window_s, misfire_grace_s, jitter_s
    "text",
    "text",
    "text",
    "text",
    "int8",
    "timestamptz",
    "timestamptz",
    "text",
    "int4",
    "int4",
    "int4",
    "int8",  # schedule_key
    "timestamptz",
    "timestamptz",
    "timestamptz",
    "timestamptz",
)

POLICY = {"misfire": "all", "catchup_window_s": 86_400, "misfire_grace_s": 60, "jitter_s": 0}
"""The misfire policy of every bench job: ``all``, and the ``jobs`` column
defaults for catch-up window, grace and jitter (seconds)."""


def cron_spec(expr: str, tz: str, dialect: str = "unix") -> dict[str, Any]:
    """The :data:`~scheduler.identity.SPEC_COLUMNS` of a bench cron job (policy :data:`POLICY`)."""
    return {
        "kind": "cron",
        "cron_expr": expr,
        "cron_dialect": dialect,
        "tz": tz,
        "interval_s": None,
        "anchor_at": None,
        "fire_at": None,
        **POLICY,
    }


def interval_spec(interval_s: int, anchor: datetime) -> dict[str, Any]:
    """The :data:`~scheduler.identity.SPEC_COLUMNS` of a bench interval job (policy :data:`POLICY`)."""
    return {
        "kind": "interval",
        "cron_expr": None,
        "cron_dialect": None,
        "tz": None,
        "interval_s": interval_s,
        "anchor_at": anchor,
        "fire_at": None,
        **POLICY,
    }


def register_specs(conn: psycopg.Connection, specs: Iterable[dict[str, Any]]) -> list[tuple]:
    r"""Register each distinct spec (a :func:`cron_spec` / :func:`interval_spec` dict) in
    ``schedules`` and set its ``schedule_key`` in place
    (:func:`scheduler.jobs.register_schedules`), in one committed transaction,
    retried whole on 40001/40P01; return each spec's :func:`spec_values`, in
    order, for the :func:`job_row`\ s of its jobs (COPYed after this).
    Raises what the store raises.
    """
    rows = list(specs)
    store.run_transaction(conn, lambda c: register_schedules(c, rows))
    return [spec_values(row) for row in rows]


def spec_values(spec: dict[str, Any]) -> tuple:
    """The :data:`~scheduler.identity.SPEC_COLUMNS` values of a registered spec, then its
    ``schedule_key``: the middle of a :func:`job_row` (computed once per spec)."""
    return (*(spec[c] for c in SPEC_COLUMNS), spec["schedule_key"])


def job_row(tenant: str, values: tuple, nominal: datetime, created: datetime, job_id: uuid.UUID | None = None) -> tuple:
    """A ``jobs`` row (:data:`JOB_COLUMNS` order) of a job with the spec
    ``values`` (:func:`spec_values`) whose next slot is ``nominal``."""
    job_id = job_id or uuid.uuid4()
    return (partition_of(job_id), job_id, tenant, *values, nominal, nominal, created, created)


BENCH_MARKER_TENANT = "bench.reserved"
"""A tenant every bench run creates: a database holding jobs but not this
tenant was not made by bench, and bench refuses to empty it."""


TRUNCATE = "TRUNCATE runs, skips, job_delivery, run_requests, jobs, tenant_secrets, api_keys, tenants, nodes"
"""Empties every table of jobs, tenants and their runs together (foreign keys
reference ``tenants``: they must be truncated in one statement)."""


def reset_store(dsn: str) -> psycopg.Connection:
    """Migrate, then empty jobs and runs and what belongs to them (:data:`TRUNCATE`), API keys, tenants and
    nodes, and free every lease.

    Epochs are kept (they only ever increase), and so are ``schedules``
    rows (a key always stands for the same spec). Records this process's
    tzdata release as the store's (``store_meta``): every slot bench loads
    into the emptied store is computed with it, and without the record a
    node's start would replan every loaded cron job (scheduler/tzreplan.py)
    during the measurement. Returns an autocommit
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
    conn.execute(TRUNCATE)
    conn.execute("UPDATE leases SET owner_node = NULL, lease_expires_at = NULL")
    ensure_tenants(conn, [BENCH_MARKER_TENANT])
    store.execute(conn, "set_store_meta", {"key": tzreplan.META_KEY, "value": tzreplan.tzdata_version()})
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
    tenant: str,
    expr: str,
    tz: str,
    nominal: datetime,
    created: datetime,
    job_id: uuid.UUID | None = None,
    *,
    schedule_key: int | None,
) -> tuple:
    """A ``jobs`` row for a unix-dialect cron job whose next slot is ``nominal``, carrying
    ``schedule_key`` (that of ``cron_spec(expr, tz)`` as :func:`register_specs` set it)."""
    return job_row(tenant, spec_values({**cron_spec(expr, tz), "schedule_key": schedule_key}), nominal, created, job_id)


def ensure_tenants(conn: psycopg.Connection, tenants: Iterable[str]) -> None:
    store.execute(conn, "ensure_tenants", {"tenants": sorted(set(tenants))})


def start_node(
    dsn: str, node_id: str, log_dir: Path, extra: Iterable[str] = (), env: Mapping[str, str] | None = None
) -> NodeProcess:
    """Start ``scheduler node --node-id NODE_ID EXTRA`` against ``dsn`` (JSON logs to ``log_dir/NODE_ID.log``).

    The store and the log format come from ``SCHEDULER_DSN`` and
    ``SCHEDULER_LOG_FORMAT`` in the child's environment (the bench's own,
    plus those two, plus ``env``: more settings, e.g. ``SCHEDULER_PUSH_ALLOW``).
    """
    env = {**os.environ, "SCHEDULER_DSN": dsn, "SCHEDULER_LOG_FORMAT": "json", **(env or {})}
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
