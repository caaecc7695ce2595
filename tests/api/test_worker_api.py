"""The Python worker over HTTP (``Worker(api_url=…)``, ``scheduler worker --api-url``): the same
handler contract as over the store, without database credentials.

A worker process killed mid-run is redelivered as attempt 2 after its lease,
as tests/integration/test_worker.py checks for the store transport.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from helpers import (
    WORKER_HANDLERS,
    OneNode,
    WorkerThread,
    closed_port,
    output_of,
    pending_run,
    reap,
    run_row,
    started,
    store_now,
    wait_for,
)

from scheduler import jobs, store
from scheduler.api.server import ApiThread
from scheduler.delivery import lifecycle
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.worker import DoNotRetry, Run, Worker
from scheduler.errors import ValidationError
from scheduler.settings import ApiSettings
from scheduler.spec import JobSpec

S = timedelta(seconds=1)
LEASE_S = 2.0
UNLIMITED = ApiSettings(rate_per_s=100_000.0, burst=100_000, pool_size=4)


@pytest.fixture
def db(api) -> Iterator[psycopg.Connection]:
    with store.connect(api.dsn, application_name="pytest-worker-api") as conn:
        yield conn


@pytest.fixture
def node(api) -> Iterator[OneNode]:
    n = OneNode(api.dsn)
    yield n
    n.close()


@pytest.fixture
def handlers_dir(tmp_path: Path) -> Path:
    (tmp_path / "handlers.py").write_text(WORKER_HANDLERS)
    return tmp_path


def due(conn: psycopg.Connection, name: str, payload: str | None = None) -> RunKey:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", name=name, interval_s=3600)).job_id
    if payload is not None:
        conn.execute(
            "INSERT INTO job_delivery (partition_id, job_id, payload, max_attempts, backoff_base_s, backoff_cap_s)"
            " SELECT partition_id, job_id, %s, 5, 1, 300 FROM jobs WHERE job_id = %s",
            (payload, job_id),
        )
    return pending_run(conn, job_id, store_now(conn).replace(microsecond=0) - 5 * S)


def state_of(conn: psycopg.Connection, key: RunKey) -> tuple[str, int]:
    r = run_row(conn, key)
    return (r["state"], r["attempt"])


@pytest.fixture
def start(api) -> Iterator:
    started: list[WorkerThread] = []

    def build(handler, token: str, **kwargs) -> WorkerThread:
        kwargs.setdefault("lease_s", LEASE_S)
        kwargs.setdefault("stop_timeout_s", 5.0)
        kwargs.setdefault("api_url", api.url)
        started.append(WorkerThread(Worker(None, None, "default", handler, api_key=token, **kwargs)))
        return started[-1]

    yield build
    for r in started:
        r.stop()


def spawn(api, token: str, handlers_dir: Path, handler: str, *flags: str, **env: str) -> subprocess.Popen:
    """``scheduler worker --api-url`` in a process, the key in its environment only (no DSN at all)."""
    path = handlers_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
    child = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") or k.startswith("SCHEDULER_TEST_")}
    child.update(WORKER_TEST_DIR=str(handlers_dir), PYTHONUNBUFFERED="1", SCHEDULER_API_KEY=token, **env)
    with path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "worker", "--api-url", api.url, "--handler", handler,
             "--lease-s", str(LEASE_S), *flags],
            cwd=handlers_dir, env=child, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    proc.log_path = path  # type: ignore[attr-defined]
    return proc


# ---------------------------------------------------------------- in a thread


def test_a_worker_over_http_runs_the_handler_and_acks(api, db, start) -> None:
    token = api.key("acme", "worker")
    key = due(db, "nightly", '{"report": "sales"}')
    seen: list[Run] = []
    w = start(seen.append, token, worker_id="box:1")
    wait_for("succeeded", lambda: state_of(db, key), lambda s: s == ("succeeded", 1))
    w.stop()
    (run,) = seen
    assert (run.run_id, run.job_name, run.tenant, run.queue, run.attempt, run.origin) == (
        key.run_id, "nightly", "acme", "default", 1, "schedule",
    )  # fmt: skip
    assert (run.nominal_time, run.scheduled_at, run.payload) == (
        key.nominal_time,
        key.nominal_time,
        {"report": "sales"},
    )
    stored = run_row(db, key)
    assert (stored["worker"], stored["last_error"]) == (f"api:{token.split('_')[1]}:box:1", None)
    m = w.worker.metrics
    assert m.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 1
    assert m.value("scheduler_worker_dispatch_lag_seconds_count") == 1
    assert w.worker.stopped_cleanly is True


def test_an_http_workers_start_names_the_api_keys_tenant_as_one(api, db, start, caplog) -> None:
    """``worker_started`` of a worker over the API: the tenant is the key's (one), not none
    (it logged tenant_count=0, from a trial)."""
    caplog.set_level(logging.INFO, logger="scheduler")
    token = api.key("acme", "worker")
    key = due(db, "nightly", None)
    w = start(lambda run: None, token)
    wait_for("succeeded", lambda: state_of(db, key), lambda s: s == ("succeeded", 1))
    w.stop()
    (started,) = [r.fields for r in caplog.records if getattr(r, "event", "") == "worker_started"]
    assert (started["tenants"], started["tenant_count"]) == ("(the API key's)", 1)


def test_a_raising_handler_over_http_nacks_with_its_error(api, db, start) -> None:
    token = api.key("acme", "tenant")
    key = due(db, "nightly")

    def handler(run: Run) -> None:
        raise DoNotRetry("bad payload")

    w = start(handler, token, worker_id="box 7 ☃" + "x" * 200)  # the API takes 100 printable ASCII characters
    wait_for("failed", lambda: run_row(db, key), lambda r: r["state"] == "failed")
    w.stop()
    failed = run_row(db, key)
    assert (failed["attempt"], failed["retryable"], failed["last_error"]) == (1, False, "DoNotRetry: bad payload")
    assert failed["worker"] == f"api:{token.split('_')[1]}:" + ("box_7__" + "x" * 200)[:100]


def test_heartbeats_over_http_keep_a_run_leased_past_its_lease(api, db, start) -> None:
    token = api.key("acme", "worker")
    key = due(db, "nightly")
    release = threading.Event()
    w = start(lambda run: release.wait(30), token, lease_s=1.0)
    wait_for("leased", lambda: state_of(db, key), lambda s: s == ("leased", 1))
    first = run_row(db, key)["leased_until"]
    wait_for("a heartbeat", lambda: run_row(db, key)["leased_until"], lambda until: until > first, timeout_s=10)
    release.set()
    wait_for("succeeded", lambda: state_of(db, key), lambda s: s == ("succeeded", 1))
    w.stop()


def test_an_http_worker_keeps_its_result_while_the_api_is_down_and_acks_when_it_is_back(api, db, start) -> None:
    token = api.key("acme", "worker")
    key = due(db, "nightly")
    first = ApiThread(api.dsn, "127.0.0.1", 0, UNLIMITED).start()
    port = first.port
    release = threading.Event()
    w = start(lambda run: release.wait(30), token, lease_s=30.0, api_url=f"http://127.0.0.1:{port}")
    try:
        wait_for("leased", lambda: state_of(db, key), lambda s: s == ("leased", 1))
    finally:
        first.stop()
    release.set()  # the handler returns while nothing listens: the ack fails and is kept
    errors = w.worker.metrics.store_errors
    wait_for("a failed ack", lambda: errors.labels(operation="ack")._value.get(), lambda n: n >= 2)
    assert state_of(db, key) == ("leased", 1)
    again = ApiThread(api.dsn, "127.0.0.1", port, UNLIMITED).start()
    try:
        wait_for("succeeded", lambda: state_of(db, key), lambda s: s == ("succeeded", 1))
        w.stop()
    finally:
        again.stop()
    assert w.worker.metrics.value("scheduler_worker_attempts_total", {"outcome": "succeeded"}) == 1


def test_the_api_arguments_of_a_worker_are_validated(api) -> None:
    def handler(run: Run) -> None:
        return None

    cases = [
        (dict(dsn="postgresql://x", tenant=None), "api_url: give either a store DSN or an API URL, not both"),
        (dict(dsn=None, tenant="acme"), "tenant: over the API the tenant is the key's: give none"),
        (dict(dsn=None, tenant=None, api_key=""), "api_key: an API URL needs a key (SCHEDULER_API_KEY)"),
        (dict(dsn=None, tenant=None, api_url="ftp://x"), "api_url: must be an http:// or https:// URL"),
    ]
    for kwargs, message in cases:
        args = {"api_url": api.url, "api_key": "tk_x_y", **kwargs}
        with pytest.raises(ValidationError) as err:
            Worker(args.pop("dsn"), args.pop("tenant"), "default", handler, **args)
        assert str(err.value).startswith(message)


# ---------------------------------------------------------------- processes


def test_an_http_worker_killed_mid_run_is_redelivered_as_attempt_2_after_its_lease(
    api, db, node, start, handlers_dir
) -> None:
    token = api.key("acme", "worker")
    key = due(db, "nightly")
    proc = spawn(api, token, handlers_dir, "handlers:slow")
    try:
        wait_for("handler started", lambda: started(handlers_dir, key, 1), timeout_s=30)
        first = run_row(db, key)
        assert (first["state"], first["attempt"]) == ("leased", 1)
        assert token not in " ".join(proc.args)  # the key is never on the command line (ps shows it)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        reap(proc)
    assert token not in output_of(proc)
    epochs = {key.partition_id: node.epoch(key.partition_id)}

    def settled() -> dict:
        lifecycle.settle(db, node_id="t1", epochs=epochs)
        return run_row(db, key)

    pending = wait_for("pending again", settled, lambda r: r["state"] == "pending", timeout_s=20)
    assert (pending["attempt"], pending["last_error"]) == (1, "lease expired")
    seen: list[int] = []
    w = start(lambda run: seen.append(run.attempt), token)
    wait_for("succeeded", lambda: state_of(db, key), lambda s: s == ("succeeded", 2))
    w.stop()
    assert seen == [2]
    final = run_row(db, key)
    assert final["first_claimed_at"] == first["claimed_at"]
    assert db.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 1


def test_sigterm_lets_an_http_workers_handler_finish_and_ack_then_exit_0(api, db, handlers_dir) -> None:
    token = api.key("acme", "worker")
    key = due(db, "nightly")
    # A DSN and a tenant in the environment (a shared profile) are ignored with --api-url: this DSN
    # could not even be reached.
    proc = spawn(
        api,
        token,
        handlers_dir,
        "handlers:sleepy",
        "--stop-timeout-s",
        "30",
        WORKER_TEST_SLEEP_S="1.5",
        SCHEDULER_DSN=f"postgresql://nobody@127.0.0.1:{closed_port()}/none",
        SCHEDULER_TENANT="someone-else",
    )
    try:
        wait_for("handler started", lambda: started(handlers_dir, key, 1), timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, output_of(proc)
    finally:
        reap(proc)
    assert state_of(db, key) == ("succeeded", 1)
    assert "worker_stopped" in output_of(proc) and "clean=True" in output_of(proc)


REFUSED = "error: api_key: the API at {url} refused the key in SCHEDULER_API_KEY (HTTP 401: Unauthorized)"
NO_KEY = "error: api_key: --api-url needs the key in the environment variable SCHEDULER_API_KEY"
TENANT = "error: tenant: not with --api-url: the worker serves the key's tenant"
BOTH = "error: api_url: give either --dsn or --api-url, not both"


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ([], {"SCHEDULER_API_KEY": "tk_nope_nope"}, REFUSED),
        ([], {}, NO_KEY),
        (["--tenant", "acme"], {"SCHEDULER_API_KEY": "k"}, TENANT),
        (["--dsn", "postgresql://u@h/db"], {"SCHEDULER_API_KEY": "k"}, BOTH),
    ],
    ids=["wrong-key", "no-key", "tenant-given", "dsn-given"],
)
def test_a_misconfigured_http_worker_is_one_line_exit_2(api, handlers_dir, flags, env, message) -> None:
    child = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") or k.startswith("SCHEDULER_TEST_")}
    child.update(WORKER_TEST_DIR=str(handlers_dir), **env)
    done = subprocess.run(
        [sys.executable, "-m", "scheduler", "worker", "--api-url", api.url, "--handler", "handlers:slow", *flags],
        cwd=handlers_dir, env=child, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == message.format(url=api.url)
    assert "tk_nope_nope" not in done.stderr  # the key is never printed
