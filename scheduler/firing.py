"""The firing loop: once a second, one fenced, set-based transaction (DESIGN.md §4).

A tick
------
1. Take the partitions this node may fire now (:meth:`LeaseTable.firable`:
   held, not draining, not within the safety margin of the lease deadline).
2. Split the tick's budget (pacing: ``max_rate_per_s × tick_interval_s``)
   between tenants with :class:`scheduler.fairness.DeficitRoundRobin`
   (weights and rate caps are rows of ``tenants``), and read due timers of
   all firable partitions in one query (``select_due_jobs``): per tenant,
   oldest due first, up to its quota; budget left by tenants with little due
   work goes to the others in a second pass, read once the first pass's
   chunks have committed (fair shares first).
3. Plan each job in Python (:func:`scheduler.planner.plan_job`): runs to
   fire, slots to skip under its misfire policy, its next slot. Next-fire
   computations are memoized per (schedule, instant), and jitter-free plans
   per (schedule, slot, policy, now): a herd of 300,000 jobs sharing a few
   expressions costs a few dozen schedule computations, and a chunk sends
   each distinct plan once.
4. Commit with ``fire_runs``: one statement that locks the fenced partition
   rows FOR SHARE (owner and epoch still ours), advances the jobs of fenced
   partitions whose revision is unchanged, records skips, and inserts the
   runs (the runs primary key makes a duplicate impossible). A job travels
   as four scalars and a plan number; every per-row lookup in the statement
   is an array subscript, so its cost is linear whatever plan the store
   picks. Large ticks are split into chunks of :data:`CHUNK_JOBS` jobs, each
   its own transaction, pipelined over :data:`WRITE_LANES` connections so
   the store executes chunks while the node plans the next. The statement
   is never prepared (:data:`FIRE_RUNS_PREPARE`).

Why a stale owner commits nothing: see scheduler/lease.py. Partitions the
statement did not fence are counted (``scheduler_firing_fence_rejections_total``),
logged as ``fence_rejected`` and dropped from the lease table.

Failure: chunks are independent transactions. A lost connection or a
statement error ends the tick: chunks already committed stay committed, the
failed one is rolled back by the store, and its jobs stay due for the next
tick. All sessions are then closed and reopened, never reused after an
error. On a retryable SQLSTATE (40001, 40P01) the chunks that did not commit
are re-sent at once on a fresh session, each retried whole with backoff.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from collections import Counter

import psycopg
from psycopg.rows import tuple_row

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.errors import SchedulerError, ValidationError
from scheduler.fairness import DeficitRoundRobin, TokenBucket, node_share_of_cap
from scheduler.lease import LeaseTable
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.planner import plan_job
from scheduler.settings import Settings
from scheduler.spec import ScheduleCache

CHUNK_JOBS = 5_000
"""Jobs per firing statement (and transaction): small enough that the first
chunk of a herd commits within tens of milliseconds and each statement stays
far below statement_timeout; large enough to amortise the round trip."""

WRITE_LANES = 2
"""Write connections a tick's chunks are spread over, round robin, each in
pipeline mode, while the node holds more than half of the partitions (one
otherwise, so a fleet opens about the same number of firing writers
whatever its size). Measured on the 2-core box (docs/performance.md): the
store's share of a run (~25 µs of backend CPU) is the longest stage, so a
lone node with one write backend left the second core idle (300,000-run
herd: 9.4-10 s with one, 5.6-6.9 s with two; three gained nothing), while
four nodes with two each oversubscribed it (37-43 k runs/s against 47 k
with one each). A node's chunks touch disjoint jobs and runs, so lanes never
block each other; at SERIALIZABLE on PostgreSQL, whose predicate locks are
page-grained, two lanes' chunks can still fail with 40001, which takes the
retry path (the tick ends after re-sending what did not commit)."""

FIRE_RUNS_PREPARE = False
"""Never prepare ``fire_runs`` server-side. psycopg prepares a statement on
its 5th execution, and PostgreSQL then switches to a generic plan, whose
per-row cost for this statement was measured at twice the custom plan's
(the herd's second and later ticks ran at half speed). Planning it costs
~1 ms per 5,000-job chunk."""

STREAM_ROWS = 1_000
"""Rows per network chunk when streaming the due scan."""

# Column positions in a ``select_due_jobs`` row (tuples: a dict per row costs
# more than the rest of the per-row work in a herd).
_PARTITION, _JOB_ID, _TENANT = 0, 1, 2
_SCHEDULE = slice(3, 10)  # kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at
_MISFIRE, _CATCHUP, _GRACE, _JITTER_S = 10, 11, 12, 13
_NEXT_NOMINAL, _NEXT_DUE, _REVISION, _STORE_NOW = 14, 15, 16, 17


TICK_PHASE_S = 0.02
"""Ticks start this long after each wall-clock second, when second-aligned
timers have just become due."""


@dataclasses.dataclass
class TickResult:
    """Outcome of one tick (counts; ``lags_s`` are fired_at − scheduled, store clock)."""

    due_read: int = 0
    fired: int = 0
    skipped_ranges: int = 0
    fence_rejected: list[int] = dataclasses.field(default_factory=list)
    stale_jobs: int = 0
    lags_s: list[float] = dataclasses.field(default_factory=list)
    budget_exhausted: bool = False


def _array_literal(values: list) -> str:
    """``values`` (ints or UUID strings) as a PostgreSQL array literal ``'{a,b,...}'``.

    One ``str.join`` in C: psycopg's binary list dumper walks the list in
    Python (~1 µs per element, a third of the node's CPU in a herd), while the
    store parses a literal of 5,000 ints in well under a millisecond.
    """
    return "{" + ",".join(map(str, values)) + "}"


class _Batch:
    """Column arrays for one ``fire_runs`` statement (see its comment in sql/queries.sql).

    Jobs are scalars (partition, id, revision, plan number); what to do with
    them is in the plan arrays, one entry per distinct outcome (next slot,
    runs, skip), so a herd of jobs sharing a schedule and slot shares one
    plan. A plan's runs are ``f_*[p_fire_lo - 1 : p_fire_hi]``; its skip is
    ``s_*[p_skip - 1]`` (0: none). Numbers are 1-based (SQL arrays).
    """

    __slots__ = ("pids", "jids", "revs", "plans", "p_next_nominal", "p_next_due", "p_fire_lo",
                 "p_fire_hi", "p_skip", "f_nominal", "f_scheduled", "s_first", "s_until", "s_slots",
                 "s_reasons", "partitions", "plan_numbers")

    def __init__(self) -> None:
        for name in self.__slots__[:-2]:
            setattr(self, name, [])
        self.partitions: set[int] = set()
        self.plan_numbers: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self.pids)

    def add_plan(self, plan) -> int:
        """Append ``plan`` (a :class:`scheduler.planner.Plan`); return its number (1-based)."""
        self.p_next_nominal.append(plan.next_nominal)
        self.p_next_due.append(plan.next_due)
        self.p_fire_lo.append(len(self.f_nominal) + 1)
        for nominal, scheduled in plan.fires:
            self.f_nominal.append(nominal)
            self.f_scheduled.append(scheduled)
        self.p_fire_hi.append(len(self.f_nominal))
        if plan.skip is None:
            self.p_skip.append(0)
        else:
            self.s_first.append(plan.skip.first)
            self.s_until.append(plan.skip.until)
            self.s_slots.append(plan.skip.slots)
            self.s_reasons.append(plan.skip.reason)
            self.p_skip.append(len(self.s_first))
        return len(self.p_next_nominal)

    def params(self, node_id: str, firable: dict[int, int]) -> dict:
        fence = sorted(self.partitions)
        position = {pid: i for i, pid in enumerate(fence, 1)}
        params = {name: getattr(self, name) for name in self.__slots__[4:-2]}
        params.update(pids=_array_literal(self.pids), jids=_array_literal(self.jids),
                      revs=_array_literal(self.revs), plans=_array_literal(self.plans),
                      fpos=_array_literal([position[pid] for pid in self.pids]),
                      node_id=node_id, fence_pids=fence, fence_epochs=[firable[pid] for pid in fence])
        return params


@dataclasses.dataclass
class _Sent:
    """A chunk queued on the pipeline: its statement's and its COMMIT's cursors,
    and once waited for, ``outcome`` = (the statement's row, COMMIT succeeded)."""

    batch: _Batch
    statement: psycopg.Cursor
    commit: psycopg.Cursor
    outcome: tuple[dict | None, bool] | None = None

    def wait(self) -> tuple[dict | None, bool]:
        """Wait for the chunk's results (psycopg syncs its lane); raise psycopg.Error on failure."""
        if self.outcome is None:
            row = self.statement.fetchone()
            self.outcome = (row, self.commit.statusmessage == "COMMIT")
        return self.outcome


class Firer:
    """Runs firing ticks for one node.

    Lifecycle (STYLE.md rule 6): :meth:`tick` is one iteration (tests call it);
    :meth:`run` ticks once per ``tick_interval_s`` until ``stop`` is set;
    :meth:`wake` makes the loop tick now (after a claim).
    """

    def __init__(self, settings: Settings, table: LeaseTable, clock: Clock, metrics: Metrics) -> None:
        self._s = settings
        self._table = table
        self._clock = clock
        self._metrics = metrics
        self._schedules = ScheduleCache()
        self._drr = DeficitRoundRobin()
        self._plan_memo: dict[tuple, object] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._conns: dict[str, psycopg.Connection] = {}
        self._wake = threading.Event()

    # ------------------------------------------------------------------ store

    def _connection(self, role: str) -> psycopg.Connection:
        """The ``read`` (due scan) or ``write0``, ``write1`` (firing lanes) connection."""
        conn = self._conns.get(role)
        if conn is None or conn.closed:
            s = self._s
            conn = self._conns[role] = store.connect(
                s.dsn,
                application_name=f"scheduler-fire:{s.node_id}"[:63],
                lock_timeout_s=s.effective_lock_timeout_s,
                statement_timeout_s=s.effective_statement_timeout_s,
                idle_in_transaction_timeout_s=s.effective_idle_in_transaction_timeout_s,
            )
        return conn

    def close(self) -> None:
        """Close the firing connections."""
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            try:
                conn.close()
            except psycopg.Error:
                pass

    # ------------------------------------------------------------------ tick

    def tick(self) -> TickResult:
        """Fire what is due now in this node's firable partitions; return the counts.

        Store errors are counted and logged, never raised: the tick is simply
        lost and its jobs stay due.
        """
        started = self._clock.monotonic()
        result = TickResult()
        with self._table.tick_lock:
            firable = self._table.firable()
            if firable:
                try:
                    self._tick(firable, result)
                except (psycopg.Error, SchedulerError, OSError) as exc:
                    self._metrics.error(getattr(exc, "sqlstate", None))
                    log.event("tick_failed", logging.WARNING, node=self._s.node_id,
                              error=(str(exc).splitlines() or [type(exc).__name__])[0])
                    self.close()  # reopened next tick; a failed session is never reused
                except Exception as exc:  # a bug must not stop the firing loop: log it loudly
                    log.event("tick_crashed", logging.ERROR, exc_info=True, node=self._s.node_id,
                              error=f"{type(exc).__name__}: {exc}")
                    self.close()
        elapsed = self._clock.monotonic() - started
        self._metrics.tick_duration.observe(elapsed)
        if elapsed > self._s.tick_interval_s:
            log.event("tick_slow", logging.WARNING, node=self._s.node_id, seconds=round(elapsed, 3),
                      fired=result.fired)
        return result

    def _tick(self, firable: dict[int, int], result: TickResult) -> None:
        read = self._connection("read")
        count = WRITE_LANES if len(firable) > PARTITION_COUNT // 2 else 1
        lanes = [self._connection(f"write{i}") for i in range(count)]
        for i in range(count, WRITE_LANES):  # a lane no longer needed is not kept open
            idle = self._conns.pop(f"write{i}", None)
            if idle is not None:
                idle.close()
        budget = self._s.tick_budget
        tenants = {row["tenant"]: row for row in store.execute(read, "tenant_weights")}
        weights = {tenant: row["weight"] for tenant, row in tenants.items()}
        limits = self._cap_limits(tenants, len(self._table))
        quotas = self._drr.quotas(budget, weights, limits)
        granted = dict(quotas)
        fetched: Counter = Counter()
        used: Counter = Counter()
        last: dict[str, tuple] = {}
        sent: list[_Sent] = []
        self._plan_memo.clear()
        try:
            with contextlib.ExitStack() as pipelines:
                for lane in lanes:
                    pipelines.enter_context(lane.pipeline())
                self._stream(read, lanes, firable, quotas, {}, granted, fetched, used, last, sent, result)
                saturated = {t: weights[t] for t, q in quotas.items() if q > 0 and fetched[t] >= q}
                leftover = budget - sum(fetched.values())
                if leftover > 0 and saturated:
                    left_limits = None if limits is None else {
                        t: limits[t] - quotas[t] for t in saturated if t in limits}
                    extra = DeficitRoundRobin.redistribute(leftover, saturated, left_limits)
                    for tenant, quota in extra.items():
                        granted[tenant] += quota
                    # Fair shares first: the first pass holds every tenant's
                    # share, so all of a small tenant's due work. Its chunks
                    # commit before the surplus is read and planned, so the
                    # big tenants' extra runs never take the CPU from them.
                    # Costs one pipeline bubble in a tick that redistributes;
                    # measured in the 5 M-job herd: small tenants' lag p99
                    # 1.0-1.24 s -> 0.72-0.85 s (docs/performance.md).
                    for item in sent:
                        item.wait()
                    self._stream(read, lanes, firable, extra, last, granted, fetched, used, last, sent, result)
        except psycopg.Error as exc:
            failed = self._collect(sent, firable, result)
            # An error inside the pipeline leaves the session in an aborted
            # transaction (and psycopg's statement cache unsure): never reuse it.
            self.close()
            if not store.is_retryable(exc):
                raise
            self._metrics.retry(exc.sqlstate or "")
            # Chunks that did not commit are re-sent one by one on a fresh
            # session, each retried whole. Re-sending a chunk that did commit
            # is harmless: the advance is idempotent and the run conflicts.
            write = self._connection("write0")
            for batch in failed:
                params = batch.params(self._s.node_id, firable)
                row = store.run_transaction(
                    write, lambda c: store.execute(c, "fire_runs", params, prepare=FIRE_RUNS_PREPARE)[0],
                    on_retry=self._metrics.retry)
                self._account(batch, row, result)
        else:
            self._collect(sent, firable, result)
        result.due_read = sum(fetched.values())
        self._drr.charge(used, quotas)
        for tenant, bucket in self._buckets.items():
            bucket.tokens -= used.get(tenant, 0)
        if any(fetched[t] >= q > 0 for t, q in granted.items()):
            result.budget_exhausted = True
        self._metrics.due_backlog.set(sum(granted.values()) if result.budget_exhausted else 0)

    def _stream(self, read: psycopg.Connection, lanes: list[psycopg.Connection], firable: dict[int, int],
                quotas: dict[str, int], after: dict[str, tuple], granted: dict[str, int], fetched: Counter,
                used: Counter, last: dict[str, tuple], sent: list, result: TickResult) -> None:
        """Stream due rows for ``quotas``; plan and send a firing statement per chunk.

        Tenants with the smallest quotas come first, so small tenants' runs are
        in the first statements of the tick. Chunks are pipelined on
        ``lanes`` (BEGIN; fire_runs; COMMIT per chunk, round robin): the
        store executes them while this thread plans the next.
        """
        tenants = sorted((t for t, q in quotas.items() if q > 0), key=lambda t: (quotas[t], t))
        if not tenants:
            return
        params = {
            "tenants": tenants,
            "quotas": [quotas[t] for t in tenants],
            "after_due": [after.get(t, (None, None))[0] for t in tenants],
            "after_job": [None if t not in after else uuid.UUID(after[t][1]) for t in tenants],
            "partition_ids": list(firable),
        }
        batch = _Batch()
        with read.cursor(row_factory=tuple_row) as cur:
            for row in cur.stream(store.QUERIES["select_due_jobs"], params, size=STREAM_ROWS):
                tenant = row[_TENANT]
                fetched[tenant] += 1
                last[tenant] = (row[_NEXT_DUE], row[_JOB_ID])
                self._plan_row(batch, row, firable, granted, used, result)
                if len(batch.pids) >= CHUNK_JOBS:
                    sent.append(self._send(lanes[len(sent) % len(lanes)], batch, firable))
                    batch = _Batch()
        if batch.pids:
            sent.append(self._send(lanes[len(sent) % len(lanes)], batch, firable))

    def _send(self, write: psycopg.Connection, batch: _Batch, firable: dict[int, int]) -> _Sent:
        """Queue one chunk's transaction on the pipelined ``write`` connection."""
        write.execute("BEGIN")
        cur = write.cursor()
        cur.execute(store.QUERIES["fire_runs"], batch.params(self._s.node_id, firable), prepare=FIRE_RUNS_PREPARE)
        return _Sent(batch, cur, write.execute("COMMIT"))

    def _collect(self, sent: list[_Sent], firable: dict[int, int], result: TickResult) -> list[_Batch]:
        """Account the chunks whose COMMIT succeeded; return the others.

        A chunk counts only once its COMMIT is known to have succeeded: under
        SERIALIZABLE (CockroachDB) a 40001 can come at COMMIT, after the
        statement itself returned its counts.
        """
        failed = []
        for item in sent:
            try:
                row, committed = item.wait()
            except psycopg.Error:
                row, committed = None, False
            if row is None or not committed:
                failed.append(item.batch)
            else:
                self._account(item.batch, row, result)
        sent.clear()
        return failed

    def _cap_limits(self, tenants: dict[str, dict], owned: int) -> dict[str, int] | None:
        """This tick's run limits of rate-capped tenants (token buckets; see fairness.py)."""
        now_s = self._clock.monotonic()
        limits: dict[str, int] = {}
        for tenant, row in tenants.items():
            if row["max_rate"] is None:
                self._buckets.pop(tenant, None)
                continue
            rate = node_share_of_cap(row["max_rate"], owned)
            burst = max(1.0, rate * self._s.tick_interval_s)
            bucket = self._buckets.get(tenant)
            if bucket is None or bucket.rate_per_s != rate:
                bucket = self._buckets[tenant] = TokenBucket(rate, burst, burst if bucket is None
                                                             else min(burst, bucket.tokens), now_s)
            limits[tenant] = int(bucket.refill(now_s))
        return limits or None

    def _plan_row(self, batch: _Batch, row: tuple, firable: dict[int, int], granted: dict[str, int],
                  used: Counter, result: TickResult) -> None:
        """Plan one due job (a ``select_due_jobs`` tuple) within its tenant's granted runs."""
        tenant = row[_TENANT]
        remaining = granted.get(tenant, 0) - used[tenant]
        if remaining <= 0:
            result.budget_exhausted = True
            return
        try:
            schedule = self._schedules.for_key(row[_SCHEDULE])
        except ValidationError as exc:  # a row that no longer parses (e.g. tzdata change)
            log.event("job_invalid", logging.ERROR, job_id=str(row[_JOB_ID]), error=str(exc))
            return
        now, jitter_s = row[_STORE_NOW], row[_JITTER_S]
        # Without jitter a plan depends on the schedule, the slot, the policy and
        # now, not on the job: in a herd, thousands of jobs share one plan,
        # computed once per tick and sent once per statement.
        key = plan = None
        if jitter_s == 0:
            key = (id(schedule), row[_NEXT_NOMINAL], row[_MISFIRE], row[_CATCHUP], row[_GRACE], now)
            plan = self._plan_memo.get(key)
        if plan is None:
            plan = plan_job(
                schedule, job_id=uuid.UUID(row[_JOB_ID]), next_nominal=row[_NEXT_NOMINAL], now=now,
                misfire=row[_MISFIRE], catchup_window_s=row[_CATCHUP], misfire_grace_s=row[_GRACE],
                jitter_s=jitter_s, limit=remaining)
            if key is not None and len(plan.fires) <= 1 and plan.skip is None:
                self._plan_memo[key] = plan
            else:
                key = None  # a plan of this job alone (jitter, catch-up, skip)
        number = batch.plan_numbers.get(key) if key is not None else None
        if number is None:
            number = batch.add_plan(plan)
            if key is not None:
                batch.plan_numbers[key] = number
        pid = row[_PARTITION]
        batch.partitions.add(pid)
        batch.pids.append(pid)
        batch.jids.append(row[_JOB_ID])
        batch.revs.append(row[_REVISION])
        batch.plans.append(number)
        used[tenant] += len(plan.fires)
        if plan.next_due is not None and plan.next_due <= now and used[tenant] >= granted[tenant]:
            result.budget_exhausted = True

    def _account(self, batch: _Batch, row: dict, result: TickResult) -> None:
        """Count one committed chunk; drop leases the fence rejected."""
        fenced = set(row["fenced"])
        rejected = sorted(batch.partitions - fenced)
        if rejected:
            self._table.drop(rejected)
            result.fence_rejected.extend(rejected)
            self._metrics.fence_rejections.inc(len(rejected))
            self._metrics.lease_events.labels(kind="lost").inc(len(rejected))
            log.event("fence_rejected", logging.WARNING, node=self._s.node_id,
                      partitions=len(rejected), sample=rejected[:8])
        stale = sum(1 for pid in batch.pids if pid in fenced) - row["advanced"]
        if stale > 0:
            result.stale_jobs += stale
            self._metrics.stale_jobs.inc(stale)
        result.fired += row["inserted"]
        result.skipped_ranges += row["skipped"]
        result.lags_s.extend(row["lags_s"])
        self._metrics.runs_fired.inc(row["inserted"])
        self._metrics.slots_skipped.inc(row["skipped"])
        self._metrics.dispatch_lag.observe_many(row["lags_s"])

    # ------------------------------------------------------------------ loop

    def wake(self) -> None:
        """Tick as soon as possible (e.g. right after partitions were claimed)."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Tick every ``tick_interval_s``, phased onto wall-clock seconds, until ``stop``.

        Whoever sets ``stop`` must also call :meth:`wake` to cut the wait short.

        When a tick leaves due work behind (budget spent), the next one starts
        one interval after this one started: that is the pacing.
        """
        interval = self._s.tick_interval_s
        while not stop.is_set():
            started = self._clock.monotonic()
            result = self.tick()
            if stop.is_set():
                break
            if result.budget_exhausted:
                delay = interval - (self._clock.monotonic() - started)
            else:
                wall = self._clock.wall()
                delay = interval - ((wall - TICK_PHASE_S) % interval)
            if delay > 0:
                self._clock.wait(self._wake, delay)
                self._wake.clear()
