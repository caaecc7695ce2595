"""Pull workers against a real store (scheduler/delivery/worker.py, ``scheduler worker``).

Runs are fired by the real firing path (the first test) or written as
pending rows of a real job, available from the store's now. Workers run in
process (``Worker.run`` on a thread) or as ``python -m scheduler worker``
subprocesses when the test kills, pauses or signals them; their handlers
live in a module written to the test's directory (the subprocess's working
directory, importable as ``handlers:...``). Leases are short (2 s), every
wait is a poll with a generous timeout, and every outcome is asserted as the
exact row in ``runs``. The partition owner's settle step is called directly
(``lifecycle.settle`` with the epochs of :class:`helpers.OneNode`, which holds
every partition).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from helpers import (
    WORKER_HANDLERS,
    OneNode,
    WorkerThread,
    closed_port,
    output_of,
    pending_run,
    reap,
    started,
    store_now,
    wait_for,
)
from helpers import run_row as row

from scheduler import jobs, store
from scheduler.cli import cli
from scheduler.delivery import lifecycle, worker
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.worker import DoNotRetry, RetryAfter, Run, Worker
from scheduler.errors import ValidationError
from scheduler.spec import JobSpec

S = timedelta(seconds=1)
LEASE_S = 2.0


@pytest.fixture
def node(pg_dsn: str) -> Iterator[OneNode]:
    n = OneNode(pg_dsn)
    yield n
    n.close()


@pytest.fixture
def handlers_dir(tmp_path: Path) -> Path:
    (tmp_path / "handlers.py").write_text(WORKER_HANDLERS)
    return tmp_path


# ---------------------------------------------------------------- helpers


def add_job(conn: psycopg.Connection, name: str | None = None) -> uuid.UUID:
    return jobs.add_job(conn, JobSpec.build(tenant="acme", name=name, interval_s=3600)).job_id


def pending_now(conn: psycopg.Connection, job_id: uuid.UUID, seconds_ago: int = 5) -> RunKey:
    """A pending run of ``job_id`` in queue ``default``, scheduled (and available) ``seconds_ago`` before
    the store's now, as the firing statement writes it."""
    nominal = store_now(conn).replace(microsecond=0) - seconds_ago * S
    key = RunKey.of(job_id, nominal)
    conn.execute(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,"
        " state, queue, origin, available_at)"
        " VALUES (%s, %s, %s, 'acme', %s, %s, 't1', 1, 'pending', 'default', 'schedule', %s)",
        (key.partition_id, job_id, nominal, nominal, nominal, nominal),
    )
    return key


def state_of(conn: psycopg.Connection, key: RunKey) -> tuple[str, int]:
    r = row(conn, key)
    return (r["state"], r["attempt"])


def settle_until(conn: psycopg.Connection, node: OneNode, key: RunKey, state: str, timeout_s: float = 20.0) -> dict:
    """Run the owner's settle step (fenced by ``node``'s epoch) until ``key``'s run is in ``state``."""
    epochs = {key.partition_id: node.epoch(key.partition_id)}

    def probe() -> dict:
        lifecycle.settle(conn, node_id="t1", epochs=epochs)
        return row(conn, key)

    return wait_for(f"run {key.run_id} {state}", probe, lambda r: r["state"] == state, timeout_s=timeout_s)


@pytest.fixture
def start(pg_dsn: str) -> Iterator:
    started: list[WorkerThread] = []

    def build(handler, **kwargs) -> WorkerThread:
        kwargs.setdefault("lease_s", LEASE_S)
        kwargs.setdefault("stop_timeout_s", 5.0)
        tenant = kwargs.pop("tenant", "acme")
        started.append(WorkerThread(Worker(pg_dsn, tenant, "default", handler, **kwargs)))
        return started[-1]

    yield build
    for r in started:
        r.stop()


def child_env(handlers_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") or k.startswith("SCHEDULER_TEST_")}
    env.update(WORKER_TEST_DIR=str(handlers_dir), PYTHONUNBUFFERED="1", **extra)
    return env


def spawn(pg_dsn: str, handlers_dir: Path, handler: str, *flags: str, **env: str) -> subprocess.Popen:
    path = handlers_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
    with path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "worker", "--dsn", pg_dsn, "--tenant", "acme", "--handler", handler,
             "--lease-s", str(LEASE_S), *flags],
            cwd=handlers_dir,
            env=child_env(handlers_dir, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    proc.log_path = path  # type: ignore[attr-defined]
    return proc


def holding(conn: psycopg.Connection, pg_dsn: str, handlers_dir: Path) -> tuple[RunKey, subprocess.Popen, dict]:
    """A pending run, and a worker process whose handler (``slow``) holds it: the run's key,
    the process and the run's row (leased, attempt 1)."""
    key = pending_now(conn, add_job(conn))
    proc = spawn(pg_dsn, handlers_dir, "handlers:slow")
    try:
        wait_for("handler started", lambda: started(handlers_dir, key, 1), timeout_s=30)
    except BaseException:
        reap(proc)
        raise
    held = row(conn, key)
    assert (held["state"], held["attempt"]) == ("leased", 1)
    return key, proc, held


# ---------------------------------------------------------------- a handler runs


def test_a_handler_runs_for_each_fired_run_which_ends_succeeded_at_attempt_1(conn, node, start) -> None:
    job_id = add_job(conn, name="nightly-report")
    conn.execute(
        "INSERT INTO job_delivery (partition_id, job_id, payload, max_attempts, backoff_base_s, backoff_cap_s)"
        " SELECT partition_id, job_id, %s, 5, 1, 300 FROM jobs WHERE job_id = %s",
        ('{"report": "sales", "to": ["ops@example.com"]}', job_id),
    )
    conn.execute(
        "UPDATE jobs SET next_nominal_at = anchor_at - interval '1 hour', next_due_at = anchor_at - interval '1 hour'"
        " WHERE job_id = %s",
        (job_id,),
    )
    node.firer.tick()
    fired = conn.execute(
        "SELECT * FROM runs WHERE job_id = %s ORDER BY nominal_time", (job_id,)
    ).fetchall()  # fmt: skip
    assert [r["state"] for r in fired] == ["pending", "pending"]
    seen: list[Run] = []
    lock = threading.Lock()

    def handler(run: Run) -> None:
        with lock:
            seen.append(run)

    w = start(handler)
    keys = [RunKey.of(job_id, r["nominal_time"]) for r in fired]
    for key in keys:
        wait_for("succeeded", lambda key=key: state_of(conn, key), lambda s: s == ("succeeded", 1))
    w.stop()
    assert sorted((r.run_id, r.attempt) for r in seen) == sorted((k.run_id, 1) for k in keys)
    by_id = {r.run_id: r for r in seen}
    for fired_row, key in zip(fired, keys, strict=True):
        run = by_id[key.run_id]
        assert (run.job_id, run.job_name, run.tenant, run.queue, run.origin) == (
            job_id, "nightly-report", "acme", "default", "schedule",
        )  # fmt: skip
        assert (run.nominal_time, run.scheduled_at) == (fired_row["nominal_time"], fired_row["scheduled_at"])
        assert run.payload == {"report": "sales", "to": ["ops@example.com"]}
        stored = row(conn, key)
        assert (stored["worker"], stored["last_error"]) == (w.worker.worker_id, None)
    m = w.worker.metrics
    assert m.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 2
    assert m.value("scheduler_worker_attempts_total", {"outcome": "failed"}) == 0
    assert m.value("scheduler_worker_dispatch_lag_seconds_count") == 2
    assert m.value("scheduler_worker_inflight_runs") == 0


def test_an_async_handler_runs_on_the_loop_and_acks(conn, start) -> None:
    key = pending_now(conn, add_job(conn))
    seen: list[tuple[str, int]] = []

    async def handler(run: Run) -> None:
        await asyncio.sleep(0.01)
        seen.append((run.run_id, run.attempt))

    w = start(handler)
    wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 1))
    w.stop()
    assert seen == [(key.run_id, 1)]


def test_an_async_handler_runs_in_a_task_of_its_own_so_its_timeout_is_its_own(conn, start) -> None:
    """``asyncio.timeout`` (and anything else built on ``asyncio.current_task()``) inside a
    handler acts on the handler's task: here the handler's wait times out and its run is
    nacked, and the worker claims and acks the next run. Run before its first await on the
    caller's task (an "eager" start measured to save ~4.5 µs per run), the timeout cancelled
    the worker's claim loop instead and the worker stopped."""
    first = pending_now(conn, add_job(conn), seconds_ago=10)
    tasks: list[asyncio.Task | None] = []

    async def handler(run: Run) -> None:
        tasks.append(asyncio.current_task())
        if run.run_id == first.run_id:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(5)

    w = start(handler)
    failed = wait_for("failed", lambda: row(conn, first), lambda r: r["state"] == "failed")
    assert (failed["attempt"], failed["last_error"]) == (1, "TimeoutError")
    second = pending_now(conn, add_job(conn))
    wait_for("second run acked", lambda: state_of(conn, second), lambda s: s == ("succeeded", 1))
    w.stop()
    assert w.worker.stopped_cleanly is True
    assert len(tasks) == 2 and None not in tasks and tasks[0] is not tasks[1]  # a task per run


def test_an_idle_worker_wakes_when_its_next_timer_falls_due_not_at_its_backoff(conn, start) -> None:
    """A job due 1 to 2 s from now, its run written ahead (available at that instant, as the
    node will make it), and a worker whose idle backoff is 3 s: its first claim finds
    nothing, it asks when the next timer falls due and claims the run ~DUE_SETTLE_S after
    the instant, not at its next backoff poll (1 to 2 s late)."""
    job_id = add_job(conn)
    key = pending_now(conn, job_id, seconds_ago=-2)  # due (and available) 1 to 2 s from now
    due = key.nominal_time
    conn.execute("UPDATE jobs SET next_nominal_at = %s, next_due_at = %s WHERE job_id = %s", (due, due, job_id))
    w = start(lambda run: None, poll_min_s=3.0, poll_max_s=3.0)
    claimed = wait_for("claimed", lambda: row(conn, key), lambda r: r["first_claimed_at"] is not None, timeout_s=20)
    lag_s = (claimed["first_claimed_at"] - due).total_seconds()
    w.stop()
    assert 0 <= lag_s < 1.0, lag_s


def test_a_refused_next_due_probe_is_not_asked_again_for_a_while_and_the_worker_goes_on(
    conn, start, monkeypatch
) -> None:
    """The next-due probe canceled past its budget (a bulk import of the tenant's timers in
    progress, test_delivery_lifecycle): asked again before every idle wait, each probe would
    cost the store its whole budget once a second per worker for the length of the import.
    After a refusal it is not asked for DUE_PROBE_HOLD_S; the worker keeps its backoff and
    goes on claiming (here a run written after the refusal is acked), on the same claim
    connection (the lane closed it at every cancel and reconnected: a helper's trial saw a
    new backend per cancel)."""
    asked: list[datetime] = []

    def refused(*args, **kwargs):
        asked.append(datetime.now(UTC))
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    monkeypatch.setattr(lifecycle, "next_due", refused)
    w = start(lambda run: None, poll_min_s=0.3, poll_max_s=0.3)
    wait_for("probe asked", lambda: len(asked), lambda n: n >= 1)
    time.sleep(1.5)  # five idle waits of 0.3 s (> DUE_PROBE_MIN_S), each asking without the hold
    key = pending_now(conn, add_job(conn))
    wait_for("run acked", lambda: state_of(conn, key), lambda s: s == ("succeeded", 1))
    claim_sessions = conn.execute(
        "SELECT backend_start FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'scheduler-worker-claim'"
    ).fetchall()
    w.stop()
    assert len(asked) == 1, asked
    assert worker.DUE_PROBE_HOLD_S >= 5.0
    assert len(claim_sessions) == 1 and claim_sessions[0]["backend_start"] < asked[0], (claim_sessions, asked)


def test_a_slow_next_due_answer_holds_the_next_question_back_in_proportion(conn, start, monkeypatch) -> None:
    """Probes that end just within their budget (25-40 ms during a bulk import in a helper's
    trial) were asked before every idle wait, once a second for the length of the import. The
    next question waits DUE_PROBE_COST_FACTOR times as long as the last answer took: here
    answers of 50 ms hold it back ~5 s, so a worker idle for 1.5 s with 0.3 s waits asks once."""
    asked: list[float] = []

    def slow(*args, **kwargs):
        asked.append(time.monotonic())
        time.sleep(0.05)
        return None

    monkeypatch.setattr(lifecycle, "next_due", slow)
    w = start(lambda run: None, poll_min_s=0.3, poll_max_s=0.3)
    wait_for("probe asked", lambda: len(asked), lambda n: n >= 1)
    time.sleep(1.5)
    w.stop()
    assert len(asked) == 1, asked
    assert worker.DUE_PROBE_COST_FACTOR * 0.05 >= 3.0


@pytest.mark.parametrize("how", ["raises CancelledError", "cancels its own task"])
def test_an_async_handler_that_ends_cancelled_fails_its_attempt_and_frees_its_slot(conn, start, how) -> None:
    """A handler that raises ``asyncio.CancelledError`` (itself, or by cancelling its own
    task: a cancelled future awaited, a library's cancel scope) without the worker having
    given the run up was re-raised past the worker: the run stayed leased, heartbeated for
    as long as the worker lived, and its slot was never freed (a trial's worker with two
    slots and two such runs served nothing more). It is a failed attempt like any other
    exception; the worker (one slot) then serves the next run."""
    first = pending_now(conn, add_job(conn), seconds_ago=10)

    async def handler(run: Run) -> None:
        if run.run_id == first.run_id:
            if how == "raises CancelledError":
                raise asyncio.CancelledError()
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(5)

    w = start(handler, concurrency=1)
    failed = wait_for("failed", lambda: row(conn, first), lambda r: r["state"] == "failed")
    assert (failed["attempt"], failed["retryable"], failed["last_error"]) == (1, True, "CancelledError")
    second = pending_now(conn, add_job(conn))
    wait_for("second run acked", lambda: state_of(conn, second), lambda s: s == ("succeeded", 1))
    w.stop()
    assert w.worker.stopped_cleanly is True


def test_a_worker_serving_several_tenants_claims_them_in_turn(conn, start) -> None:
    """One slot, acme with four runs due and beta with one: the rounds start with acme, beta,
    acme, ... so beta's run is the second handled, not the fifth (acme's backlog does not starve it)."""
    base = store_now(conn).replace(microsecond=0) - 60 * S
    acme = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=3600)).job_id
    beta = jobs.add_job(conn, JobSpec.build(tenant="beta", interval_s=3600)).job_id
    for i in range(4):
        pending_run(conn, acme, base + i * S)
    late = pending_run(conn, beta, base + 10 * S)
    seen: list[str] = []

    def handler(run: Run) -> None:
        seen.append(run.tenant)

    w = start(handler, concurrency=1, tenant=("acme", "beta"))
    wait_for("all handled", lambda: len(seen), lambda n: n == 5)
    wait_for("beta acked", lambda: state_of(conn, late), lambda st: st == ("succeeded", 1))
    w.stop()
    assert seen == ["acme", "beta", "acme", "acme", "acme"]


def test_a_tenant_whose_runs_arrive_behind_a_backlog_is_served_within_its_backoff(pg_dsn, conn, start) -> None:
    """One slot, ten tenants: "big" with a backlog, nine idle. A run of "t1" appears while
    big's 3rd run is handled; t1 is asked again within its backoff (50 ms here, each big
    run takes 50 ms), so at most a few of big's runs go before it. (The earlier rule
    started each round one tenant after the previous round's start, and big filled
    every round it reached: t1's run waited for the rotation, 8 of big's runs.)"""
    base = store_now(conn).replace(microsecond=0) - 60 * S
    small = [f"t{i}" for i in range(1, 10)]
    big = jobs.add_job(conn, JobSpec.build(tenant="big", interval_s=3600)).job_id
    late = jobs.add_job(conn, JobSpec.build(tenant="t1", interval_s=3600)).job_id
    for name in small[1:]:
        jobs.add_tenant(conn, name)
    for i in range(30):
        pending_run(conn, big, base + i * S)
    seen: list[str] = []

    def handler(run: Run) -> None:
        seen.append(run.tenant)
        if seen.count("big") == 3 and run.tenant == "big":
            with store.connect(pg_dsn) as other:
                pending_run(other, late, base)
        time.sleep(0.05)

    w = start(handler, concurrency=1, batch=1, poll_min_s=0.05, poll_max_s=0.05, tenant=("big", *small))
    wait_for("t1's run handled", lambda: list(seen), lambda s: "t1" in s)
    w.stop()
    big_before_t1 = seen.index("t1") - 3
    assert 0 <= big_before_t1 <= 3, seen


def test_a_worker_warns_at_start_about_tenants_the_store_has_not(conn, start, caplog) -> None:
    """``--tenant nosuch`` started and waited silently (the trial's typo): the worker now logs
    ``worker_unknown_tenants`` naming them, and serves the others."""
    caplog.set_level(logging.INFO, logger="scheduler")
    key = pending_now(conn, add_job(conn))
    w = start(lambda run: None, tenant=("acme", "nosuch", "typo"))
    wait_for("acked", lambda: state_of(conn, key), lambda st: st == ("succeeded", 1))
    w.stop()
    events = [(r.event, r.levelno, r.fields) for r in caplog.records if getattr(r, "event", "").startswith("worker_")]
    started = next(fields for event, _, fields in events if event == "worker_started")
    assert (started["tenants"], started["tenant_count"]) == ("acme,nosuch,typo", 3)
    warned = [(level, fields) for event, level, fields in events if event == "worker_unknown_tenants"]
    assert [(level, fields["tenants"], fields["count"]) for level, fields in warned] == [
        (logging.WARNING, "nosuch,typo", 2)
    ]


def test_a_worker_of_known_tenants_gives_no_warning(conn, start, caplog) -> None:
    caplog.set_level(logging.INFO, logger="scheduler")
    jobs.add_tenant(conn, "beta")
    key = pending_now(conn, add_job(conn))
    w = start(lambda run: None, tenant=("acme", "beta"))
    wait_for("acked", lambda: state_of(conn, key), lambda st: st == ("succeeded", 1))
    w.stop()
    assert not [r for r in caplog.records if getattr(r, "event", None) == "worker_unknown_tenants"]


@pytest.mark.parametrize(
    "tenants, message",
    [((), "tenant: give 1 to 1000 distinct tenants"),
     (("acme", "acme"), "tenant: give each tenant once; this one is repeated \\(got 'acme'\\)"),
     (("acme", "bad tenant"), "tenant: must be 1-200 characters"),
     (("t2,t3",), "tenant: one name each: repeat --tenant, or separate the names in SCHEDULER_TENANT with"
                  " spaces \\(a comma is not part of a tenant name\\) \\(got 't2,t3'\\)")],
)  # fmt: skip
def test_the_tenants_of_a_worker_are_validated(pg_dsn, tenants, message) -> None:
    with pytest.raises(ValidationError, match=f"^{message}"):
        Worker(pg_dsn, tenants, "default", lambda run: None)


def test_heartbeats_keep_a_run_leased_while_its_handler_runs_past_the_lease(conn, node, start) -> None:
    key = pending_now(conn, add_job(conn))
    release = threading.Event()

    def handler(run: Run) -> None:
        release.wait(60)

    w = start(handler)
    wait_for("leased", lambda: state_of(conn, key), lambda s: s == ("leased", 1))
    first_until = row(conn, key)["leased_until"]
    epochs = {key.partition_id: node.epoch(key.partition_id)}
    # Three leases' worth of time; the owner settles all along: nothing expires.
    deadline = store_now(conn) + 3 * LEASE_S * S
    while store_now(conn) < deadline:
        assert lifecycle.settle(conn, node_id="t1", epochs=epochs).runs == ()
        assert state_of(conn, key) == ("leased", 1)
        time.sleep(0.2)
    assert row(conn, key)["leased_until"] > first_until + 2 * LEASE_S * S
    release.set()
    wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 1))
    w.stop()


# ---------------------------------------------------------------- failures


def test_a_raising_handler_fails_the_attempt_then_settle_retries_it_as_attempt_2(conn, node, start) -> None:
    key = pending_now(conn, add_job(conn))
    attempts: list[int] = []

    def handler(run: Run) -> None:
        attempts.append(run.attempt)
        if run.attempt == 1:
            raise RuntimeError("boom\nsecond line")

    w = start(handler)
    failed = wait_for("failed", lambda: row(conn, key), lambda r: r["state"] == "failed")
    assert (failed["attempt"], failed["retryable"], failed["last_error"]) == (
        1,
        True,
        "RuntimeError: boom\nsecond line",
    )
    settled = settle_until(conn, node, key, "pending")
    assert settled["attempt"] == 1  # attempts started; the next claim is attempt 2
    wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 2))
    w.stop()
    assert attempts == [1, 2]
    m = w.worker.metrics
    assert m.value("scheduler_worker_attempts_total", {"outcome": "failed"}) == 1
    assert m.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 1
    assert m.value("scheduler_worker_dispatch_lag_seconds_count") == 1  # first attempts only


def test_do_not_retry_makes_the_run_dead_when_settled(conn, node, start) -> None:
    key = pending_now(conn, add_job(conn))

    def handler(run: Run) -> None:
        raise DoNotRetry("bad payload")

    w = start(handler)
    failed = wait_for("failed", lambda: row(conn, key), lambda r: r["state"] == "failed")
    assert (failed["attempt"], failed["retryable"], failed["last_error"]) == (1, False, "DoNotRetry: bad payload")
    dead = settle_until(conn, node, key, "dead")
    assert (dead["attempt"], dead["last_error"]) == (1, "DoNotRetry: bad payload")
    assert dead["finished_at"] is not None
    w.stop()


def test_retry_after_s_of_the_exception_is_the_earliest_retry(conn, node, start) -> None:
    key = pending_now(conn, add_job(conn))

    def handler(run: Run) -> None:
        raise RetryAfter(600, "rate limited")

    w = start(handler)
    failed = wait_for("failed", lambda: row(conn, key), lambda r: r["state"] == "failed")
    w.stop()
    assert failed["last_error"] == "RetryAfter: rate limited"
    nacked_at = failed["available_at"] - 600 * S
    assert failed["claimed_at"] <= nacked_at <= store_now(conn)
    settled = settle_until(conn, node, key, "pending")
    assert settled["available_at"] >= failed["available_at"]


def test_a_canceled_run_is_abandoned_at_the_next_heartbeat_and_its_async_handler_cancelled(conn, start) -> None:
    key = pending_now(conn, add_job(conn))
    entered, cancelled = threading.Event(), threading.Event()

    async def handler(run: Run) -> None:
        entered.set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    w = start(handler)
    assert entered.wait(20)
    # What the overlap policy `replace` does to the unfinished run: canceled, token kept.
    conn.execute(
        "UPDATE runs SET state = 'canceled', finished_at = now()"
        " WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (key.partition_id, key.job_id, key.nominal_time),
    )
    assert cancelled.wait(20)
    m = w.worker.metrics
    wait_for("counted", lambda: m.value("scheduler_worker_attempts_total", {"outcome": "canceled"}), lambda v: v == 1)
    w.stop()
    assert state_of(conn, key) == ("canceled", 1)
    assert m.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 0
    assert m.value("scheduler_worker_inflight_runs") == 0


def test_a_worker_survives_its_connections_being_killed(conn, start) -> None:
    first = pending_now(conn, add_job(conn), seconds_ago=10)
    release = threading.Event()

    def handler(run: Run) -> None:
        release.wait(60)

    w = start(handler)
    leased = wait_for("leased", lambda: row(conn, first), lambda r: r["state"] == "leased")
    wait_for("a heartbeat", lambda: row(conn, first)["leased_until"], lambda until: until > leased["leased_until"])
    killed = conn.execute(
        "SELECT count(*) AS n FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name LIKE 'scheduler-worker-%%' AND datname = current_database()) AS t"
    ).fetchone()["n"]
    assert killed == 2  # the claim's and the heartbeat's (no ack sent yet)
    second = pending_now(conn, add_job(conn))
    release.set()
    for key in (first, second):
        wait_for("succeeded", lambda key=key: state_of(conn, key), lambda s: s == ("succeeded", 1))
    w.stop()
    assert w.worker.metrics.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 2
    # The next claim found its connection gone, once; the one after reconnected.
    assert w.worker.metrics.value("scheduler_worker_store_errors_total", {"operation": "claim"}) == 1


def test_a_failing_worker_loop_stops_the_worker_and_raises_after_the_drain(conn, pg_dsn, monkeypatch) -> None:
    key = pending_now(conn, add_job(conn))

    def broken_ack(conn, leases, **kwargs):
        raise RuntimeError("a bug in the ack path")

    monkeypatch.setattr(lifecycle, "ack", broken_ack)
    w = Worker(pg_dsn, "acme", handler=lambda run: None, lease_s=LEASE_S, stop_timeout_s=1.0)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            w.run()
        except BaseException as exc:  # noqa: BLE001
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert [str(e) for e in failed] == ["a bug in the ack path"]
    # The ack never reached the store: the lease runs out and the owner settles it.
    assert state_of(conn, key) == ("leased", 1)


# ---------------------------------------------------------------- processes killed, paused, stopped


def test_a_worker_killed_mid_run_is_redelivered_as_attempt_2_after_its_lease(
    conn, node, start, pg_dsn, handlers_dir
) -> None:
    key, proc, first = holding(conn, pg_dsn, handlers_dir)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        reap(proc)
    # The lease runs out (no heartbeat any more); the owner's settle makes it pending again.
    settled = settle_until(conn, node, key, "pending")
    assert (settled["attempt"], settled["last_error"]) == (1, "lease expired")
    seen: list[int] = []
    w = start(lambda run: seen.append(run.attempt))
    wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 2))
    w.stop()
    assert seen == [2]
    final = row(conn, key)
    assert final["worker"] == w.worker.worker_id
    assert final["first_claimed_at"] == first["claimed_at"]
    assert conn.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 1
    assert w.worker.metrics.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 1


def test_a_paused_workers_late_ack_is_refused_after_another_worker_reclaimed(
    conn, node, start, pg_dsn, handlers_dir
) -> None:
    key, proc, stale = holding(conn, pg_dsn, handlers_dir)
    try:
        proc.send_signal(signal.SIGSTOP)  # a long GC pause, a frozen VM
        settle_until(conn, node, key, "pending")
        release = threading.Event()
        w = start(lambda run: release.wait(60))
        wait_for("reclaimed", lambda: state_of(conn, key), lambda s: s == ("leased", 2))
        current = row(conn, key)
        assert current["lease_token"] != stale["lease_token"]
        # The paused worker's handler may return at once when it resumes: it acks, or its
        # heartbeat learns first; either way its token is refused.
        (handlers_dir / "release").write_text("")
        proc.send_signal(signal.SIGCONT)
        wait_for(
            "the paused worker's refusal",
            lambda: output_of(proc),
            lambda out: "ack_refused" in out or "run_abandoned" in out,
            timeout_s=30,
        )
        out = output_of(proc)
        assert "answer=lost" in out or "another attempt holds the run" in out, out
        assert row(conn, key)["lease_token"] == current["lease_token"]
        assert state_of(conn, key) == ("leased", 2)
        release.set()
        wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 2))
        w.stop()
        assert row(conn, key)["worker"] == w.worker.worker_id
    finally:
        reap(proc)


@pytest.mark.parametrize(
    ("stop_timeout_s", "signals"),
    [("1", [signal.SIGTERM]), ("600", [signal.SIGTERM, signal.SIGINT])],
    ids=["grace-over", "second-signal-cuts-the-grace"],
)
def test_sigterm_nacks_a_run_still_running_at_the_stop_deadline_and_exits_0(
    conn, node, pg_dsn, handlers_dir, stop_timeout_s, signals
) -> None:
    key = pending_now(conn, add_job(conn))
    proc = spawn(pg_dsn, handlers_dir, "handlers:sleepy", "--stop-timeout-s", stop_timeout_s)
    try:
        wait_for("handler started", lambda: started(handlers_dir, key, 1), timeout_s=30)
        for sig in signals:
            proc.send_signal(sig)
            wait_for(
                "the signal handled", lambda sig=sig: output_of(proc).count("signal_received") > signals.index(sig)
            )
        assert proc.wait(30) == 0, output_of(proc)
    finally:
        reap(proc)
    stopped = row(conn, key)
    assert (stopped["state"], stopped["attempt"], stopped["retryable"]) == ("failed", 1, True)
    assert stopped["last_error"] == worker.STOP_ERROR
    assert "run_nacked_at_stop" in output_of(proc)
    settled = settle_until(conn, node, key, "pending")
    assert settled["attempt"] == 1


def test_sigterm_lets_a_handler_that_finishes_within_the_deadline_ack(conn, pg_dsn, handlers_dir) -> None:
    key = pending_now(conn, add_job(conn))
    proc = spawn(pg_dsn, handlers_dir, "handlers:sleepy", "--stop-timeout-s", "30", WORKER_TEST_SLEEP_S="1.5")
    try:
        wait_for("handler started", lambda: started(handlers_dir, key, 1), timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0, output_of(proc)
    finally:
        reap(proc)
    assert state_of(conn, key) == ("succeeded", 1)
    assert "run_nacked_at_stop" not in output_of(proc)


def test_a_worker_process_keeps_its_startup_heap_out_of_the_collectors_reach(conn, pg_dsn, handlers_dir, start) -> None:
    """``scheduler worker`` freezes what its imports made (scheduler.runtime.freeze_startup_heap);
    a Worker embedded in another process with ``run`` leaves that process's collector alone."""
    key = pending_now(conn, add_job(conn))
    proc = spawn(pg_dsn, handlers_dir, "handlers:heap")
    try:
        wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 1), timeout_s=30)
    finally:
        reap(proc)
    assert int((handlers_dir / f"frozen.{key.run_id}.1").read_text()) > 10_000

    embedded = pending_now(conn, add_job(conn))
    frozen: list[int] = []
    w = start(lambda run: frozen.append(gc.get_freeze_count()))
    wait_for("succeeded", lambda: state_of(conn, embedded), lambda s: s == ("succeeded", 1))
    w.stop()
    assert frozen == [0]


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("handlers", "error: handler: must be package.module:function (a Python import path) (got 'handlers')"),
        (
            "no_such_module:f",
            "error: handler: cannot import module 'no_such_module' (No module named 'no_such_module')\n",
        ),
        ("handlers:missing", "error: handler: module 'handlers' has no attribute 'missing'"),
        ("handlers:NOT_CALLABLE", "error: handler: handlers:NOT_CALLABLE must be callable (a function taking a Run)"),
    ],
)
def test_a_handler_that_cannot_be_used_is_one_line_exit_2(pg_dsn, handlers_dir, handler, message) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler", "worker", "--dsn", pg_dsn, "--tenant", "acme", "--handler", handler],
        cwd=handlers_dir, env=child_env(handlers_dir), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_worker_against_a_store_without_the_schema_exits_2(empty_pg_dsn) -> None:
    result = CliRunner().invoke(cli, ["worker", "--dsn", empty_pg_dsn, "--tenant", "acme", "--handler", "json:dumps"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: store: the schema is missing")
    assert result.stderr.endswith("run `scheduler db upgrade` first\n")


def test_worker_options_are_validated_before_anything_runs(pg_dsn) -> None:
    result = CliRunner().invoke(
        cli, ["worker", "--dsn", pg_dsn, "--tenant", "acme", "--handler", "json:dumps", "--lease-s", "0.5"]
    )
    assert result.exit_code == 2
    assert result.stderr == "error: lease_s: must be a number of seconds from 1 to 3600 in ASCII digits (got '0.5')\n"
    for option, value, rule in (
        ("--lease-s", "0", "from 1 to 3600"),
        ("--stop-timeout-s", "86401", "from 0 to 86400"),
    ):
        result = CliRunner().invoke(
            cli, ["worker", "--dsn", pg_dsn, "--tenant", "acme", "--handler", "json:dumps", option, value]
        )
        field = option[2:].replace("-", "_")
        assert (result.exit_code, result.stderr) == (
            2,
            f"error: {field}: must be a number of seconds {rule} in ASCII digits (got '{value}')\n",
        )
    with pytest.raises(ValidationError, match="^concurrency: must be a whole number from 1 to 10000"):
        Worker(pg_dsn, "acme", handler=print, concurrency=0)
    with pytest.raises(ValidationError, match="^tenant: "):
        Worker(pg_dsn, "", handler=print)


def test_end_to_end_a_node_fires_a_job_and_a_worker_runs_its_handler(conn, pg_dsn, handlers_dir) -> None:
    """The README's flow: a job every second, `scheduler node`, `scheduler worker --handler handlers:record`."""
    added = subprocess.run(
        [sys.executable, "-m", "scheduler", "jobs", "add", "--dsn", pg_dsn, "--tenant", "acme", "--name", "report",
         "--cron", "* * * * * *", "--dialect", "seconds", "--payload", '{"to": "ops"}'],
        env=child_env(handlers_dir), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    job_id = conn.execute("SELECT job_id FROM jobs WHERE name = 'report'").fetchone()["job_id"]
    assert str(job_id) in added.stdout
    node = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "node", "--dsn", pg_dsn, "--node-id", "e2e"],
        env=child_env(handlers_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    proc = spawn(pg_dsn, handlers_dir, "handlers:record")
    try:
        wait_for(
            "3 runs succeeded",
            lambda: conn.execute("SELECT count(*) AS n FROM runs WHERE state = 'succeeded'").fetchone()["n"],
            lambda n: n >= 3,
            timeout_s=60,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, output_of(proc)
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
    finally:
        reap(proc)
        reap(node)
    runs = conn.execute("SELECT * FROM runs WHERE job_id = %s ORDER BY nominal_time", (job_id,)).fetchall()
    succeeded = [r for r in runs if r["state"] == "succeeded"]
    assert len(succeeded) >= 3
    assert all(r["attempt"] == 1 and r["queue"] == "default" for r in succeeded)
    # Runs fired after the worker stopped wait, pending, for the next worker; nothing else.
    assert {r["state"] for r in runs} <= {"succeeded", "pending"}
    done = sorted(p.name for p in handlers_dir.glob("done.*"))
    assert done == sorted(f"done.{RunKey.of(job_id, r['nominal_time']).run_id}.1" for r in succeeded)
    assert {(handlers_dir / name).read_text() for name in done} == {"{'to': 'ops'}"}


def test_metrics_port_serves_the_workers_metrics(conn, pg_dsn, handlers_dir) -> None:
    key = pending_now(conn, add_job(conn))
    proc = spawn(pg_dsn, handlers_dir, "handlers:record", "--metrics-port", "0")
    try:
        wait_for("succeeded", lambda: state_of(conn, key), lambda s: s == ("succeeded", 1), timeout_s=30)
        port = wait_for("the metrics port", lambda: re.search(r"metrics_listening .*port=(\d+)", output_of(proc)))
        url = f"http://127.0.0.1:{port.group(1)}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()

        text = wait_for(
            "the ack counted", scrape, lambda t: 'scheduler_worker_attempts_total{outcome="succeeded"} 1.0' in t
        )
        assert 'scheduler_worker_attempts_total{outcome="failed"} 0.0' in text
        assert "scheduler_worker_dispatch_lag_seconds_count 1.0" in text
        assert "scheduler_worker_inflight_runs 0.0" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, output_of(proc)
    finally:
        reap(proc)


def test_a_worker_whose_store_is_unreachable_keeps_retrying_and_stops_cleanly(handlers_dir) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{closed_port()}/scheduler"
    proc = spawn(dsn, handlers_dir, "handlers:record")
    try:
        wait_for(
            "two failed claims",
            lambda: len(re.findall(r"worker_store_error .*operation=claim", output_of(proc))),
            lambda n: n >= 2,
        )
        assert proc.poll() is None, output_of(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, output_of(proc)
    finally:
        reap(proc)
    assert "worker_store_unreachable" in output_of(proc)
