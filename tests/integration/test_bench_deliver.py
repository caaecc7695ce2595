"""``bench deliver`` at small scale: real node processes fire a few hundred runs and every
one is delivered (pulled by ``scheduler worker`` processes or the bench's own loop, or
pushed to the bench's receiver), counted exactly from the runs table; firing alone
(the CLI with ``--workers 0``) leaves each run pending.

The push case needs the engine's push loop (the node's, with setting push_allow)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from click.testing import CliRunner

from bench.__main__ import cli
from bench.consumers import receiver_duplicates, start_workers
from bench.deliver import Options, run_deliver
from scheduler import store
from scheduler.delivery.lifecycle import RunKey

RATE = 100
PERIOD_S = 2  # 200 jobs, each due every 2 s: 100 runs fall due every second
SECONDS = 12  # the measured window is what is left after 5 s at each end: 1-2 s


def window_runs(result) -> int:
    """Runs due in the measured window of a steady run (RATE per whole second)."""
    since, until = datetime.fromisoformat(result.since), datetime.fromisoformat(result.until)
    return RATE * int((until - since).total_seconds())


def steady(mode: str, workers: int, impl: str = "scheduler", receiver: str = "raw") -> Options:
    return Options(
        worker_impl=impl,
        receiver=receiver,
        mode=mode,
        workload="steady",
        rate=RATE,
        period_s=PERIOD_S,
        seconds=SECONDS,
        steady_tenants=3,
        workers=workers,
        deliver_timeout_s=60,
    )


@pytest.mark.parametrize("impl", ["scheduler", "bench"])
def test_pull_steady_every_run_claimed_once_and_acked(pg_dsn: str, tmp_path: Path, impl: str) -> None:
    result = run_deliver(pg_dsn, steady("pull", 2, impl), tmp_path)
    runs = window_runs(result)
    assert runs >= RATE
    assert (result.runs, result.succeeded, result.lost) == (runs, runs, 0)
    assert (result.missing, result.duplicates, result.unexpected) == (0, 0, 0)
    assert result.states == {"succeeded": runs}
    assert result.attempts == {"1": runs}
    assert result.redelivered == 0
    assert result.dispatch_p99_s is not None and result.ack_p99_s is not None
    assert result.dispatch_p50_s <= result.dispatch_p99_s <= result.dispatch_max_s
    assert result.throughput_runs_per_s == runs / (runs / RATE)
    assert (result.receiver_requests, result.receiver_duplicates) == (None, None)
    assert (result.worker_impl, result.worker_processes) == (impl, 2)  # --workers 2, each over every tenant
    cpu = result.cpu_s
    assert cpu is not None and result.cpu_window_s >= SECONDS
    assert {"node", "workers", "store: fire"} <= set(cpu)  # the store is local: its backends are read too
    if impl == "scheduler":
        assert "store: worker" in cpu  # the workers' claim, ack and heartbeat sessions
    assert all(s > 0 for s in cpu.values())
    assert cpu["total"] == pytest.approx(sum(s for g, s in cpu.items() if g != "total"), abs=0.05)
    machine = result.machine  # the fixed work timed before the run (bench/calibrate.py)
    assert machine is not None and set(machine) == {"python_ms", "store_scan_ms", "store_insert_ms"}
    assert all(ms > 0 for ms in machine.values())


def test_pull_steady_via_api_every_run_claimed_once_and_acked_over_http(pg_dsn: str, tmp_path: Path) -> None:
    opts = steady("pull", 3)
    opts.via_api = True  # 3 tenants: one `scheduler worker --api-url` each, against a `scheduler api` process
    result = run_deliver(pg_dsn, opts, tmp_path)
    runs = window_runs(result)
    assert runs >= RATE
    assert (result.runs, result.succeeded, result.lost) == (runs, runs, 0)
    assert (result.missing, result.duplicates) == (0, 0)
    assert result.attempts == {"1": runs}
    assert (result.worker_impl, result.worker_processes) == ("scheduler-api", 3)
    with store.connect(pg_dsn) as conn:
        by = conn.execute(
            "SELECT count(*) FILTER (WHERE worker LIKE 'api:%%:api-worker-%%') AS api, count(*) AS n FROM runs"
            " WHERE state = 'succeeded'"
        ).fetchone()
    assert by["api"] == by["n"] >= runs  # every run was acked through the API


def test_via_api_needs_a_worker_per_tenant(pg_dsn: str, tmp_path: Path) -> None:
    from bench.consumers import start_api_workers

    with pytest.raises(ValueError, match="over the API each worker serves one tenant"):
        start_api_workers(pg_dsn, "http://127.0.0.1:1", {"a": "k", "b": "k"}, 1, tmp_path)


def test_pull_herd_every_run_claimed_once_and_acked(pg_dsn: str, tmp_path: Path) -> None:
    opts = Options(
        mode="pull",
        workload="herd",
        jobs=200,
        tenants=3,
        workers=2,
        worker_impl="scheduler",
        lead_s=1.0,
        deliver_timeout_s=60,
        herd_on_second=True,
    )
    result = run_deliver(pg_dsn, opts, tmp_path)
    assert (result.worker_impl, result.worker_processes) == ("scheduler", 2)  # each over all 3 tenants
    assert (result.runs, result.succeeded, result.lost) == (200, 200, 0)
    assert (result.missing, result.duplicates, result.unexpected) == (0, 0, 0)
    assert result.attempts == {"1": 200}
    assert result.redelivered == 0
    assert result.small_tenants_dispatch_p99_s is not None
    # No jitter: every run is scheduled at T, so the last ack is T + the largest ack lag.
    assert result.last_ack_s == pytest.approx(result.ack_max_s, abs=1e-5)
    assert result.throughput_runs_per_s == 200 / result.last_ack_s


def test_firing_only_leaves_every_run_pending(pg_dsn: str, tmp_path: Path) -> None:
    args = ["deliver", "--dsn", pg_dsn, "--workload", "steady", "--rate", str(RATE), "--period-s", str(PERIOD_S)]
    args += [
        "--seconds",
        str(SECONDS),
        "--workers",
        "0",
        "--out-dir",
        str(tmp_path),
        "--json",
        str(tmp_path / "d.json"),
    ]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "| workload | runs | pending | without_delivery_state |" in out.output
    result = json.loads((tmp_path / "d.json").read_text())
    runs = window_runs(SimpleNamespace(**result))
    assert (result["runs"], result["pending"], result["without_delivery_state"]) == (runs, runs, 0)
    assert result["states"] == {"pending": runs}
    assert (result["succeeded"], result["lost"], result["missing"], result["duplicates"]) == (0, runs, 0, 0)
    assert result["attempts"] == {"0": runs}
    assert (result["workers"], result["worker_impl"], result["worker_processes"]) == (0, None, 0)
    assert result["dispatch_p50_s"] is None  # never claimed: infinitely late


@pytest.mark.parametrize("receiver", ["raw", "aiohttp"])
def test_push_steady_every_run_posted_once_with_its_run_id(pg_dsn: str, tmp_path: Path, receiver: str) -> None:
    result = run_deliver(pg_dsn, steady("push", 0, receiver=receiver), tmp_path)
    assert result.receiver == receiver
    runs = window_runs(result)
    assert (result.runs, result.succeeded, result.lost) == (runs, runs, 0)
    assert (result.missing, result.duplicates) == (0, 0)
    assert result.attempts == {"1": runs}
    assert result.receiver_duplicates == 0
    # Every request carried a run id the nodes fired, once; every run recorded
    # succeeded was received (runs fired as the nodes stopped may be on their way).
    records = [tuple(line.split("\t")) for line in (tmp_path / "logs" / "receiver.tsv").read_text().splitlines()]
    assert receiver_duplicates(records) == 0
    assert result.receiver_requests == len(records)
    conn = store.connect(pg_dsn)
    try:
        rows = conn.execute("SELECT job_id, nominal_time, state FROM runs").fetchall()
    finally:
        conn.close()
    fired = {RunKey.of(r["job_id"], r["nominal_time"]).run_id: r["state"] for r in rows}
    received = {key for key, _ in records}
    succeeded = {run_id for run_id, state in fired.items() if state == "succeeded"}
    assert received - set(fired) == set()
    assert succeeded - received == set()
    assert len(succeeded) >= runs


def test_workers_the_server_cannot_connect_are_not_started(pg_dsn: str, tmp_path: Path) -> None:
    conn = store.connect(pg_dsn)
    try:
        max_connections = int(conn.execute("SHOW max_connections").fetchone()["max_connections"])
    finally:
        conn.close()
    with pytest.raises(RuntimeError, match=f"{max_connections} bench worker processes need about"):
        start_workers(pg_dsn, ["big"], max_connections, tmp_path, impl="bench")
    with pytest.raises(RuntimeError, match=r"\d+ scheduler worker processes need about \d+ store connections"):
        start_workers(pg_dsn, ["big", "small-000"], max_connections // 3, tmp_path, impl="scheduler")
    assert list(tmp_path.iterdir()) == []  # no worker started (none wrote a log)


def test_put_rate_writes_schedules_through_the_api_while_the_herd_fires(pg_dsn: str, tmp_path: Path) -> None:
    opts = Options(
        mode="pull", workload="herd", jobs=200, tenants=3, workers=0, lead_s=1.0, put_rate=50, herd_on_second=True
    )
    result = run_deliver(pg_dsn, opts, tmp_path)
    assert (result.runs, result.missing, result.duplicates) == (200, 0, 0)
    put = result.put
    assert put is not None
    assert put["errors"] == 0 and put["statuses"] == {"201": put["count"]}
    assert put["count"] >= 1
    assert 0 < put["p50_ms"] <= put["p99_ms"] <= put["max_ms"]
    with psycopg.connect(pg_dsn) as conn:
        names = conn.execute("SELECT name FROM jobs WHERE tenant = 'bench-put' ORDER BY name").fetchall()
    assert sorted(n for (n,) in names) == sorted(f"bench-put-{i}" for i in range(put["count"]))


def test_put_rate_is_for_the_herd_only() -> None:
    with pytest.raises(ValueError, match="--put-rate: the herd workload"):
        Options(mode="pull", workload="steady", put_rate=5).check()
