"""Pull workers: claim a queue's runs, run a handler on each, ack or nack (docs/delivery.md).

A :class:`Worker` serves one queue of one tenant, or of several (an
operator's shared pool: claims take the tenants in turn, see below). Its
handler is any callable
taking a :class:`Run`: a plain function runs on one of ``concurrency``
threads, an ``async def`` on the worker's asyncio loop. Returning acks the
run (it ends ``succeeded``); raising nacks it (``failed``; the partition
owner's settle step retries it after a backoff or marks it ``dead``):

* :class:`DoNotRetry` (or any exception whose ``retryable`` attribute is
  false) nacks with ``retryable=False``: the run goes ``dead`` when settled;
* an exception with a ``retry_after_s`` attribute (a finite number of
  seconds ≥ 0, e.g. :class:`RetryAfter`) asks the retry to wait at least
  that long.

How it works (one asyncio loop, three store connections, each used by one
thread so a slow statement on one never delays the others; each is a probe
session, :func:`scheduler.store.make_probe_session`: every claim, probe,
heartbeat, ack and nack is one statement sent alone, one round trip):

* **claim**: while fewer than ``concurrency`` handlers run, one
  :func:`~scheduler.delivery.lifecycle.claim` of up to ``min(free slots,
  batch)`` runs (with fewer than half the slots free, after waiting
  ``flush_interval_s`` for more to free up: under load, a few large claims
  rather than many of one run each). After an empty claim the tenant
  waits a tenth of the time since it last had runs, between ``poll_min_s``
  (50 ms) and ``poll_max_s`` (1 s) (:data:`IDLE_POLL_FRACTION`), or less:
  before a longer idle wait the worker asks when its tenants' next timer of
  its queue falls due (:func:`~scheduler.delivery.lifecycle.next_due`) and
  asks for runs :data:`DUE_SETTLE_S` after that instant, then every
  ``poll_min_s`` for :data:`DUE_WINDOW_S` while none come. Serving
  several tenants, a round first asks
  the store which of them have runs to claim (one statement, an index probe
  per tenant: :func:`~scheduler.delivery.lifecycle.tenants_with_runs`),
  then claims from those in turn (:class:`TenantTurns`), starting after the
  last tenant that got runs in the previous round, until the free slots are
  filled. So a tenant with a backlog takes at most one claim's worth before
  every other tenant with runs has had its turn, a tenant's new runs are
  seen by the next round, and idle tenants cost no claim at all. No
  LISTEN/NOTIFY (not in the PostgreSQL/CockroachDB common subset).
* **heartbeat**: every ``lease_s / 3``, ONE
  :func:`~scheduler.delivery.lifecycle.heartbeat` call for every run held
  (running or awaiting its ack; a call per 1,000 runs). A run answered
  ``canceled`` or ``lost`` is *abandoned*: removed from the worker, its
  handler's result discarded (logged as ``run_abandoned``); an async handler
  is cancelled (``asyncio.CancelledError`` raised at its ``await``); a thread
  cannot be stopped in Python, so a sync handler runs on and should check
  ``run.abandoned.is_set()`` between steps if it can.
  The store's answer decides, never the worker's clock: while the store is
  unreachable the worker keeps its runs and their results; a lease that
  expired meanwhile is settled by the partition owner, and the token then
  refuses this worker's late heartbeat or ack (``lost``). An ack that reaches
  the store after the lease expired but before anyone settled or re-claimed
  the run still counts (the token still holds it).
* **handler failures**: a handler that raises is nacked and logged once
  (WARNING ``handler_failed``: run id, attempt, exception type and the first
  line of its message cut to :data:`HANDLER_ERROR_LOG_CHARS`; never the payload).
* **ack/nack**: results are batched: flushed every ``flush_interval_s``
  (25 ms) or as soon as ``batch`` are waiting, one
  :func:`~scheduler.delivery.lifecycle.ack` and one
  :func:`~scheduler.delivery.lifecycle.nack` transaction per flush (a
  transaction per run would not reach the 12,000 runs/s target on 2 cores).
  A run keeps being heartbeated until its ack or nack is committed.
* **store errors** (connection refused or lost, statement timeout, retries
  exhausted) never end the worker: the connection is reopened on the next
  call, after a backoff (0.1 s doubling to 2 s); unflushed acks and nacks are
  kept and sent again (an ack re-sent with the same token answers
  ``succeeded`` again if the first one had committed).

**Stopping** (:meth:`Worker.stop`, or SIGTERM/SIGINT in
:meth:`Worker.run_until_signalled`): no more claims; in-flight handlers get
``stop_timeout_s`` to finish, heartbeats continuing meanwhile; at the
deadline every run still running is nacked (retryable, error ``worker
stopped: handler still running at the stop deadline``) and its async handler
cancelled; the remaining acks and nacks are flushed, and those already sent
answered (for at most ``FINAL_FLUSH_S`` more), and :meth:`Worker.run` returns. So no run stays leased
by a stopped worker without a heartbeat: it is either finished, nacked, or (the
store unreachable) left to expire with its lease. A second signal ends the
grace at once.

Delivery is at least once: a handler can run again for the same run id
(after a worker crash, a lost lease, a nack at the stop deadline while a
sync handler kept going). ``Run.run_id`` is the same on every attempt: make
the handler's effect idempotent on it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import inspect
import logging
import math
import os
import queue as queue_mod
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import psycopg

from scheduler import log, runtime, store
from scheduler.delivery import lifecycle
from scheduler.delivery.targets import validate_queue
from scheduler.errors import StoreError, ValidationError
from scheduler.metrics import WORKER_OUTCOMES, WorkerMetrics
from scheduler.spec import validate_tenant

POLL_MIN_S = 0.05
"""Idle claim backoff: the shortest wait after an empty claim."""
POLL_MAX_S = 1.0
"""Idle claim backoff: the longest wait between claims of an empty queue."""
IDLE_POLL_FRACTION = 0.1
"""Idle claim backoff: after an empty claim, a tenant waits this fraction of the time since it
last had runs (between :data:`POLL_MIN_S` and :data:`POLL_MAX_S`). So polling adds at most a
tenth of the quiet gap before a run: a queue fed every second (a steady load fired by the
node's once-a-second tick) is asked every 50–100 ms, one fed every minute about once a
second. Doubling (50 ms, 100, 200, 400, 800) let a worker sleep through most of the next
second's runs: dispatch lag p99 2.58 s at a steady 12,000 runs/s, 1.03 s with waits capped
at 100 ms (docs/performance.md, "2026-12-02, afternoon")."""
DUE_SETTLE_S = 0.05
"""An idle worker that knows when its next timer falls due (:func:`~scheduler.delivery.lifecycle.next_due`)
asks for runs this long after that instant: nodes tick 20 ms after each second and commit a tick's
first runs tens of milliseconds later."""
DUE_WINDOW_S = 1.0
"""For this long after a due instant an empty claim waits only ``poll_min_s``, not the idle backoff:
a tick's runs commit chunk by chunk over its first second."""
DUE_PROBE_MIN_S = 0.2
"""An idle worker asks when its next timer falls due only before a wait longer than this."""
DUE_PROBE_HOLD_S = 10.0
"""After the store failed or refused that question (a probe canceled past
:data:`~scheduler.delivery.lifecycle.NEXT_DUE_BUDGET_S`: a bulk import of the tenants' timers in
progress), a worker does not ask it again for this long; its idle backoff stands meanwhile."""
DUE_PROBE_COST_FACTOR = 100.0
"""And after an answer, not again before this many times as long as the answer took: the question
costs the store at most ~1 % of an idle worker's time. One of ~1 ms (51 tenants, nothing being
imported) holds nothing back (it is asked before idle waits, about once a second); one of 25-40 ms
(a bulk import of 200,000 timers in progress, each probe just within its budget: a helper's trial,
2026-12-04) holds the next for 2.5-4 s."""
FLUSH_INTERVAL_S = 0.025
"""Acks and nacks wait at most this long to be sent in one batch."""
STORE_BACKOFF_MIN_S = 0.1
STORE_BACKOFF_MAX_S = 2.0
"""After a store error, a loop retries after this backoff (doubling between the two bounds)."""
FINAL_FLUSH_S = 3.0
"""At a stop, how long the last acks and nacks may take to be sent after the stop deadline."""
DEFAULT_STOP_TIMEOUT_S = 25.0
"""Default grace of in-flight handlers after a stop (below the default 30 s lease)."""
DEFAULT_CONCURRENCY = 10
MIN_LEASE_S = lifecycle.MIN_LEASE_S
MAX_LEASE_S = lifecycle.MAX_LEASE_S
MAX_CONCURRENCY = 10_000
MAX_TENANTS = lifecycle.MAX_TENANTS_PROBED
"""Most tenants one worker serves (each round asks the store about all of them in one statement)."""
MAX_BATCH = lifecycle.MAX_BATCH
LOGGED_TENANTS_CHARS = 300
"""A log event's list of tenant names is cut to this many characters (a worker may serve 1,000)."""
ERROR_MAX_CHARS = 2000
"""A nack's error text (exception type and message) is cut to this many characters."""
HANDLER_ERROR_LOG_CHARS = 200
"""The ``handler_failed`` log event carries the first line of the error cut to this many characters."""
STOP_ERROR = "worker stopped: handler still running at the stop deadline"

STORE_ERRORS = (psycopg.Error, StoreError, OSError)
"""What a store call may raise that the worker survives (reconnect, retry)."""


class DoNotRetry(Exception):
    """Raise from a handler to nack its run with ``retryable=False``: settled to ``dead``."""

    retryable = False


class RetryAfter(Exception):
    """Raise from a handler to nack its run and ask that the retry waits at least ``retry_after_s`` seconds."""

    def __init__(self, retry_after_s: float, message: str = "") -> None:
        super().__init__(message or f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Abandoned:
    """Set (once) when the worker gives an attempt up; :meth:`is_set` is safe from any thread.

    Cheaper than a :class:`threading.Event` (one per run at thousands of runs
    a second); there is nothing to wait on: a handler polls it.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        """True once the attempt was given up (its result will be discarded)."""
        return self._set

    def set(self) -> None:
        self._set = True


@dataclass(frozen=True)
class Run:
    """One attempt of a run, as a handler gets it.

    ``run_id`` (``<job_id>.<nominal time in Unix µs>``) is the same on every
    attempt of the run: the key to make a handler idempotent. ``attempt``
    counts from 1. Times are aware UTC datetimes (``scheduled_at`` = nominal
    time plus the job's jitter). ``payload`` is the job's JSON payload
    decoded (None if it has none); ``origin`` is ``schedule``, ``manual`` or
    ``backfill``. ``abandoned`` is set when the worker gives the attempt up
    (lease lost or run canceled, or the stop deadline passed): a sync handler
    may poll it to stop early; its result is discarded either way. Runs
    are hashable (the payload is compared, not hashed).
    """

    run_id: str
    job_id: uuid.UUID
    job_name: str | None
    tenant: str
    queue: str
    nominal_time: datetime
    scheduled_at: datetime
    attempt: int
    payload: Any = field(hash=False)  # a JSON object or list is unhashable; the run key identifies the run
    origin: str
    abandoned: Abandoned = field(default_factory=Abandoned, compare=False, repr=False)


def run_of(c: lifecycle.Claimed, queue: str) -> Run:
    """The :class:`Run` a handler gets for the claimed attempt ``c`` (``queue``: the
    worker's, for a claim that names none). Made by :func:`lifecycle.frozen_of`, not
    ``Run(...)``: a frozen dataclass's ``__init__`` costs ~1.2 µs more per run claimed
    (docs/performance.md, "2026-12-03, afternoon"); tests/unit/test_worker_handler.py
    checks the two agree field by field."""
    key = c.key
    return lifecycle.frozen_of(
        Run,
        {
            "run_id": key.run_id,
            "job_id": key.job_id,
            "job_name": c.job_name,
            "tenant": c.tenant,
            "queue": c.queue or queue,
            "nominal_time": key.nominal_time,
            "scheduled_at": c.scheduled_at,
            "attempt": c.attempt,
            "payload": c.payload,
            "origin": c.origin,
            "abandoned": Abandoned(),
        },
    )


def load_handler(spec: str) -> Callable[[Run], Any]:
    """Import ``package.module:function`` (a dotted attribute path after the colon) and return it.

    The current directory is importable (as with ``python -m``), so a
    ``handlers.py`` next to where the worker starts is ``handlers:handle``.
    Raises :class:`ValidationError` (field ``handler``) if ``spec`` is not of
    that form, the module cannot be imported (the import error named), the
    attribute is missing or not callable.
    """
    module_name, sep, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    names = attr.split(".")
    if (
        not sep
        or not module_name
        or not all(part.isidentifier() for part in module_name.split("."))
        or not all(part.isidentifier() for part in names)
    ):
        raise ValidationError("handler", "must be package.module:function (a Python import path)", spec)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 (any import failure is the user's module's)
        raise ValidationError("handler", f"cannot import module {module_name!r} ({_import_failure(exc)})") from exc
    for part in names:
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValidationError("handler", f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise ValidationError("handler", f"{spec} must be callable (a function taking a Run)")
    return target


def _import_failure(exc: BaseException) -> str:
    """One line saying why an import failed: an ImportError's own message (it
    names the module), any other error as ``Type: first line``, cut to 200 characters."""
    text = _first_line(exc, HANDLER_ERROR_LOG_CHARS)
    if isinstance(exc, ImportError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_async(handler: Callable[..., Any]) -> bool:
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or (call is not None and inspect.iscoroutinefunction(call))


def default_worker_id() -> str:
    """``<hostname>:<pid>``: what ``runs.worker`` shows for this process's attempts."""
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


class _InFlight:
    """A claimed attempt held by the worker until its ack/nack commits or it is abandoned."""

    __slots__ = ("claimed", "run", "run_id", "lease", "running", "task", "result", "nack", "outcome", "flushing")

    def __init__(self, claimed: lifecycle.Claimed, run: Run) -> None:
        self.claimed = claimed
        self.run = run
        self.run_id = run.run_id
        self.lease: tuple[lifecycle.RunKey, uuid.UUID] = (claimed.key, claimed.token)
        self.running = True
        self.task: asyncio.Task | None = None
        self.result: str | None = None  # "ack" | "nack" once queued
        self.nack: lifecycle.Nack | None = None
        self.outcome: str | None = None  # final outcome once known (succeeded|failed|lost|canceled)
        self.flushing = False  # its ack/nack is being sent: that answer, not a heartbeat's, decides


class _Lane:
    """One store connection used by one thread: calls ``fn(conn, ...)`` off the event loop.

    Opens the connection on first use and after any failure (a failed call
    closes it). Raises what the call raises (the caller decides to retry).
    """

    def __init__(self, dsn: str, name: str, statement_timeout_s: float) -> None:
        self._dsn = dsn
        self._name = name
        self._statement_timeout_s = statement_timeout_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"worker-{name}")
        self._conn: psycopg.Connection[Any] | None = None

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self._call(fn, args, kwargs))

    def _call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self._conn is None or self._conn.closed:
            conn = store.connect(
                self._dsn,
                application_name=f"scheduler-worker-{self._name}",
                statement_timeout_s=self._statement_timeout_s,
                lock_timeout_s=self._statement_timeout_s / 2,
                idle_in_transaction_timeout_s=self._statement_timeout_s,
                connect_timeout_s=5.0,
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
                tcp_user_timeout=int(self._statement_timeout_s * 2000),
            )
            try:  # each claim, probe, heartbeat, ack or nack is then one round trip
                store.make_probe_session(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        try:
            return fn(self._conn, *args, **kwargs)
        except BaseException:
            self._close()
            raise

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        """Close the connection (on the lane's thread) and stop the thread; never raises."""
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._close)
        self._executor.shutdown(wait=False)


class TenantTurns:
    """The order in which a worker's claim rounds ask its tenants, and each tenant's idle backoff.

    ``tenants``: the worker's tenants (ordered, distinct); ``clock``:
    monotonic seconds (injected in tests). A round (:meth:`due`) asks the
    tenants with runs (a probe's answer) or, without a probe (the HTTP
    API's one tenant), those not backing off, starting after the last one
    that got runs (:meth:`record`) in an earlier round: round robin among
    tenants with work, so one with a backlog (the big tenant of a herd)
    fills a round at most once before every other tenant with runs had its
    turn. A tenant whose claim came back empty (or the probe found empty)
    waits :data:`IDLE_POLL_FRACTION` of the time since it last got runs
    (since the worker started, if never), between ``poll_min_s`` and
    ``poll_max_s``; one that got runs is asked again in the next round.

    Why: the earlier rule (each round starting one tenant after the previous
    round's start, asking every tenant with a claim) let a big tenant fill
    nearly every round, so a small tenant behind the start waited for the
    rotation to come round, one round per tenant: small tenants' dispatch
    lag p99 14.8 s in the 300,000-run herd with 51 tenants
    (docs/performance.md, "2026-12-02, noon"); and a round that started at a
    drained tenant asked every drained tenant after it, an empty claim each.
    """

    def __init__(
        self,
        tenants: Sequence[str | None],
        poll_min_s: float = POLL_MIN_S,
        poll_max_s: float = POLL_MAX_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tenants = tuple(tenants)
        self._poll_min_s, self._poll_max_s, self._clock = poll_min_s, poll_max_s, clock
        self._next = 0  # index of the tenant the next round starts with
        self._not_before = [0.0] * len(self.tenants)
        self._last_runs = [clock()] * len(self.tenants)  # when each tenant last got runs
        self._hot = (0.0, 0.0)  # [from, until): an empty claim then waits poll_min_s (see expect)

    def due(self, ready: Collection[str | None] | None = None) -> list[int]:
        """Indexes of the tenants to ask this round, in order.

        Without ``ready``: those not backing off. With ``ready`` (the tenants
        a probe found runs for, :meth:`StoreTransport.ready`): those, backoff
        or not; the others are recorded empty (their backoff is the idle
        wait of :meth:`wait_s`)."""
        now, count, start = self._clock(), len(self.tenants), self._next
        order = [(start + i) % count for i in range(count)]
        if ready is None:
            return [i for i in order if self._not_before[i] <= now]
        for i in order:
            if self.tenants[i] not in ready:
                self.record(i, 0)
        return [i for i in order if self.tenants[i] in ready]

    def record(self, index: int, claimed: int) -> None:
        """Tenant ``index`` was asked and ``claimed`` runs came back."""
        now = self._clock()
        if claimed:
            self._last_runs[index] = now
            self._not_before[index] = 0.0
            self._next = (index + 1) % len(self.tenants)
        elif self._hot[0] <= now < self._hot[1]:
            self._not_before[index] = now + self._poll_min_s
        else:
            idle = IDLE_POLL_FRACTION * (now - self._last_runs[index])
            self._not_before[index] = now + min(self._poll_max_s, max(self._poll_min_s, idle))

    def expect(self, in_s: float, window_s: float = DUE_WINDOW_S) -> None:
        """A timer of these tenants falls due in ``in_s`` seconds (≤ 0: now): every tenant
        may be asked from then on (a backoff ending sooner stands), and until ``window_s``
        after it an empty claim waits only ``poll_min_s`` instead of the idle backoff."""
        now = self._clock()
        at = now + max(0.0, in_s)
        self._not_before = [min(not_before, at) for not_before in self._not_before]
        start, until = self._hot
        if start <= now < until:  # in a window already: it lasts until this one's end too
            self._hot = (start, max(until, at + window_s))
        else:
            self._hot = (at, at + window_s)

    def wait_s(self) -> float:
        """Seconds until some tenant may be asked again (0 if one may now)."""
        return max(0.0, min(self._not_before) - self._clock())


_CANCELED = object()
"""What :func:`_next_due_or_canceled` returns for a probe canceled past its budget."""


def _next_due_or_canceled(conn: psycopg.Connection, *, tenants: Sequence[str], queue: str) -> float | None | object:
    """:func:`~scheduler.delivery.lifecycle.next_due`, or :data:`_CANCELED` if it was canceled:
    returned, not raised, so the lane keeps its connection (its transaction was rolled back)."""
    try:
        return lifecycle.next_due(conn, tenants=tenants, queue=queue)
    except psycopg.errors.QueryCanceled:
        return _CANCELED


class StoreTransport:
    """The worker's way to the store: :mod:`~scheduler.delivery.lifecycle` calls on three
    connections (claim, ack/nack, heartbeat), each used by its own thread (:class:`_Lane`).

    Every method is a coroutine returning what the lifecycle function returns;
    ``errors`` are the exceptions the worker survives (reconnect after a backoff).
    :class:`~scheduler.delivery.api_client.ApiTransport` is the same surface over the HTTP API.
    """

    errors: tuple[type[BaseException], ...] = STORE_ERRORS

    def __init__(self, dsn: str, statement_timeout_s: float) -> None:
        self._claim_lane = _Lane(dsn, "claim", statement_timeout_s)
        self._ack_lane = _Lane(dsn, "ack", statement_timeout_s)
        self._hb_lane = _Lane(dsn, "heartbeat", statement_timeout_s)

    async def claim(
        self, *, tenant: str | None, queue: str, worker: str, limit: int, lease_s: float
    ) -> list[lifecycle.Claimed]:
        """:func:`~scheduler.delivery.lifecycle.claim` of ``tenant``'s ``queue``."""
        assert tenant is not None
        return await self._claim_lane.call(
            lifecycle.claim, tenant=tenant, queue=queue, worker=worker, limit=limit, lease_s=lease_s
        )

    async def ready(self, *, tenants: Sequence[str], queue: str) -> set[str]:
        """:func:`~scheduler.delivery.lifecycle.tenants_with_runs`: those of ``tenants`` with runs to claim."""
        return await self._claim_lane.call(lifecycle.tenants_with_runs, tenants=tenants, queue=queue)

    async def next_due(self, *, tenants: Sequence[str], queue: str) -> float | None:
        """:func:`~scheduler.delivery.lifecycle.next_due`: seconds until the next timer of
        ``tenants``' ``queue`` falls due, or None. Raises StoreError (SQLSTATE 57014) if the
        probe was canceled past its budget; the claim connection is kept (rolled back, sound),
        where any other failure closes it."""
        answer = await self._claim_lane.call(_next_due_or_canceled, tenants=tenants, queue=queue)
        if answer is _CANCELED:
            raise StoreError("next_due: canceled past its budget", "57014")
        return cast(float | None, answer)

    async def unknown(self, tenants: Sequence[str]) -> list[str]:
        """:func:`~scheduler.delivery.lifecycle.unknown_tenants`: those of ``tenants`` the store has not."""
        return await self._claim_lane.call(lifecycle.unknown_tenants, tenants)

    async def heartbeat(self, leases: list[tuple[lifecycle.RunKey, uuid.UUID]], lease_s: float) -> dict[str, str]:
        """:func:`~scheduler.delivery.lifecycle.heartbeat`: run id → answer."""
        return await self._hb_lane.call(lifecycle.heartbeat, leases, lease_s)

    async def ack(self, leases: list[tuple[lifecycle.RunKey, uuid.UUID]]) -> dict[str, str]:
        """:func:`~scheduler.delivery.lifecycle.ack`: run id → answer."""
        return await self._ack_lane.call(lifecycle.ack, leases)

    async def nack(self, fails: list[lifecycle.Nack]) -> dict[str, str]:
        """:func:`~scheduler.delivery.lifecycle.nack`: run id → answer."""
        return await self._ack_lane.call(lifecycle.nack, fails)

    async def close(self) -> None:
        """Close the connections; never raises."""
        for lane in (self._claim_lane, self._ack_lane, self._hb_lane):
            lane.close()


class _Completions:
    """Results of sync handlers, handed from their threads to the loop in batches.

    :meth:`put` (any thread) appends ``(attempt, error)`` and wakes the loop only if no
    wake-up is pending: one ``call_soon_threadsafe`` (a write to the loop's self-pipe)
    per batch of results, not per run. ``deliver`` runs on the loop for each result,
    in the order put; one that raises is reported to the loop's exception handler (as
    a failed ``call_soon_threadsafe`` callback was) and the batch goes on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[Any, BaseException | None], None]) -> None:
        self._loop = loop
        self._deliver = deliver
        self._items: collections.deque[tuple[Any, BaseException | None]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, attempt: Any, error: BaseException | None) -> None:
        with self._lock:
            self._items.append((attempt, error))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: the worker is gone
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
            items, self._items = self._items, collections.deque()
        for attempt, error in items:
            try:
                self._deliver(attempt, error)
            except Exception as exc:  # one result's failure must not drop the rest of the batch
                self._loop.call_exception_handler({"message": "a handler result was not recorded", "exception": exc})


class _Threads:
    """``n`` daemon threads running submitted callables (a sync handler that never
    returns must not keep the process from exiting, as ThreadPoolExecutor's would)."""

    def __init__(self, n: int) -> None:
        self._queue: queue_mod.SimpleQueue[Callable[[], None] | None] = queue_mod.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"worker-handler-{i}", daemon=True) for i in range(n)
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        while (work := self._queue.get()) is not None:
            work()

    def submit(self, work: Callable[[], None]) -> None:
        self._queue.put(work)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


class Worker:
    """Claim runs of ``(tenant, queue)`` and hand each to ``handler`` (see the module doc).

    ``dsn``: the store the worker claims from; or None with ``api_url`` and
    ``api_key`` (a ``tenant`` or ``worker`` key's token): the worker claims,
    heartbeats, acks and nacks through the HTTP API (docs/api.md, "Runs and
    workers") and never needs database credentials; the tenant is then the
    key's (``tenant`` must be None). ``tenant``: one tenant, or a sequence of
    distinct tenants served in turn (at most :data:`MAX_TENANTS`).
    ``handler``: a callable taking a :class:`Run` (sync or ``async def``).
    ``concurrency``: handlers running at once (1–10,000); ``lease_s``: each
    attempt's lease (1–3,600 s; heartbeats every third of it); ``batch``:
    most runs claimed, and acks/nacks sent, per statement (default
    ``min(max(concurrency, 100), 1000)``, 1–1,000; heartbeats go in chunks
    of 1,000); ``stop_timeout_s``: the grace of
    in-flight handlers after a stop (≥ 0). ``worker_id`` is written to
    ``runs.worker`` (default :func:`default_worker_id`); ``metrics`` a
    :class:`~scheduler.metrics.WorkerMetrics` (default: a new one).
    Raises :class:`ValidationError` naming the field for a bad argument.
    Not reusable: :meth:`run` once.
    """

    def __init__(
        self,
        dsn: str | None,
        tenant: str | Sequence[str] | None,
        queue: str = "default",
        handler: Callable[[Run], Any] | None = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease_s: float = lifecycle.DEFAULT_LEASE_S,
        batch: int | None = None,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
        poll_min_s: float = POLL_MIN_S,
        poll_max_s: float = POLL_MAX_S,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        tenants: tuple[str | None, ...]
        if api_url is not None:
            if dsn is not None:
                raise ValidationError("api_url", "give either a store DSN or an API URL, not both")
            if tenant is not None:
                raise ValidationError("tenant", "over the API the tenant is the key's: give none")
            if not api_key:
                raise ValidationError("api_key", "an API URL needs a key (SCHEDULER_API_KEY)")
            from scheduler.delivery.api_client import validate_api_url

            validate_api_url(api_url)
            tenants = (None,)
        else:
            if dsn is None:
                raise ValidationError("dsn", "give a store DSN or an API URL")
            if tenant is None:
                raise ValidationError("tenant", f"give 1 to {MAX_TENANTS} distinct tenants")
            tenants = (tenant,) if isinstance(tenant, str) else tuple(tenant)
            if not 1 <= len(tenants) <= MAX_TENANTS:
                raise ValidationError("tenant", f"give 1 to {MAX_TENANTS} distinct tenants", len(tenants))
            twice = next((name for i, name in enumerate(tenants) if name in tenants[:i]), None)
            if twice is not None:
                raise ValidationError("tenant", "give each tenant once; this one is repeated", twice)
            for name in tenants:
                if isinstance(name, str) and "," in name:  # SCHEDULER_TENANT="a,b": the trial's guess
                    raise ValidationError(
                        "tenant",
                        "one name each: repeat --tenant, or separate the names in SCHEDULER_TENANT with spaces"
                        " (a comma is not part of a tenant name)",
                        name,
                    )
                validate_tenant(name)
        validate_queue(queue)
        if handler is None or not callable(handler):
            raise ValidationError("handler", "must be callable (a function taking a Run)")
        _check_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
        batch = min(max(concurrency, 100), MAX_BATCH) if batch is None else batch
        _check_int("batch", batch, 1, MAX_BATCH)
        _check_seconds("lease_s", lease_s, MIN_LEASE_S, MAX_LEASE_S)
        _check_seconds("stop_timeout_s", stop_timeout_s, 0.0, 86_400.0)
        self.dsn, self.tenants, self.queue, self.handler = dsn, tenants, queue, handler
        self.api_url, self.api_key = api_url, api_key
        self.tenant = tenants[0]
        self._named = [t for t in tenants if t is not None]  # the tenants by name (none over the API)
        self._turns = TenantTurns(tenants, poll_min_s, poll_max_s)
        self._due_probe_after = 0.0  # monotonic s: no next-due probe before (DUE_PROBE_HOLD_S)
        self.concurrency, self.batch = concurrency, batch
        self.lease_s, self.stop_timeout_s = float(lease_s), float(stop_timeout_s)
        self.worker_id = worker_id or default_worker_id()
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self._outcomes = {o: self.metrics.attempts.labels(outcome=o) for o in WORKER_OUTCOMES}
        self._poll_min_s, self._poll_max_s, self._flush_interval_s = poll_min_s, poll_max_s, flush_interval_s
        self._async = _is_async(handler)
        self._inflight: dict[str, _InFlight] = {}
        self._running = 0
        self._acks: list[_InFlight] = []
        self._sending = 0  # ack/nack batches sent and not answered yet
        self._nacks: list[_InFlight] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = threading.Event()
        self._stop_event: asyncio.Event | None = None
        self._hurry = False
        self.stopped_cleanly: bool | None = None

    # ------------------------------------------------------------ control

    def stop(self) -> None:
        """Begin a graceful stop (see the module doc); safe from any thread or a signal handler. Idempotent."""
        self._stop_requested.set()
        loop = self._loop
        if loop is not None and self._stop_event is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_stop)

    def _on_stop(self) -> None:
        assert self._stop_event is not None
        self._stop_event.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for."""
        return self._stop_requested.is_set()

    def run(self) -> None:
        """Serve until :meth:`stop`, then drain as the module doc says and return.

        Store errors are retried, never raised. A worker loop that fails
        otherwise (a bug) stops the worker gracefully, and its exception is
        raised once the drain is over.
        """
        asyncio.run(self._main())

    def run_until_signalled(self) -> None:
        """:meth:`run`, stopping gracefully on SIGTERM or SIGINT (main thread only); a second signal
        cuts the grace short (in-flight runs are nacked at once). Owns the process: it also
        freezes the start-up heap out of the garbage collector's reach
        (:func:`scheduler.runtime.freeze_startup_heap`)."""
        previous: dict[int, Any] = {}

        def handler(signum: int, frame: Any) -> None:
            log.event("signal_received", worker=self.worker_id, signal=signal.Signals(signum).name)
            if self.stopping:
                self._hurry = True
            self.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
        runtime.freeze_startup_heap()
        try:
            self.run()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    # ------------------------------------------------------------ main

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Event()  # a handler finished or an ack flushed: maybe claim
        self._flush_now = asyncio.Event()
        self._done = asyncio.Event()  # every loop but the heartbeat's has ended
        statement_s = max(1.0, min(5.0, self.lease_s / 3))
        if self.api_url is not None:
            from scheduler.delivery.api_client import ApiTransport

            assert self.api_key is not None
            self._transport: Any = ApiTransport(self.api_url, self.api_key, timeout_s=statement_s * 2)
        else:
            assert self.dsn is not None
            self._transport = StoreTransport(self.dsn, statement_s)
        self._errors = self._transport.errors
        self._threads = None if self._async else _Threads(self.concurrency)
        self._done_by_threads = _Completions(asyncio.get_running_loop(), self._finished)
        if self._stop_requested.is_set():
            self._on_stop()
        named = self._named
        log.event(
            "worker_started",
            worker=self.worker_id,
            tenants=log.cut(",".join(named), LOGGED_TENANTS_CHARS) or "(the API key's)",
            tenant_count=len(self.tenants),  # over the API: the key's tenant (None), one
            queue=self.queue,
            concurrency=self.concurrency,
            lease_s=self.lease_s,
        )
        await self._warn_unknown_tenants(named)
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        flusher = asyncio.create_task(self._flush_loop())
        claimer = asyncio.create_task(self._claim_loop())
        loops = (claimer, flusher, heartbeat)
        failure: BaseException | None = None
        stop_wait = asyncio.create_task(self._stop_event.wait())
        try:
            # A loop that ends before a stop has failed (a bug, not a store error: those are
            # retried): stop gracefully rather than hold runs without claiming or acking.
            await asyncio.wait({stop_wait, *loops}, return_when=asyncio.FIRST_COMPLETED)
            for task in loops:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    failure = task.exception()
                    log.event("worker_loop_failed", logging.ERROR, worker=self.worker_id, error=_error_text(failure))
                    self._on_stop()
                    break
            deadline = time.monotonic() + self.stop_timeout_s
            log.event("worker_stopping", worker=self.worker_id, in_flight=self._running, grace_s=self.stop_timeout_s)
            await asyncio.wait({claimer})
            while self._running and time.monotonic() < deadline and not self._hurry:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(0.1, max(0.0, deadline - time.monotonic())))
            late = [f for f in self._inflight.values() if f.running and f.result is None]
            for f in late:
                log.event("run_nacked_at_stop", logging.WARNING, worker=self.worker_id, run_id=f.run_id)
                self._queue_nack(f, lifecycle.Nack(f.run_id, f.claimed.token, STOP_ERROR, True, None))
                f.run.abandoned.set()
                if f.task is not None:
                    f.task.cancel()
            self._flush_now.set()
            flush_deadline = time.monotonic() + FINAL_FLUSH_S
            # A batch already sent counts as unflushed until its answer is in: cancelling
            # its request could drop an ack the server never got (the run then waits
            # out its lease and is delivered again).
            while (self._acks or self._nacks or self._sending) and time.monotonic() < flush_deadline:
                self._flush_now.set()
                await asyncio.sleep(0.01)
            self.stopped_cleanly = not (self._acks or self._nacks or self._sending)
            if not self.stopped_cleanly:
                log.event(
                    "worker_unflushed",
                    logging.WARNING,
                    worker=self.worker_id,
                    acks=len(self._acks),
                    nacks=len(self._nacks),
                    note="their leases expire and the store settles them",
                )
        finally:
            self._done.set()
            self._flush_now.set()
            for task in (stop_wait, *loops):
                task.cancel()
            for task in (stop_wait, *loops):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for f in list(self._inflight.values()):
                if f.task is not None and not f.task.done():
                    f.task.cancel()
            if self._threads is not None:
                self._threads.close()
            await self._transport.close()
            self.metrics.inflight.set(0)
            log.event("worker_stopped", worker=self.worker_id, clean=self.stopped_cleanly)
        if failure is not None:
            raise failure

    async def _warn_unknown_tenants(self, named: list[str]) -> None:
        """Log ``worker_unknown_tenants`` (WARNING) if the store has no tenant of some of
        ``named`` (a typo serves nothing, silently); a store error here is not the worker's
        end (the claim loop meets and reports it)."""
        if not named or not isinstance(self._transport, StoreTransport):
            return
        try:
            unknown = await self._transport.unknown(named)
        except self._errors:
            return
        if unknown:
            log.event(
                "worker_unknown_tenants",
                logging.WARNING,
                worker=self.worker_id,
                tenants=log.cut(",".join(unknown), LOGGED_TENANTS_CHARS),
                count=len(unknown),
                note="no such tenant in the store: nothing to claim until it is created",
            )

    async def _sleep(self, seconds: float, until: asyncio.Event) -> None:
        """Sleep ``seconds`` or until ``until`` is set."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(until.wait(), seconds)

    def _store_failed(self, what: str, exc: BaseException, backoff: float) -> float:
        self.metrics.store_errors.labels(operation=what).inc()
        log.event(
            "worker_store_error",
            logging.WARNING,
            worker=self.worker_id,
            operation=what,
            error=_error_text(exc),
            retry_in_s=round(backoff, 3),
        )
        return min(STORE_BACKOFF_MAX_S, backoff * 2)

    # ------------------------------------------------------------ claim

    async def _claim_loop(self) -> None:
        assert self._stop_event is not None
        backoff = STORE_BACKOFF_MIN_S
        coalesced = False
        while not self._stop_event.is_set():
            free = self.concurrency - self._running
            if free <= 0 or len(self._acks) + len(self._nacks) >= 4 * self.batch:
                self._wake.clear()
                await self._sleep(1.0, self._wake)
                continue
            if 0 < self._running and free < self.concurrency // 2 and not coalesced:
                # Under load slots come back one by one: wait a moment for more, so a
                # claim takes many runs in one statement rather than one each.
                coalesced = True
                await self._sleep(self._flush_interval_s, self._stop_event)
                continue
            coalesced = False
            limit = min(free, self.batch)
            try:
                claimed = await self._claim_round(limit)
            except self._errors as exc:
                wait = backoff
                backoff = self._store_failed("claim", exc, backoff)
                await self._sleep(wait, self._stop_event)
                continue
            backoff = STORE_BACKOFF_MIN_S
            if claimed:
                if claimed < limit:
                    await self._sleep(self._poll_min_s, self._stop_event)
            else:  # every tenant came back empty or is backing off: until one may be asked
                await self._expect_due()
                await self._sleep(max(self._turns.wait_s(), 0.001), self._stop_event)

    async def _expect_due(self) -> None:
        """Before an idle wait longer than :data:`DUE_PROBE_MIN_S`, ask the store when the next
        timer of the worker's tenants and queue falls due (one index walk per tenant) and wake
        :data:`DUE_SETTLE_S` after it if that is sooner (:meth:`TenantTurns.expect`): a worker idle
        for a minute is at its 1 s backoff, and claimed a minute's first runs up to a second
        late. Over the HTTP API (no such call) the backoff stands; so it does after a store
        error here (the next claim meets and reports it), and the question is not asked again
        for :data:`DUE_PROBE_HOLD_S`; after an answer, not before :data:`DUE_PROBE_COST_FACTOR`
        times as long as it took."""
        if self._turns.wait_s() <= DUE_PROBE_MIN_S or not isinstance(self._transport, StoreTransport):
            return
        started = time.monotonic()
        if started < self._due_probe_after:
            return
        try:
            due_in_s = await self._transport.next_due(tenants=self._named, queue=self.queue)
        except self._errors:
            self._due_probe_after = time.monotonic() + DUE_PROBE_HOLD_S
            return
        ended = time.monotonic()
        self._due_probe_after = ended + DUE_PROBE_COST_FACTOR * (ended - started)
        if due_in_s is not None:
            self._turns.expect(due_in_s + DUE_SETTLE_S)

    async def _claim_round(self, limit: int) -> int:
        """Claim up to ``limit`` runs, asking the tenants in turn (:class:`TenantTurns`),
        and start them; return how many. Raises what the store raises (runs claimed
        before the failure are started)."""
        total = 0
        turns = self._turns
        ready = None
        if len(turns.tenants) > 1 and isinstance(self._transport, StoreTransport):
            ready = await self._transport.ready(tenants=self.tenants, queue=self.queue)  # type: ignore[arg-type]
        for index in turns.due(ready):
            if total >= limit or self._stop_event is None or self._stop_event.is_set():
                break
            claimed = await self._transport.claim(
                tenant=turns.tenants[index],
                queue=self.queue,
                worker=self.worker_id,
                limit=limit - total,
                lease_s=self.lease_s,
            )
            turns.record(index, len(claimed))
            if claimed:
                self._record_claims(claimed)
                for c in claimed:
                    self._start(c)
                self.metrics.inflight.set(len(self._inflight))
                total += len(claimed)
        return total

    def _record_claims(self, claimed: list[lifecycle.Claimed]) -> None:
        lags = [(c.claimed_at - c.scheduled_at).total_seconds() for c in claimed if c.attempt == 1]
        if lags:
            self.metrics.dispatch_lag.observe_many(lags)
        self.metrics.claimed.inc(len(claimed))

    def _start(self, c: lifecycle.Claimed) -> None:
        run = run_of(c, self.queue)
        f = _InFlight(c, run)
        self._inflight[f.run_id] = f
        self._running += 1
        if self._async:
            f.task = asyncio.get_running_loop().create_task(self._run_async(f))
            return
        assert self._threads is not None
        handler = self.handler
        done = self._done_by_threads

        def work() -> None:
            error: BaseException | None = None
            try:
                handler(run)
            except BaseException as exc:  # noqa: BLE001 (every failure of the handler nacks)
                error = exc
            done.put(f, error)

        self._threads.submit(work)

    async def _run_async(self, f: _InFlight) -> None:
        error: BaseException | None = None
        try:
            await self.handler(f.run)
        except asyncio.CancelledError as exc:
            if f.run.abandoned.is_set():  # the worker gave the run up and cancelled the handler
                self._finished(f, None)
                return
            if self._done.is_set():  # the worker's own end: the run is left to its lease
                raise
            # The handler ended cancelled on its own (it raised CancelledError, cancelled its
            # own task, awaited a cancelled future): a failed attempt like any other error.
            # Re-raised, it left the run leased and its slot taken for the worker's life.
            error = exc
        except BaseException as exc:  # noqa: BLE001 (every failure of the handler nacks)
            error = exc
        self._finished(f, error)

    # ------------------------------------------------------------ results

    def _finished(self, f: _InFlight, error: BaseException | None) -> None:
        """A handler returned (``error`` None) or raised: queue the ack or nack (on the loop)."""
        f.running = False
        self._running -= 1
        self._wake.set()
        if f.run.abandoned.is_set() or f.result is not None:
            log.event(
                "handler_result_discarded",
                logging.INFO,
                worker=self.worker_id,
                run_id=f.run_id,
                why=f.outcome or "nacked at the stop deadline",
            )
            return
        if error is None:
            f.result = "ack"
            self._acks.append(f)
            if len(self._acks) >= self.batch:
                self._flush_now.set()
        else:
            log.event(
                "handler_failed",
                logging.WARNING,
                worker=self.worker_id,
                run_id=f.run_id,
                attempt=f.run.attempt,
                error_type=type(error).__name__,
                error=_first_line(error, HANDLER_ERROR_LOG_CHARS),
            )
            self._queue_nack(f, _nack_of(f, error))

    def _queue_nack(self, f: _InFlight, nack: lifecycle.Nack) -> None:
        f.result, f.nack = "nack", nack
        self._nacks.append(f)
        if len(self._nacks) >= self.batch:
            self._flush_now.set()

    async def _flush_loop(self) -> None:
        backoff = STORE_BACKOFF_MIN_S
        while not self._done.is_set():
            if not (self._acks or self._nacks):
                self._flush_now.clear()
                await self._sleep(self._flush_interval_s, self._flush_now)
                if not (self._acks or self._nacks):
                    continue
            elif len(self._acks) < self.batch and len(self._nacks) < self.batch and not self._flush_now.is_set():
                await self._sleep(self._flush_interval_s, self._flush_now)
            self._flush_now.clear()
            try:
                await self._flush("ack")
                await self._flush("nack")
                backoff = STORE_BACKOFF_MIN_S
            except self._errors as exc:
                wait = backoff
                backoff = self._store_failed("ack", exc, backoff)
                await self._sleep(wait, self._done)

    async def _flush(self, kind: str) -> None:
        pending = self._acks if kind == "ack" else self._nacks
        batch = [f for f in pending[: self.batch] if self._inflight.get(f.run_id) is f]
        del pending[: self.batch]
        if not batch:
            return
        for f in batch:
            f.flushing = True
        self._sending += 1
        try:
            if kind == "ack":
                answers = await self._transport.ack([f.lease for f in batch])
            else:
                answers = await self._transport.nack([f.nack for f in batch])
        except BaseException:
            for f in batch:
                f.flushing = False
            pending[:0] = [f for f in batch if self._inflight.get(f.run_id) is f]
            raise
        finally:
            self._sending -= 1
        done = "succeeded" if kind == "ack" else "failed"
        counts: collections.Counter[str] = collections.Counter()
        for f in batch:
            answer = answers.get(f.run_id, "lost")
            outcome = answer if answer in ("succeeded", "failed", "canceled") else "lost"
            if outcome != done:
                log.event(f"{kind}_refused", worker=self.worker_id, run_id=f.run_id, answer=answer)
            self._settle(f, outcome, count=False)
            counts[outcome] += 1
        for outcome, n in counts.items():  # one increment per outcome and batch, not per run
            self._outcomes[outcome].inc(n)
        self.metrics.inflight.set(len(self._inflight))
        self._wake.set()

    def _settle(self, f: _InFlight, outcome: str, count: bool = True) -> None:
        """The attempt is over for this worker: stop heartbeating it; with ``count``, count it by
        ``outcome`` and update the in-flight gauge (a batch does both once, itself)."""
        f.outcome = outcome
        if self._inflight.get(f.run_id) is f:
            del self._inflight[f.run_id]
        if count:
            self._outcomes[outcome].inc()
            self.metrics.inflight.set(len(self._inflight))

    def _abandon(self, f: _InFlight, outcome: str, why: str) -> None:
        if self._inflight.get(f.run_id) is not f:
            return
        f.run.abandoned.set()
        log.event(
            "run_abandoned",
            logging.WARNING,
            worker=self.worker_id,
            run_id=f.run_id,
            attempt=f.claimed.attempt,
            why=why,
            handler_running=f.running,
            note="" if not f.running or self._async else "a sync handler cannot be stopped: it runs on",
        )
        if f.task is not None and not f.task.done():
            f.task.cancel()
        self._settle(f, outcome)

    # ------------------------------------------------------------ heartbeat

    async def _heartbeat_loop(self) -> None:
        interval = self.lease_s / 3
        backoff = STORE_BACKOFF_MIN_S
        wait = interval
        while True:
            await asyncio.sleep(wait)
            wait = interval
            held = list(self._inflight.values())
            if not held:
                continue
            try:
                answers: dict[str, str] = {}
                for i in range(0, len(held), MAX_BATCH):
                    chunk = [f.lease for f in held[i : i + MAX_BATCH]]
                    answers.update(await self._transport.heartbeat(chunk, self.lease_s))
            except self._errors as exc:
                wait = min(backoff, interval)
                backoff = self._store_failed("heartbeat", exc, backoff)
                continue
            backoff = STORE_BACKOFF_MIN_S
            for f in held:
                answer = answers.get(f.run_id, "lost")
                if f.flushing:
                    continue  # its ack/nack's answer settles it
                if answer == "leased":
                    continue
                if answer == "canceled":
                    self._abandon(f, "canceled", "the run was canceled")
                else:
                    self._abandon(f, "lost", f"heartbeat answered {answer!r}: another attempt holds the run")


STORE_ERROR_LOG_CHARS = 300
"""A failed store call's (or loop's) error is logged cut to this many characters."""


def _error_text(error: BaseException, limit: int = STORE_ERROR_LOG_CHARS) -> str:
    """``<type>: <message>`` as plain text for a log field (never a repr: the formatter
    quotes it once), line breaks escaped, cut to ``limit`` characters (an ellipsis marks a cut)."""
    return log.cut(log.one_line(f"{type(error).__name__}: {error}"), limit)


def _first_line(error: BaseException, limit: int) -> str:
    """The first line of ``str(error)``, secrets redacted, cut to ``limit`` characters (an ellipsis marks a cut)."""
    lines = log.redact(str(error)).strip().splitlines()
    return log.cut(lines[0] if lines else "", limit)


def _nack_of(f: _InFlight, error: BaseException) -> lifecycle.Nack:
    """The nack of a handler's ``error``: retryable unless it says otherwise; its ``retry_after_s`` if valid."""
    retryable = bool(getattr(error, "retryable", True))
    after = getattr(error, "retry_after_s", None)
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not math.isfinite(after) or after < 0:
        after = None
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    error_text = log.redact(text)[:ERROR_MAX_CHARS]
    return lifecycle.Nack(f.run_id, f.claimed.token, error_text, retryable, None if after is None else float(after))


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValidationError(name, f"must be a whole number from {lo} to {hi}", value)


def _check_seconds(name: str, value: Any, lo: float, hi: float) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not lo <= value <= hi:
        raise ValidationError(name, f"must be a number of seconds from {lo:g} to {hi:g}", value)
