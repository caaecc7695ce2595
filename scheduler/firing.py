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
   work goes to the others in a second pass.
3. Plan each job in Python (:func:`scheduler.planner.plan_job`): runs to
   fire, slots to skip under its misfire policy, its next slot. Next-fire
   computations are memoized per (schedule, instant).
4. Commit with ``fire_runs``: one statement that locks the fenced partition
   rows FOR SHARE (owner and epoch still ours), advances the jobs of fenced
   partitions whose revision is unchanged, records skips, and inserts the
   runs (the runs primary key makes a duplicate impossible). Arrays travel
   as binary parameters; large ticks are split into chunks of
   :data:`CHUNK_RUNS` runs, each its own statement and transaction.

Why a stale owner commits nothing: see scheduler/lease.py. Partitions the
statement did not fence are counted (``scheduler_firing_fence_rejections_total``),
logged as ``fence_rejected`` and dropped from the lease table.

Failure: a lost connection or statement error aborts the tick (the store
rolls the statement back); the jobs stay due and fire on the next tick.
Retryable SQLSTATEs (40001, 40P01) re-run the statement.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections import Counter
from datetime import datetime

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.errors import SchedulerError, ValidationError
from scheduler.fairness import DeficitRoundRobin, TokenBucket, node_share_of_cap
from scheduler.lease import LeaseTable
from scheduler.metrics import Metrics
from scheduler.planner import plan_job
from scheduler.settings import Settings
from scheduler.spec import ScheduleCache

CHUNK_RUNS = 20_000
"""Runs per firing statement; keeps each statement well under statement_timeout."""

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


class _Batch:
    """Column arrays for one ``fire_runs`` statement."""

    def __init__(self) -> None:
        self.a_pids: list[int] = []
        self.a_jids: list[uuid.UUID] = []
        self.a_revs: list[int] = []
        self.a_next_nominal: list[datetime | None] = []
        self.a_next_due: list[datetime | None] = []
        self.r_pids: list[int] = []
        self.r_jids: list[uuid.UUID] = []
        self.r_nominal: list[datetime] = []
        self.r_tenants: list[str] = []
        self.r_scheduled: list[datetime] = []
        self.r_epochs: list[int] = []
        self.s_pids: list[int] = []
        self.s_jids: list[uuid.UUID] = []
        self.s_first: list[datetime] = []
        self.s_until: list[datetime] = []
        self.s_slots: list[int | None] = []
        self.s_reasons: list[str] = []
        self.s_epochs: list[int] = []
        self.partitions: set[int] = set()

    def __len__(self) -> int:
        return len(self.r_pids)

    def params(self, node_id: str, firable: dict[int, int]) -> dict:
        fence = sorted(self.partitions)
        return {
            "node_id": node_id,
            "fence_pids": fence,
            "fence_epochs": [firable[pid] for pid in fence],
            **{k: v for k, v in vars(self).items() if k != "partitions"},
        }


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
        self._buckets: dict[str, TokenBucket] = {}
        self._conn: psycopg.Connection | None = None
        self._wake = threading.Event()

    # ------------------------------------------------------------------ store

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            s = self._s
            self._conn = store.connect(
                s.dsn,
                application_name=f"scheduler-fire:{s.node_id}"[:63],
                lock_timeout_s=s.effective_lock_timeout_s,
                statement_timeout_s=s.effective_statement_timeout_s,
                idle_in_transaction_timeout_s=s.effective_idle_in_transaction_timeout_s,
            )
        return self._conn

    def close(self) -> None:
        """Close the firing connection."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

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
                    if self._conn is not None and (self._conn.closed or isinstance(exc, psycopg.OperationalError)):
                        self.close()
        elapsed = self._clock.monotonic() - started
        self._metrics.tick_duration.observe(elapsed)
        if elapsed > self._s.tick_interval_s:
            log.event("tick_slow", logging.WARNING, node=self._s.node_id, seconds=round(elapsed, 3),
                      fired=result.fired)
        return result

    def _tick(self, firable: dict[int, int], result: TickResult) -> None:
        conn = self._connection()
        budget = self._s.tick_budget
        tenants = {row["tenant"]: row for row in store.execute(conn, "tenant_weights")}
        weights = {tenant: row["weight"] for tenant, row in tenants.items()}
        limits = self._cap_limits(tenants, len(self._table))
        quotas = self._drr.quotas(budget, weights, limits)
        rows = self._fetch(conn, firable, quotas, {})
        fetched = Counter(row["tenant"] for row in rows)
        granted = dict(quotas)
        saturated = {t: weights[t] for t, q in quotas.items() if q > 0 and fetched[t] >= q}
        leftover = budget - len(rows)
        if leftover > 0 and saturated:
            left_limits = None if limits is None else {
                t: limits[t] - quotas[t] for t in saturated if t in limits}
            extra = DeficitRoundRobin.redistribute(leftover, saturated, left_limits)
            last = {}
            for row in rows:  # rows come per tenant in (next_due_at, job_id) order
                last[row["tenant"]] = (row["next_due_at"], row["job_id"])
            more = self._fetch(conn, firable, extra, last)
            rows.extend(more)
            for tenant, quota in extra.items():
                granted[tenant] += quota
            fetched.update(row["tenant"] for row in more)
        result.due_read = len(rows)
        if not rows:
            self._drr.charge({}, quotas)
            self._metrics.due_backlog.set(0)
            return
        now: datetime = rows[0]["store_now"]
        batches, used = self._plan(rows, now, firable, granted, result)
        self._drr.charge(used, quotas)
        for tenant, bucket in self._buckets.items():
            bucket.tokens -= used.get(tenant, 0)
        result.budget_exhausted = any(fetched[t] >= q > 0 for t, q in granted.items()) or result.budget_exhausted
        for batch in batches:
            self._commit(conn, batch, firable, result)
        self._metrics.due_backlog.set(sum(granted.values()) if result.budget_exhausted else 0)

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

    def _fetch(self, conn: psycopg.Connection, firable: dict[int, int], quotas: dict[str, int],
               after: dict[str, tuple]) -> list[dict]:
        tenants = [tenant for tenant, quota in quotas.items() if quota > 0]
        if not tenants:
            return []
        return store.execute(conn, "select_due_jobs", {
            "tenants": tenants,
            "quotas": [quotas[t] for t in tenants],
            "after_due": [after.get(t, (None, None))[0] for t in tenants],
            "after_job": [after.get(t, (None, None))[1] for t in tenants],
            "partition_ids": list(firable),
        })

    def _plan(self, rows: list[dict], now: datetime, firable: dict[int, int], granted: dict[str, int],
              result: TickResult) -> tuple[list[_Batch], Counter]:
        """Plan every fetched job within its tenant's granted runs; return batches and runs per tenant."""
        batches = [_Batch()]
        used: Counter = Counter()
        for row in rows:
            tenant = row["tenant"]
            remaining = granted.get(tenant, 0) - used[tenant]
            if remaining <= 0:
                result.budget_exhausted = True
                continue
            try:
                schedule = self._schedules.for_row(row)
            except ValidationError as exc:  # a row that no longer parses (e.g. tzdata change)
                log.event("job_invalid", logging.ERROR, job_id=str(row["job_id"]), error=str(exc))
                continue
            plan = plan_job(
                schedule, job_id=row["job_id"], next_nominal=row["next_nominal_at"], now=now,
                misfire=row["misfire"], catchup_window_s=row["catchup_window_s"],
                misfire_grace_s=row["misfire_grace_s"], jitter_s=row["jitter_s"], limit=remaining)
            batch = batches[-1]
            if len(batch) >= CHUNK_RUNS:
                batch = _Batch()
                batches.append(batch)
            pid, jid, epoch = row["partition_id"], row["job_id"], firable[row["partition_id"]]
            batch.partitions.add(pid)
            batch.a_pids.append(pid)
            batch.a_jids.append(jid)
            batch.a_revs.append(row["revision"])
            batch.a_next_nominal.append(plan.next_nominal)
            batch.a_next_due.append(plan.next_due)
            for nominal, scheduled in plan.fires:
                batch.r_pids.append(pid)
                batch.r_jids.append(jid)
                batch.r_nominal.append(nominal)
                batch.r_tenants.append(tenant)
                batch.r_scheduled.append(scheduled)
                batch.r_epochs.append(epoch)
            used[tenant] += len(plan.fires)
            if plan.skip is not None:
                batch.s_pids.append(pid)
                batch.s_jids.append(jid)
                batch.s_first.append(plan.skip.first)
                batch.s_until.append(plan.skip.until)
                batch.s_slots.append(plan.skip.slots)
                batch.s_reasons.append(plan.skip.reason)
                batch.s_epochs.append(epoch)
            if plan.next_due is not None and plan.next_due <= now and used[tenant] >= granted[tenant]:
                result.budget_exhausted = True
        return [b for b in batches if b.a_pids], used

    def _commit(self, conn: psycopg.Connection, batch: _Batch, firable: dict[int, int],
                result: TickResult) -> None:
        params = batch.params(self._s.node_id, firable)
        row = store.run_transaction(
            conn, lambda c: store.execute(c, "fire_runs", params)[0], on_retry=self._metrics.retry)
        fenced = set(row["fenced"])
        rejected = sorted(batch.partitions - fenced)
        if rejected:
            self._table.drop(rejected)
            result.fence_rejected.extend(rejected)
            self._metrics.fence_rejections.inc(len(rejected))
            self._metrics.lease_events.labels(kind="lost").inc(len(rejected))
            log.event("fence_rejected", logging.WARNING, node=self._s.node_id,
                      partitions=len(rejected), sample=rejected[:8])
        stale = sum(1 for pid in batch.a_pids if pid in fenced) - row["advanced"]
        if stale > 0:
            result.stale_jobs += stale
            self._metrics.stale_jobs.inc(stale)
        result.fired += row["inserted"]
        result.skipped_ranges += row["skipped"]
        result.lags_s.extend(row["lags_s"])
        self._metrics.runs_fired.inc(row["inserted"])
        self._metrics.slots_skipped.inc(row["skipped"])
        for lag in row["lags_s"]:
            self._metrics.dispatch_lag.observe(lag)

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
