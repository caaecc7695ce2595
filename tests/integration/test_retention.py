"""Retention against a real store: ``runs prune`` and the node's retention loop.

Runs, skip ranges and deleted jobs are written with known ages relative to
the STORE's clock (days away from the cutoff, so the test is exact whatever
the timing), then pruned in small batches (many batches per partition chunk,
so the keyset continuation is exercised), and the surviving rows are compared
with the expected set key by key.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from datetime import timedelta

import psycopg
import pytest
from click.testing import CliRunner
from helpers import store_now

from scheduler import jobs, retention, store
from scheduler.cli import cli
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.partition import partition_of
from scheduler.settings import Settings
from scheduler.spec import JobSpec

DAY = timedelta(days=1)
WEEK_S = 7 * 86_400


def read(conn: psycopg.Connection, sql: str) -> list[dict]:
    """A read retried on 40001 (under SERIALIZABLE a read racing the node may be asked to retry)."""
    return store.run_transaction(conn, lambda c: c.execute(sql).fetchall())


def keys(conn: psycopg.Connection, table: str) -> set[tuple]:
    column = {"runs": "nominal_time", "skips": "first_nominal"}.get(table)
    cols = "partition_id, job_id" + (f", {column}" if column else "")
    return {tuple(row.values()) for row in read(conn, f"SELECT {cols} FROM {table}")}


class Aged:
    """Rows written at known ages; ``old`` must go, ``kept`` must stay (7-day retention)."""

    def __init__(self, conn: psycopg.Connection, jobs_count: int = 24) -> None:
        now = store_now(conn)
        specs = [JobSpec.build(tenant="acme", interval_s=3600) for _ in range(jobs_count)]
        ids = jobs.add_jobs(conn, specs)
        self.old: dict[str, set] = {"runs": set(), "skips": set(), "jobs": set()}
        self.kept: dict[str, set] = {"runs": set(), "skips": set(), "jobs": set()}
        runs, skips = [], []
        for i, job_id in enumerate(ids):
            pid = partition_of(job_id)
            for k in range(i % 5 + 1):  # 1..5 old runs, 10 days back
                runs.append((pid, job_id, now - 10 * DAY - k * timedelta(minutes=1), "old"))
            runs.append((pid, job_id, now - 7 * DAY - timedelta(hours=1), "old"))  # just past the cutoff
            runs.append((pid, job_id, now - 7 * DAY + timedelta(hours=1), "kept"))  # just inside it
            runs.append((pid, job_id, now - DAY, "kept"))
            skips.append((pid, job_id, now - 20 * DAY, now - 9 * DAY, "old"))
            skips.append((pid, job_id, now - 8 * DAY, now - 6 * DAY, "kept"))  # ends inside the window
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch)"
                " VALUES (%s, %s, %s, 'acme', %s, %s, 'n', 1)",
                [(pid, job, nominal, nominal, nominal) for pid, job, nominal, _ in runs],
            )
            cur.executemany(
                "INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots, reason,"
                " recorded_at, node_id, epoch) VALUES (%s, %s, %s, %s, 1, 'test', %s, 'n', 1)",
                [(pid, job, first, until, until) for pid, job, first, until, _ in skips],
            )
        for pid, job, nominal, fate in runs:
            getattr(self, fate)["runs"].add((pid, job, nominal))
        for pid, job, first, _, fate in skips:
            getattr(self, fate)["skips"].add((pid, job, first))
        # deleted jobs: two long ago (pruned), one yesterday (kept); live jobs stay
        for n, job_id in enumerate(ids[:3]):
            jobs.delete_job(conn, job_id)
            age = 8 * DAY if n < 2 else DAY
            conn.execute(
                "UPDATE jobs SET deleted_at = now() - %s, changed_at = now() - %s WHERE job_id = %s", (age, age, job_id)
            )
            (self.old if n < 2 else self.kept)["jobs"].add((partition_of(job_id), job_id))
        self.kept["jobs"] |= {(partition_of(j), j) for j in ids[3:]}
        assert len({pid for pid, _, _ in self.old["runs"]}) > 5  # spread over partitions

    def counts(self) -> dict[str, int]:
        return {table: len(rows) for table, rows in self.old.items()}


def test_prune_deletes_exactly_the_old_rows_in_batches(conn):
    aged = Aged(conn)
    report = retention.prune(conn, WEEK_S, batch_rows=3)
    assert {"runs": report.runs, "skips": report.skips, "jobs": report.jobs} == aged.counts()
    assert report.batches > sum(aged.counts().values()) // 3
    for table in ("runs", "skips", "jobs"):
        assert keys(conn, table) == aged.kept[table], table
    again = retention.prune(conn, WEEK_S, batch_rows=3)
    assert (again.runs, again.skips, again.jobs) == (0, 0, 0)


def test_prune_limited_to_some_partitions(conn):
    aged = Aged(conn)
    some = sorted({pid for pid, _, _ in aged.old["runs"]})[:3]
    report = retention.prune(conn, WEEK_S, partition_ids=some, batch_rows=2)
    assert report.runs == sum(1 for pid, _, _ in aged.old["runs"] if pid in some)
    assert keys(conn, "runs") == aged.kept["runs"] | {k for k in aged.old["runs"] if k[0] not in some}


def cli_env(dsn: str) -> dict[str, str | None]:
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    return env


def test_runs_prune_command_prints_exact_counts(pg_dsn, conn):
    aged = Aged(conn)
    counts = aged.counts()
    result = CliRunner().invoke(
        cli, ["runs", "prune", "--older-than", "7d", "--batch-rows", "4"], env=cli_env(pg_dsn), catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(
        f"pruned {counts['runs']} runs, {counts['skips']} skips, {counts['jobs']} deleted jobs older than "
    )
    assert keys(conn, "runs") == aged.kept["runs"]
    again = CliRunner().invoke(
        cli, ["runs", "prune", "--older-than", "604800", "--json"], env=cli_env(pg_dsn), catch_exceptions=False
    )
    assert again.exit_code == 0, again.stderr
    assert {k: v for k, v in json.loads(again.stdout).items() if k in ("runs", "skips", "jobs")} == {
        "runs": 0,
        "skips": 0,
        "jobs": 0,
    }


@pytest.mark.parametrize("value", ["0", "7w", "-3d"])
def test_runs_prune_refuses_a_bad_duration(pg_dsn, value):
    result = CliRunner().invoke(
        cli, ["runs", "prune", "--older-than", value], env=cli_env(pg_dsn), catch_exceptions=False
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: older_than: ") and len(result.stderr.splitlines()) == 1


def test_node_retention_loop_prunes_its_partitions(pg_dsn, conn):
    """A node with retention_s set deletes the old rows on its own thread, counted in its metrics."""
    aged = Aged(conn)
    settings = Settings(
        dsn=pg_dsn,
        node_id="keeper",
        lease_ttl_s=2.0,
        renew_interval_s=0.5,
        poll_interval_s=0.25,
        tick_interval_s=0.5,
        safety_margin_s=0.5,
        metrics_port=0,
        retention_s=float(WEEK_S),
        retention_batch_rows=5,
        retention_batch_interval_s=0.02,
    )
    node = Node(settings, metrics=Metrics())
    node.start()
    try:
        deadline = time.monotonic() + 30
        while keys(conn, "runs") != aged.kept["runs"] or keys(conn, "jobs") != aged.kept["jobs"]:
            assert time.monotonic() < deadline, "the retention loop did not prune in 30 s"
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while node.retention.passes < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        node.stop()
        node.join(10)
    assert keys(conn, "skips") == aged.kept["skips"]
    for table, count in aged.counts().items():
        assert f'scheduler_retention_pruned_rows_total{{table="{table}"}} {float(count)}' in text
    assert node.metrics.value("scheduler_retention_pruned_rows_total", {"table": "runs"}) == aged.counts()["runs"]


def test_prune_never_deletes_an_unfinished_run(conn):
    """Runs in state pending, leased or failed stay whatever their age; finished ones
    (succeeded, dead, canceled) and pre-delivery runs (state NULL) go at the cutoff."""
    now = store_now(conn)
    (job_id,) = jobs.add_jobs(conn, [JobSpec.build(tenant="acme", interval_s=3600)])
    pid = partition_of(job_id)
    states = [None, "pending", "leased", "failed", "succeeded", "dead", "canceled"]
    old = {state: now - 30 * DAY - i * timedelta(minutes=1) for i, state in enumerate(states)}
    conn.cursor().executemany(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,"
        " state, queue) VALUES (%s, %s, %s, 'acme', %s, %s, 'n', 1, %s, 'default')",
        [(pid, job_id, nominal, nominal, nominal, state) for state, nominal in old.items()],
    )
    report = retention.prune(conn, WEEK_S, batch_rows=2)
    assert report.runs == 4
    assert keys(conn, "runs") == {(pid, job_id, old[state]) for state in ("pending", "leased", "failed")}
    assert retention.prune(conn, WEEK_S, batch_rows=2).runs == 0
