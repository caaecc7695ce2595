"""Helpers shared by test modules (the tests directory is on ``sys.path``: ``from helpers import ...``).

One definition each: a helper two test modules need lives here, not in both.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from scheduler import jobs, store
from scheduler import log as logmod
from scheduler.clock import Clock, SystemClock
from scheduler.coordination import LeaseTable, SqlCoordinator
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.worker import Worker
from scheduler.firing import DEFAULT_LIMITS, Firer, FiringLimits
from scheduler.identity import SPEC_COLUMNS
from scheduler.metrics import Metrics
from scheduler.settings import Settings

T = TypeVar("T")

CRON_CASES_PATH = Path(__file__).resolve().parent / "data" / "cron-cases.json"
"""The cron/DST cases from public bug reports (the fields: tests/unit/test_cron_cases.py)."""


def cron_cases() -> list[dict]:
    """The cases of :data:`CRON_CASES_PATH`, in file order."""
    return json.loads(CRON_CASES_PATH.read_text("utf-8"))


def store_now(conn: psycopg.Connection) -> datetime:
    """The store's ``now()`` (aware): on an autocommit connection, the instant of this call."""
    return store.now(conn)


PINNABLE_QUERIES = frozenset(name for name, sql in store.QUERIES.items() if "coalesce(%(now)s::timestamptz" in sql)
"""Named queries that take the store clock's pin as a nullable ``now`` (scheduler/clock.py)."""

_QUERY_NAMES = {sql: name for name, sql in store.QUERIES.items()}


def record_named_queries(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Record every named query (scheduler/sql/queries.sql) any psycopg client
    cursor executes or streams from now until the test ends: the returned list
    fills with ``(query name, parameters)`` in the order sent, from every thread."""
    sent: list[tuple[str, object]] = []
    real_execute, real_stream = psycopg.Cursor.execute, psycopg.Cursor.stream

    def execute(self, query, params=None, **kwargs):
        if isinstance(query, str) and query in _QUERY_NAMES:
            sent.append((_QUERY_NAMES[query], params))
        return real_execute(self, query, params, **kwargs)

    def stream(self, query, params=None, **kwargs):
        if isinstance(query, str) and query in _QUERY_NAMES:
            sent.append((_QUERY_NAMES[query], params))
        yield from real_stream(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    monkeypatch.setattr(psycopg.Cursor, "stream", stream)
    return sent


def wait_for(
    what: str,
    probe: Callable[[], T],
    predicate: Callable[[T], bool] = bool,
    *,
    timeout_s: float = 15.0,
    interval_s: float = 0.05,
    check: Callable[[], None] | None = None,
) -> T:
    """Poll ``probe()`` until ``predicate(value)``; return that value.

    ``check()`` runs before each probe and may raise to fail early (e.g. a
    node died). A probe the store cancels with 40001/40P01 (at SERIALIZABLE
    even a read can be, CI's second pass) counts as "not yet" and is asked
    again. Raises AssertionError naming ``what``, the timeout and the last
    value seen.
    """
    deadline = time.monotonic() + timeout_s
    value = None
    while True:
        if check is not None:
            check()
        try:
            value = probe()
        except psycopg.Error as exc:
            if not store.is_retryable(exc) or time.monotonic() >= deadline:
                raise
        else:
            if predicate(value):
                return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.1f}s waiting for {what}; last seen: {value!r}")
        time.sleep(interval_s)


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OneNode:
    """A node's firing half, driven by hand: joined, holding all 1,024 leases.

    ``node_id`` names it in the store (runs, skips); ``clock`` (default the
    system clock) is the lease table's, the coordinator's and the firer's:
    the leases' local deadlines count from its ``monotonic()``, and a
    ``ManualClock(store_at=...)`` pins the store clock of every query they
    send (scheduler/clock.py); ``limits`` are the firer's thresholds;
    ``overrides`` are Settings. ``close()`` closes the firer and the coordinator."""

    def __init__(
        self,
        dsn: str,
        node_id: str = "t1",
        clock: Clock | None = None,
        limits: FiringLimits = DEFAULT_LIMITS,
        **overrides,
    ) -> None:
        self.settings = Settings(dsn=dsn, node_id=node_id, **overrides).validated()
        self.metrics = Metrics()
        self.clock = clock or SystemClock()
        self.table = LeaseTable(self.clock, self.settings.safety_margin_s)
        self.coord = SqlCoordinator(self.settings, self.metrics, self.clock)
        self.coord.join()
        sent = self.clock.monotonic()
        grants = self.coord.claim(1024)
        assert len(grants) == 1024
        self.table.grant(grants, sent, self.settings.lease_ttl_s)
        self.firer = Firer(self.settings, self.table, self.clock, self.metrics, limits)

    def epoch(self, partition_id: int) -> int:
        return self.table.held()[partition_id].epoch

    def close(self) -> None:
        self.firer.close()
        self.coord.close()


def stamp_schedule_keys(conn: psycopg.Connection) -> int:
    """Give every live job the schedule key of its columns as they are now; return
    how many jobs were stamped.

    The engine's write paths (scheduler/jobs.py) keep a job's ``schedule_key``
    in step with its spec; a test that writes ``jobs`` rows with raw SQL
    (backdated anchors and slots) calls this afterwards, or its timers carry
    no key (or a stale one) and the herd path would not (or wrongly) take them.
    """
    rows = [
        dict(row)
        for row in conn.execute(
            f"SELECT partition_id, job_id, {', '.join(SPEC_COLUMNS)} FROM jobs WHERE deleted_at IS NULL"
        ).fetchall()
    ]
    if not rows:
        return 0
    with conn.transaction():
        jobs.register_schedules(conn, rows)
        with conn.cursor() as cur:
            cur.executemany(
                "UPDATE jobs SET schedule_key = %(schedule_key)s WHERE partition_id = %(partition_id)s"
                " AND job_id = %(job_id)s",
                rows,
            )
    return len(rows)


def pending_run(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    nominal: datetime,
    queue: str | None = "default",
    scheduled: datetime | None = None,
) -> RunKey:
    """A run of ``job_id`` at ``nominal`` as the firing statement writes it: pending in
    ``queue`` (None: pushed to the job's URL), scheduled, fired and available at
    ``scheduled`` (default: ``nominal``), by node ``t1`` at epoch 1."""
    key = RunKey.of(job_id, nominal)
    at = nominal if scheduled is None else scheduled
    tenant = conn.execute("SELECT tenant FROM jobs WHERE job_id = %s", (job_id,)).fetchone()["tenant"]
    conn.execute(
        """
        INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,
                          state, queue, origin, available_at)
        VALUES (%s, %s, %s, %s, %s, %s, 't1', 1, 'pending', %s, 'schedule', %s)
        """,
        (key.partition_id, job_id, nominal, tenant, at, at, queue, at),
    )
    return key


def run_row(conn: psycopg.Connection, key: RunKey) -> dict:
    """The ``runs`` row of ``key``."""
    return conn.execute(
        "SELECT * FROM runs WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (key.partition_id, key.job_id, key.nominal_time),
    ).fetchone()


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records every request and answers from a script.

    ``script`` items are ``(status, headers, delay_s)``; when it is empty the
    answer is 200 after ``delay_s``; status 0 reads the request and closes the
    connection without answering (a server that crashed mid-request). Every
    answer's body is ``body`` (``b"ok"``). ``requests`` holds ``{method, path,
    headers (lower-case names), body, peer (the client's address and port:
    one per connection)}`` in arrival order; ``peak`` the most
    requests handled at once. Listens on ``host``:``port`` (0: a free port).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, delay_s: float = 0.0) -> None:
        self.requests: list[dict] = []
        self.delay_s = delay_s
        self.script: list[tuple[int, dict[str, str], float]] = []
        self.body = b"ok"
        self.peak = 0
        self._active = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                            "peer": self.client_address,
                        }
                    )
                    status, headers, delay_s = (
                        receiver.script.pop(0) if receiver.script else (200, {}, receiver.delay_s)
                    )
                    receiver._active += 1
                    receiver.peak = max(receiver.peak, receiver._active)
                try:
                    time.sleep(delay_s)
                    if status == 0:
                        self.close_connection = True
                        return
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(receiver.body)))
                    self.end_headers()
                    self.wfile.write(receiver.body)
                except OSError:  # the client gave up (timeout)
                    pass
                finally:
                    with receiver._lock:
                        receiver._active -= 1

            do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


RUN_DEFAULTS = {"tenant": "acme", "node_id": "n", "epoch": 1, "queue": "default", "origin": "schedule"}
"""Columns :func:`insert_run` writes unless told otherwise."""


def insert_run(conn: psycopg.Connection, job_id, nominal_time: datetime, **columns) -> None:
    """Write one run of ``job_id`` at ``nominal_time`` directly, as firing and delivery would
    have left it: ``columns`` are ``runs`` columns (e.g. ``state="dead", attempt=5,
    last_error="boom"``); scheduled_at and fired_at default to the nominal time, the others
    to :data:`RUN_DEFAULTS`, state to ``pending``. For tests of what reads runs."""
    from scheduler.partition import partition_of

    row = {
        **RUN_DEFAULTS,
        "state": "pending",
        "scheduled_at": nominal_time,
        "fired_at": nominal_time,
        **columns,
        "partition_id": partition_of(job_id),
        "job_id": job_id,
        "nominal_time": nominal_time,
    }
    names = ", ".join(row)
    values = ", ".join(f"%({name})s" for name in row)
    conn.execute(f"INSERT INTO runs ({names}) VALUES ({values})", row)  # noqa: S608 - column names are ours


# ---------------------------------------------------------------- workers (tests/integration/test_worker.py, tests/api)

WORKER_HANDLERS = textwrap.dedent(
    """
    import os, pathlib, time

    DIR = pathlib.Path(os.environ["WORKER_TEST_DIR"])

    def slow(run):
        # Marks that it started (file named by run id and attempt), then waits for
        # a 'release' file for at most 120 s.
        (DIR / f"started.{run.run_id}.{run.attempt}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not (DIR / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def sleepy(run):
        (DIR / f"started.{run.run_id}.{run.attempt}").write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("WORKER_TEST_SLEEP_S", "600")))

    def record(run):
        # One file per (run, attempt), created exclusively: a second delivery of the same
        # attempt would raise (and nack) instead of passing unseen.
        with open(DIR / f"done.{run.run_id}.{run.attempt}", "x") as f:
            f.write(repr(run.payload))

    def heap(run):
        # How many objects the process had frozen out of the garbage collector's reach.
        import gc
        (DIR / f"frozen.{run.run_id}.{run.attempt}").write_text(str(gc.get_freeze_count()))

    NOT_CALLABLE = 42
    """
)
"""Handlers of worker processes under test (write it as ``handlers.py`` in a directory named by
``WORKER_TEST_DIR`` in the worker's environment and its current directory)."""


class WorkerThread:
    """A :class:`Worker` running on a thread until :meth:`stop`."""

    def __init__(self, w: Worker) -> None:
        self.worker = w
        self.thread = threading.Thread(target=w.run, name="test-worker", daemon=True)
        self.thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.worker.stop()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "worker did not stop"


def output_of(proc: subprocess.Popen) -> str:
    """What a worker process started with a ``log_path`` attribute wrote so far."""
    return proc.log_path.read_text()  # type: ignore[attr-defined]


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs, and wait for it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def started(handlers_dir: Path, key: RunKey, attempt: int) -> bool:
    """Whether a :data:`WORKER_HANDLERS` handler marked ``key``'s ``attempt`` as started."""
    return (handlers_dir / f"started.{key.run_id}.{attempt}").exists()


@contextlib.contextmanager
def json_log_records() -> Iterator[list[dict]]:
    """The engine's log records (INFO and up) while the block runs, as parsed JSON lines: a
    list filled when the block ends. The logger's handlers and level are restored."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logmod.JsonFormatter())
    logger = logmod.LOGGER
    saved = (list(logger.handlers), logger.level)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    records: list[dict] = []
    try:
        yield records
    finally:
        logger.handlers[:], level = saved
        logger.setLevel(level)
        records.extend(json.loads(line) for line in buffer.getvalue().splitlines())


RUNS_LIST_COLUMNS = [
    "RUN_ID",
    "TENANT",
    "JOB_NAME",
    "NOMINAL_TIME",
    "STATE",
    "ATTEMPT",
    "FIRED_AT",
    "LATENESS_S",
    "WORKER",
    "LAST_ERROR",
]
"""The header of ``scheduler runs list``'s table, in order."""
