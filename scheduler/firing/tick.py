"""The firing loop: once a second, one fenced, set-based tick (docs/design.md §4).

A tick
------
1. Take the partitions this node may fire now (:meth:`LeaseTable.firable`:
   held, not draining, not within the safety margin of the lease deadline).
   The tick's state (:class:`~scheduler.firing.state.Tick`: firable
   partitions and their epochs literal, quotas, runs granted, fetched and
   used, cursors, the write pipeline, the counts) is made once here.
2. Split the tick's budget (pacing: ``max_rate_per_s × tick_interval_s``)
   between tenants with :class:`scheduler.fairness.DeficitRoundRobin`
   (weights and rate caps are rows of ``tenants``), and read due timers of
   all firable partitions in one query (``select_due_jobs``, streamed as
   tuples by :func:`scheduler.store.stream`): per tenant, oldest due first
   ((next_due_at, partition_id, job_id) order), up to its quota; budget left
   by tenants with little due work goes to the others in a second pass,
   sent once the first pass's chunks have committed (fair shares first).
   Herds (:mod:`scheduler.firing.herds`) are taken out of this path first.
3. Plan each job in Python (:class:`scheduler.firing.batch.RowPlanner`,
   :func:`scheduler.planner.plan_job`): runs to fire, slots to skip under its
   misfire policy, its next slot, memoized per schedule and instant.
4. Commit with ``fire_runs``: one statement that locks the fenced partition
   rows FOR SHARE (owner and epoch still ours), advances the jobs of fenced
   partitions whose revision is unchanged, records skips, and inserts the
   runs (the runs primary key makes a duplicate impossible). Large ticks are
   split into chunks of ``chunk_jobs`` jobs (the first ones smaller:
   ``first_chunk_jobs``, doubling; :class:`~scheduler.firing.limits.FiringLimits`), each its own
   transaction, queued on the store's write pipeline
   (:class:`scheduler.store.Pipeline`) over ``write_lanes`` connections so
   the store executes chunks while the node plans the next; the pipeline
   returns each chunk's outcome for the tick to count. The statement is
   never prepared (:data:`~scheduler.firing.limits.FIRE_RUNS_PREPARE`).

5. Carry out the run-now requests of the firable partitions
   (:func:`scheduler.delivery.owner.fire_requests`: one fenced statement,
   after the chunks, so serialized with this node's firing of the same
   jobs under any overlap policy).

Store time: "due" (``next_due_at <= now``), the ``now`` plans are made for
and a run's ``fired_at`` are the store's clock, never the node's. Each of
these statements takes the injected clock's store pin as ``now``
(scheduler/clock.py, "The pinned store clock"): None in production, an
instant in tests, which then get one exact answer, lateness included.

Why a stale owner commits nothing: see scheduler/coordination/__init__.py. Partitions the
statement did not fence are counted (``scheduler_firing_fence_rejections_total``),
logged as ``fence_rejected`` and dropped from the lease table.

Failure: chunks are independent transactions. A lost connection or a
statement error ends the tick: chunks already committed stay committed, the
failed one is rolled back by the store, and its jobs stay due for the next
tick. All sessions are then closed and reopened, never reused after an
error. On a retryable SQLSTATE (40001, 40P01) the chunks that did not commit
are re-sent at once on a fresh session (:func:`scheduler.store.resend`),
each retried whole with backoff.

A store that went back in time (an asynchronous failover): every committed
chunk's last run per partition is remembered
(:class:`~scheduler.coordination.rewind.RunMarks`, from the statement's own
answer), and the first tick after the sessions were closed checks, before
firing, that the store still has them (:meth:`Firer.check_marks`, one
query); a lost one is logged (``store_rewound``, ``seen="runs"``) and counted.
"""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.coordination.rewind import RunMarks
from scheduler.coordination.table import LeaseTable
from scheduler.delivery import owner
from scheduler.errors import SchedulerError
from scheduler.fairness import DeficitRoundRobin
from scheduler.firing.batch import JOB_ID, NEXT_DUE, PARTITION, TENANT, Batch, RowPlanner, epochs_literal
from scheduler.firing.herds import Herd, HerdFinder
from scheduler.firing.limits import (
    DEFAULT_LIMITS,
    FIRE_RUNS_PREPARE,
    LOOKAHEAD_MIN_WAIT_S,
    TICK_PHASE_S,
    FiringLimits,
)
from scheduler.firing.lookahead import LookAhead
from scheduler.firing.outcomes import Outcomes, RateCaps
from scheduler.firing.state import LAST_UUID, NO_CURSOR, Tick, TickFailure, TickResult
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings
from scheduler.spec import ScheduleCache


class Firer:
    """Runs firing ticks for one node.

    Lifecycle (CONTRIBUTING.md rule 6): :meth:`tick` is one iteration (tests call it);
    :meth:`run` ticks once per ``tick_interval_s`` until ``stop`` is set;
    :meth:`wake` makes the loop tick now (after a claim). ``limits``: the
    thresholds (default :data:`~scheduler.firing.limits.DEFAULT_LIMITS`).
    """

    def __init__(
        self,
        settings: Settings,
        table: LeaseTable,
        clock: Clock,
        metrics: Metrics,
        limits: FiringLimits = DEFAULT_LIMITS,
    ) -> None:
        self._s = settings
        self._table = table
        self._clock = clock
        self._metrics = metrics
        self._limits = limits
        self._schedules = ScheduleCache()
        self._planner = RowPlanner(self._schedules)
        self._herds = HerdFinder(settings.node_id, self._schedules, clock, limits)
        self._lookahead = LookAhead(self._herds, clock, limits)
        self._tenants: list[str] = []
        self._drr = DeficitRoundRobin()
        self._caps = RateCaps()
        self._marks = RunMarks(settings.node_id, metrics)
        self._outcomes = Outcomes(settings.node_id, table, metrics, self._marks)
        self._check_marks = False  # sessions were closed since the last rewind check (a reconnect is coming)
        self._sessions: dict[str, store.StoreSession] = {}
        self._wake = threading.Event()
        self._failure = TickFailure()  # what the current tick is doing, for tick_failed

    # ------------------------------------------------------------------ store

    def _connection(self, role: str) -> psycopg.Connection:
        """The ``read`` (due scan) or ``write0``, ``write1`` (firing lanes) connection,
        named ``scheduler-fire-<role>:<node id>`` in the store."""
        session = self._sessions.get(role)
        if session is None:
            session = self._sessions[role] = store.StoreSession(self._s, role=f"fire-{role}")
        return session.connection()

    def close(self) -> None:
        """Close the firing connections (after an error, or at shutdown).

        The next tick reconnects, and first checks the runs this node last
        committed (:meth:`check_marks`), and counts its herds at their instant:
        the herds measured ahead are forgotten (after a failed tick, which of
        their partitions fired is not known).
        """
        self._herds.forget()
        sessions, self._sessions = self._sessions, {}
        self._check_marks = self._check_marks or bool(sessions)
        for session in sessions.values():
            session.close()

    @property
    def marks(self) -> RunMarks:
        """The last run this node committed per partition (the rewind check's memory)."""
        return self._marks

    def check_marks(self) -> list[int]:
        """The rewind check after a reconnect (:class:`~scheduler.coordination.rewind.RunMarks`):
        one ``select_runs_present`` on the ``read`` session, before the tick fires
        anything (a slot fired again first would hide its loss). Returns the
        partitions found rewound (reported and forgotten), ascending.

        Does nothing unless the sessions were closed since the last check and
        runs are remembered. A store error is logged (``rewind_check_failed``),
        the ``read`` session closed and the check left due for the next tick;
        never raised, so firing is never held.
        """
        if not self._check_marks:
            return []
        if not len(self._marks):
            self._check_marks = False
            return []
        try:
            rows = store.execute(self._connection("read"), "select_runs_present", self._marks.params())
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event("rewind_check_failed", logging.WARNING, node=self._s.node_id, error=store.first_line(exc))
            idle = self._sessions.pop("read", None)
            if idle is not None:
                idle.close()
            return []
        self._check_marks = False
        return self._marks.check(rows)

    # ------------------------------------------------------------------ tick

    def tick(self) -> TickResult:
        """Fire what is due now in this node's firable partitions; return the counts.

        Store errors are counted and logged, never raised: the tick is simply
        lost and its jobs stay due.
        """
        started = self._clock.monotonic()
        result = TickResult()
        # Numbered, not locked: the lease loop releases a draining partition only
        # after the tick that may fire it has ended, without ever waiting for it.
        number, firable = self._table.begin_tick()
        try:
            if firable:
                self._failure = failure = TickFailure()
                try:
                    self._tick(firable, result)
                except (psycopg.Error, SchedulerError, OSError) as exc:
                    self._metrics.error(getattr(exc, "sqlstate", None))
                    log.event(
                        "tick_failed",
                        logging.WARNING,
                        node=self._s.node_id,
                        error=(str(exc).splitlines() or [type(exc).__name__])[0],
                        step=failure.step,
                        runs_committed=result.fired,
                        chunks_committed=failure.chunks_committed,
                        chunks_failed=failure.chunks_failed,
                    )
                    self.close()  # reopened next tick; a failed session is never reused
                except Exception as exc:  # a bug must not stop the firing loop: log it loudly
                    log.event(
                        "tick_crashed",
                        logging.ERROR,
                        exc_info=True,
                        node=self._s.node_id,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    self.close()
        finally:
            self._table.end_tick(number)
        elapsed = self._clock.monotonic() - started
        self._metrics.tick_duration.observe(elapsed)
        if elapsed > self._s.tick_interval_s:
            log.event(
                "tick_slow",
                logging.WARNING,
                node=self._s.node_id,
                seconds=round(elapsed, 3),
                fired=result.fired,
                herd_fired=result.herd_fired,
            )
        return result

    def _tick(self, firable: dict[int, int], result: TickResult) -> None:
        self.check_marks()
        read = self._connection("read")
        lanes_max = self._limits.write_lanes
        count = lanes_max if len(firable) > PARTITION_COUNT // 2 else 1
        lanes = [self._connection(f"write{i}") for i in range(count)]
        for i in range(count, lanes_max):  # a lane no longer needed is not kept open
            idle = self._sessions.pop(f"write{i}", None)
            if idle is not None:
                idle.close()
        budget = self._s.tick_budget
        self._failure.step = "tenant_weights"
        tenants = {row["tenant"]: row for row in store.execute(read, "tenant_weights")}
        self._tenants = sorted(tenants)
        weights = {tenant: row["weight"] for tenant, row in tenants.items()}
        limits = self._caps.limits(tenants, len(self._table), self._clock.monotonic(), self._s.tick_interval_s)
        quotas = self._drr.quotas(budget, weights, limits)
        tick = Tick(
            firable=firable,
            epochs=epochs_literal(firable),
            read=read,
            pipeline=store.Pipeline(lanes, prepare=FIRE_RUNS_PREPARE),
            quotas=quotas,
            granted=dict(quotas),
            result=result,
        )
        self._planner.start_tick()
        passes_done = False  # False if an error ends the tick before its passes were all sent
        try:
            with tick.pipeline:
                self._pass(tick, quotas, {})
                fetched = tick.fetched
                saturated = {t: weights[t] for t, q in quotas.items() if q > 0 and fetched[t] >= q}
                leftover = budget - sum(fetched.values())
                if leftover > 0 and saturated:
                    left_limits = (
                        None if limits is None else {t: limits[t] - quotas[t] for t in saturated if t in limits}
                    )
                    extra = DeficitRoundRobin.redistribute(leftover, saturated, left_limits)
                    for tenant, quota in extra.items():
                        tick.granted[tenant] += quota
                    # Fair shares first: the first pass holds every tenant's
                    # share, so all of a small tenant's due work. Its chunks
                    # commit before the surplus is streamed, planned and sent,
                    # so the big tenants' extra runs never take the CPU from
                    # them; measured in the 5 M-job herd: small tenants' lag
                    # p99 1.0-1.24 s -> 0.72-0.85 s (docs/performance.md).
                    # The surplus's herds (index probes and a small sample)
                    # are looked up meanwhile, shortening the bubble.
                    after = dict(tick.last)
                    self._failure.step = "find_herds"
                    herds = self._herds.find(tick, extra, after)
                    tick.pipeline.wait()
                    self._pass(tick, extra, after, herds)
                passes_done = True
        except psycopg.Error as exc:
            sent = len(tick.pipeline.sent)
            failed = self._outcomes.collect(tick.pipeline, result)
            self._failure.collected(sent, failed)
            # An error inside the pipeline leaves the session in an aborted
            # transaction (and psycopg's statement cache unsure): never reuse it.
            self.close()
            if not store.is_retryable(exc):
                raise
            self._metrics.retry(exc.sqlstate or "")
            # Chunks that did not commit are re-sent one by one on a fresh
            # session, each retried whole. Re-sending a chunk that did commit
            # is harmless: fire_runs' advance is idempotent and its runs
            # conflict; fire_group finds nothing left at the herd's instant.
            write = self._connection("write0")
            for item in failed:
                self._failure.step = item.query
                row = store.resend(write, item, prepare=FIRE_RUNS_PREPARE, on_retry=self._metrics.retry)
                self._outcomes.account(item, row, result)
                self._failure.resent()
        else:
            sent = len(tick.pipeline.sent)
            self._failure.collected(sent, self._outcomes.collect(tick.pipeline, result))
        if self._planner.replan:
            self._failure.step = "replan_slots"
            result.replanned = self._planner.replan_slots(self._connection("write0"))
            self._metrics.slots_replanned.inc(result.replanned)
        # Run-now requests, after the chunks: serialized with this node's firing
        # statements, so a manual and a scheduled run of a forbid job never both
        # find "no unfinished run" (scheduler/delivery/owner.py).
        self._failure.step = "fire_run_requests"
        done = owner.fire_requests(
            self._connection("write0"), self._s.node_id, tick.firable, self._clock.store_now_or_none(), tick.epochs
        )
        result.requests = len(done)
        used, granted = tick.used, tick.granted
        result.due_read = sum(tick.fetched.values())
        self._drr.charge(used, quotas)
        self._caps.charge(used)
        # Due work may be left when a tenant read all it was granted, or when a
        # conflict ended the tick before a pass (the surplus, say) was read:
        # either way the next tick starts one interval after this one.
        if not passes_done or any(tick.fetched[t] >= q > 0 for t, q in granted.items()):
            result.budget_exhausted = True
        self._metrics.due_backlog.set(sum(granted.values()) if result.budget_exhausted else 0)

    def _pass(
        self, tick: Tick, quotas: dict[str, int], after: dict[str, tuple], herds: dict[str, Herd] | None = None
    ) -> None:
        """One pass over ``quotas`` (after the cursors ``after``): herds through
        ``fire_group``, every other tenant's fair set per timer.

        A herd is the head of its tenant's fair set; the tenant's timers due
        after it wait for the next pass or tick, and its cursor moves past
        the herd's last partition. Tenants are served smallest quota first
        throughout (the per-timer chunks of small tenants go out before the
        herds'). ``herds``: this pass's, if already looked up (the surplus
        pass); otherwise looked up here among shares of at least
        ``first_pass_herd_quota`` (the first pass).
        """
        if herds is None:
            self._failure.step = "find_herds"
            herds = self._herds.find(tick, quotas, after, self._limits.first_pass_herd_quota)
        rest = {t: q for t, q in quotas.items() if t not in herds}
        self._stream(tick, rest, after)
        fetched, used = tick.fetched, tick.used
        for tenant in sorted(herds, key=lambda t: (quotas[t], t)):
            herd = herds[tenant]
            self._herds.send(tick, herd)
            before = fetched[tenant]
            fetched[tenant] += herd.jobs
            used[tenant] += herd.jobs
            if herd.cut:  # the quota ran out in the herd: saturated, whatever it fetched
                fetched[tenant] = max(fetched[tenant], before + quotas[tenant])
            tick.last[tenant] = (herd.due, herd.pids[-1], LAST_UUID)

    def _stream(self, tick: Tick, quotas: dict[str, int], after: dict[str, tuple]) -> None:
        """Stream due rows for ``quotas`` (after the cursors ``after``);
        plan and send a firing statement per chunk.

        Tenants with the smallest quotas come first, so small tenants' runs are
        in the first statements of the tick. Chunks are queued on the tick's
        pipeline (BEGIN; fire_runs; COMMIT per chunk, round robin over its
        lanes): the store executes them while this thread plans the next.

        The due scan is read in pages of at most ``stream_page_jobs`` timers,
        each a statement of its own that ends when its rows are read (see
        :attr:`~scheduler.firing.limits.FiringLimits.stream_page_jobs`): a
        page holds each tenant's quota left, smallest quota first, until the
        page is full. A tenant that read fewer than its page's quota has no
        more due timers; one that read it all goes on in the next page after
        its last timer read, with what is left of its quota.
        """
        left = {t: q for t, q in quotas.items() if q > 0}
        order = sorted(left, key=lambda t: (quotas[t], t))
        cursors = {t: after.get(t, NO_CURSOR) for t in order}
        # The per-row loop works on locals: no attribute lookup per timer.
        fetched, last, granted, used, result = tick.fetched, tick.last, tick.granted, tick.used, tick.result
        plan_row, limits = self._planner.plan_row, self._limits
        chunk_jobs = min(limits.chunk_jobs, limits.first_chunk_jobs << min(len(tick.pipeline.sent), 20))
        batch = Batch()
        while left:
            page: dict[str, int] = {}
            room = limits.stream_page_jobs
            for tenant in order:
                if tenant in left and room > 0:
                    page[tenant] = min(left[tenant], room)
                    room -= page[tenant]
            tenants = list(page)
            before = {t: fetched[t] for t in tenants}
            params = {
                "tenants": tenants,
                "quotas": [page[t] for t in tenants],
                "after_due": [cursors[t][0] for t in tenants],
                "after_pid": [cursors[t][1] for t in tenants],
                "after_job": [uuid.UUID(cursors[t][2]) for t in tenants],
                "partition_ids": list(tick.firable),
                "now": self._clock.store_now_or_none(),
            }
            self._failure.step = "select_due_jobs"
            with store.stream(tick.read, "select_due_jobs", params, limits.stream_rows) as rows:
                for row in rows:
                    tenant = row[TENANT]
                    fetched[tenant] += 1
                    last[tenant] = (row[NEXT_DUE], row[PARTITION], row[JOB_ID])
                    plan_row(batch, row, granted, used, result)
                    if len(batch.pids) >= chunk_jobs:
                        self._send_batch(tick, batch)
                        batch = Batch()
                        chunk_jobs = min(limits.chunk_jobs, chunk_jobs * 2)
            for tenant in tenants:
                read = fetched[tenant] - before[tenant]
                left[tenant] -= read
                if read < page[tenant] or left[tenant] <= 0:
                    del left[tenant]  # no more due timers, or its quota is read
                else:
                    cursors[tenant] = last[tenant]
        if batch.pids:
            self._send_batch(tick, batch)

    def _send_batch(self, tick: Tick, batch: Batch) -> None:
        """Queue one per-timer chunk (``fire_runs``) on the tick's pipeline."""
        params = batch.params(self._s.node_id, tick.firable, tick.epochs, self._clock.store_now_or_none())
        tick.pipeline.send("fire_runs", params, batch.partitions, batch)

    # ------------------------------------------------------------------ loop

    def wake(self) -> None:
        """Tick as soon as possible (e.g. right after partitions were claimed)."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Tick every ``tick_interval_s``, phased onto wall-clock seconds, until ``stop``.

        Whoever sets ``stop`` must also call :meth:`wake` to cut the wait short.

        When a tick leaves due work behind (budget spent), the next one starts
        one interval after this one started: that is the pacing. Otherwise it
        starts at the first phase point after this tick's start: at once if
        this tick ran past it (a tick that overran its second must not wait for
        the one after: the overrun's timers are due, and waiting made each tick
        fire two seconds' worth and overrun again, docs/performance.md
        "2026-12-02, afternoon").
        """
        interval = self._s.tick_interval_s
        while not stop.is_set():
            started, started_wall = self._clock.monotonic(), self._clock.wall()
            result = self.tick()
            if stop.is_set():
                break
            elapsed = self._clock.monotonic() - started
            if result.budget_exhausted:
                delay = interval - elapsed
            else:
                delay = interval - ((started_wall - TICK_PHASE_S) % interval) - elapsed
            if delay > LOOKAHEAD_MIN_WAIT_S:  # spend the wait on the coming seconds' schedules
                end = self._clock.monotonic() + delay
                self.look_ahead(end - LOOKAHEAD_MIN_WAIT_S)
                delay = end - self._clock.monotonic()
            if delay > 0:
                self._clock.wait(self._wake, delay)
                self._wake.clear()

    def look_ahead(self, deadline: float) -> None:
        """Until the local monotonic ``deadline``: prepare the schedules of the
        timers falling due soon (:mod:`scheduler.firing.lookahead`). Store
        errors are logged and the sessions closed (the next tick reopens them)."""
        firable = self._table.firable()
        try:
            self._lookahead.run(self._connection("read"), self._tenants, firable, deadline)
        except psycopg.errors.QueryCanceled:
            pass  # the read would have outlasted the wait: the tick comes first
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event("lookahead_failed", logging.WARNING, node=self._s.node_id, error=store.first_line(exc))
            self.close()
