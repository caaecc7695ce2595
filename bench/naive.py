"""The naive design the seed rejects, as a baseline: every process races on due rows.

"Why not let all sixteen nodes race for due rows with SELECT … FOR UPDATE SKIP
LOCKED?" (the seed's answer is in docs/design.md, at the top). This module is that design, minimal but honest, so the
``compare`` workload can measure the engine against it on the same store:

* its own schema (:data:`SCHEMA`): ``jobs`` (one row per timer, the next fire
  in ``next_fire_at``, a b-tree on it) and ``runs`` (one row per (timer,
  nominal time), the primary key makes a duplicate impossible);
* every worker process runs the same loop (:func:`fire_once`): in one
  transaction, claim up to ``batch`` due rows, oldest first, with
  ``FOR UPDATE SKIP LOCKED``; insert their runs (``fired_at`` is the store's
  ``statement_timestamp()``, as in the engine's ``fire_runs``); advance each
  row's ``next_fire_at`` to the next slot after the one fired, computed in
  Python with the engine's own cron code (:class:`scheduler.schedule.CronSchedule`,
  parsed once per expression and memoized per (expression, instant) as the
  engine's planner does); commit. A slot still in the past stays due and
  fires on the next pass, so a late worker catches up on every slot (the
  engine's ``misfire=all``);
* a worker that found fewer than ``batch`` due rows sleeps ``poll_s``
  (100 ms by default) before looking again.

What it does not have, by design: partitions, leases, a fencing epoch, tenant
fairness, pacing. Arrays travel as binary parameters and each batch is three
statements in one transaction, so the loop is not slowed by per-row round
trips: what it measures is the design, not a strawman.

``python -m bench.naive --dsn DSN --worker-id ID`` runs one worker until
SIGTERM/SIGINT; :class:`NaiveProcess` starts one as a child process.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import click
import psycopg
from psycopg import sql

from bench.load import copy_rows
from bench.process import stop_child
from scheduler import store
from scheduler.schedule import CronSchedule

SCHEMA = "bench_naive"
"""The naive design's tables live here, apart from the engine's."""

BATCH = 1_000
"""Due rows claimed per transaction by default."""

POLL_S = 0.1
"""Idle sleep (seconds) of a worker that found less than a full batch."""

DDL = (
    """CREATE TABLE jobs (
    job_id       UUID PRIMARY KEY,
    tenant       TEXT NOT NULL,
    cron_expr    TEXT NOT NULL,
    cron_dialect TEXT NOT NULL,
    tz           TEXT NOT NULL,
    next_fire_at TIMESTAMPTZ
)""",
    "CREATE INDEX jobs_next_fire_idx ON jobs (next_fire_at) WHERE next_fire_at IS NOT NULL",
    """CREATE TABLE runs (
    job_id       UUID NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL,
    tenant       TEXT NOT NULL,
    fired_at     TIMESTAMPTZ NOT NULL,
    worker       TEXT NOT NULL,
    PRIMARY KEY (job_id, nominal_time)
)""",
)

CLAIM_DUE = """
SELECT job_id, tenant, cron_expr, cron_dialect, tz, next_fire_at
FROM jobs
WHERE next_fire_at <= now()
ORDER BY next_fire_at
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED
"""

INSERT_RUNS = """
INSERT INTO runs (job_id, nominal_time, tenant, fired_at, worker)
SELECT u.job_id, u.nominal, u.tenant, statement_timestamp(), %(worker)s
FROM unnest(%(job_ids)b::uuid[], %(nominals)b::timestamptz[], %(tenants)b::text[])
     AS u (job_id, nominal, tenant)
"""

ADVANCE_JOBS = """
UPDATE jobs AS j
SET next_fire_at = u.next_fire
FROM unnest(%(job_ids)b::uuid[], %(next_fires)b::timestamptz[]) AS u (job_id, next_fire)
WHERE j.job_id = u.job_id
"""

JOB_COLUMNS = ("job_id", "tenant", "cron_expr", "cron_dialect", "tz", "next_fire_at")
JOB_TYPES = ("uuid", "text", "text", "text", "text", "timestamptz")


def connect(dsn: str, application_name: str = "bench-naive") -> psycopg.Connection:
    """An autocommit connection whose ``search_path`` is the naive schema."""
    conn = store.connect(dsn, application_name=application_name)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(SCHEMA)))
    return conn


def reset_schema(dsn: str) -> psycopg.Connection:
    """Drop and recreate the naive schema (empty tables); return a connection to it."""
    conn = store.connect(dsn, application_name="bench-naive")
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(SCHEMA)))
    for statement in DDL:
        conn.execute(statement)
    return conn


def copy_jobs(conn: psycopg.Connection, rows: Iterable[tuple]) -> int:
    """COPY ``(job_id, tenant, cron_expr, cron_dialect, tz, next_fire_at)`` rows; return the count."""
    return copy_rows(conn, "jobs", JOB_COLUMNS, JOB_TYPES, rows)


@functools.lru_cache(maxsize=4_096)
def _schedule(expr: str, tz: str, dialect: str) -> CronSchedule:
    return CronSchedule(expr, tz, dialect)


@functools.lru_cache(maxsize=65_536)
def next_fire(expr: str, tz: str, dialect: str, after: datetime) -> datetime | None:
    """The slot after ``after`` (the engine's cron code, memoized)."""
    return _schedule(expr, tz, dialect).next_after(after)


def fire_once(conn: psycopg.Connection, worker: str, batch: int = BATCH) -> int:
    """One pass of the naive loop (one transaction); return the runs inserted."""
    with conn.transaction():
        rows = conn.execute(CLAIM_DUE, {"batch": batch}).fetchall()
        if not rows:
            return 0
        job_ids = [r["job_id"] for r in rows]
        nominals = [r["next_fire_at"] for r in rows]
        nexts = [next_fire(r["cron_expr"], r["tz"], r["cron_dialect"], r["next_fire_at"]) for r in rows]
        conn.execute(
            INSERT_RUNS,
            {"worker": worker, "job_ids": job_ids, "nominals": nominals, "tenants": [r["tenant"] for r in rows]},
        )
        conn.execute(ADVANCE_JOBS, {"job_ids": job_ids, "next_fires": nexts})
    return len(rows)


def run_worker(
    dsn: str, worker: str, batch: int = BATCH, poll_s: float = POLL_S, stop: threading.Event | None = None
) -> int:
    """Run the loop until ``stop`` is set; return the runs this worker inserted.

    A serialization failure or deadlock (none expected under READ COMMITTED)
    retries the pass, as :func:`scheduler.store.run_transaction` would.
    """
    stop = stop or threading.Event()
    conn = connect(dsn)
    total = 0
    try:
        while not stop.is_set():
            try:
                fired = fire_once(conn, worker, batch)
            except psycopg.Error as exc:
                if not store.is_retryable(exc):
                    raise
                continue
            total += fired
            if fired < batch:
                stop.wait(poll_s)
    finally:
        conn.close()
    return total


class NaiveProcess:
    """A naive worker child process (``python -m bench.naive``), output to ``log_dir``."""

    def __init__(self, dsn: str, worker: str, log_dir: Path, batch: int = BATCH, poll_s: float = POLL_S) -> None:
        self.worker = worker
        self._log = open(log_dir / f"{worker}.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.naive",
                "--dsn",
                dsn,
                "--worker-id",
                worker,
                "--batch",
                str(batch),
                "--poll-s",
                str(poll_s),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; return the exit status."""
        return stop_child(self.proc, self._log, timeout_s)


@click.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", required=True)
@click.option("--worker-id", required=True)
@click.option("--batch", default=BATCH, show_default=True, help="Due rows claimed per transaction.")
@click.option("--poll-s", default=POLL_S, show_default=True, help="Idle sleep between passes (s).")
def main(dsn: str, worker_id: str, batch: int, poll_s: float) -> None:
    """Run one naive worker until SIGTERM/SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    start = time.monotonic()
    total = run_worker(dsn, worker_id, batch, poll_s, stop)
    click.echo(f"{worker_id}: {total} runs in {time.monotonic() - start:.1f}s", err=True)


if __name__ == "__main__":
    main()
