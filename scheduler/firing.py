"""The firing loop: once a second, one fenced, set-based transaction (docs/design.md §4).

A tick
------
1. Take the partitions this node may fire now (:meth:`LeaseTable.firable`:
   held, not draining, not within the safety margin of the lease deadline).
2. Split the tick's budget (pacing: ``max_rate_per_s × tick_interval_s``)
   between tenants with :class:`scheduler.fairness.DeficitRoundRobin`
   (weights and rate caps are rows of ``tenants``), and read due timers of
   all firable partitions in one query (``select_due_jobs``): per tenant,
   oldest due first ((next_due_at, partition_id, job_id) order), up to its
   quota; budget left by tenants with little due work goes to the others in
   a second pass, sent once the first pass's chunks have committed (fair
   shares first). Herds (below) are taken out of this path first.
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

Herds
-----
At a midnight the timers due in a tick are mostly *herds*: thousands of one
tenant's timers due at the same instant, sharing a few dozen schedules.
Shipping each timer to the node and back (steps 2-4) costs more than firing
it, so each pass first looks at the head of the fair set of every tenant
whose quota is at least :data:`HERD_MIN_JOBS`: its oldest due instant, if at
least that many of its timers are due then (``herd_heads``: index entries
only). For such a herd the node counts the instant's timers per firable
partition in partition order and takes whole partitions while they fit in
the quota (``herd_counts``), learns the herd's schedules from a sample of
its timers (``herd_schedules``, :data:`HERD_SAMPLE`), plans each schedule
once, and fires the herd with ``fire_group``: per slice of its partitions,
one fenced statement in which the store finds the herd's timers itself
(exact index probes per partition, so a node never reads another node's
rows), advances each to its schedule's next slot and inserts its run. No
timer travels; the store does ~14 µs of work per run instead of ~25 µs, and
the node almost none. A timer is fired this way only if it is jitter-free
and its schedule's plan is exactly "fire this slot, then the next one" (on
time, no catch-up, nothing skipped); every other timer of the instant stays
due, and once too few are left to form a herd the per-timer path fires them
(a tick later at most). A tenant's timers due after its herd's instant wait
for the next pass or tick; the herd's partitions come in partition order,
so within an instant a tenant is served in (partition, job id) order by
both paths. A timer edited between the plan and the statement no longer
matches its plan row (or its slot) and is left due for the next tick.
Measured effect in docs/performance.md.

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
are re-sent at once on a fresh session, each retried whole with backoff.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime

import psycopg
from psycopg.rows import tuple_row

from scheduler import log, store, tzreplan
from scheduler.clock import Clock
from scheduler.coordination.table import LeaseTable
from scheduler.errors import SchedulerError, ValidationError
from scheduler.fairness import DeficitRoundRobin, TokenBucket, node_share_of_cap
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

HERD_MIN_JOBS = 1_000
"""A tenant's timers due at one instant form a *herd* (fired by ``fire_group``,
see "Herds" in the module doc) when at least this many of them are in one
pass's fair set; smaller groups go through the per-timer path, whose fixed
costs are lower. Each herd costs a few index probes per firable partition
(``herd_heads``, ``herd_schedules``, ``fire_group``): ~6 ms with 1,024
partitions, what the per-timer path spends on ~300 timers. Tenants with a
smaller quota are not probed; the others' size is tested by walking at most
this many index entries first."""

FIRST_PASS_HERD_QUOTA = 10_000
"""The first pass of a tick looks for herds only among tenants whose fair share
is at least this large; the others' first-pass share (all of a small
tenant's due work) goes per timer, and a big tenant's herd is found in the
surplus pass, where only saturated tenants are looked at. Looking costs
index probes per tenant whose heap checks, at the start of a midnight tick
when every node is updating the same pages, took up to a second per node
for 51 tenants (4 nodes on 2 cores); the per-timer path serves a 2,000-run
share in a few tens of milliseconds."""

HERD_MAX_SCHEDULES = 1_000
"""Plans sent with a herd's chunks at most (they travel with every chunk);
timers of further schedules stay due for the per-timer path."""

HERD_COUNT_BATCH = 256
"""Partitions counted per ``herd_counts`` query while sizing a herd."""

HERD_SAMPLE = 4_096
"""Timers read (spread evenly over the herd's partitions) to learn a herd's
schedules. A schedule held by fewer than ~1/1000 of the herd's timers may be
missed; its timers then stay due and go through the per-timer path."""

_LAST_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
NO_CURSOR = (datetime(1, 1, 1, tzinfo=UTC), -1, "00000000-0000-0000-0000-000000000000")
"""(next_due_at, partition_id, job_id) before every timer: a pass's cursor when
it starts from the oldest due timer (see select_due_jobs in sql/queries.sql)."""
_NIL_UUID = uuid.UUID(int=0)  # plan_job's job id where jitter is 0 (unused)

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
    herd_fired: int = 0  # of ``fired``, through fire_group (see "Herds")
    skipped_ranges: int = 0
    fence_rejected: list[int] = dataclasses.field(default_factory=list)
    stale_jobs: int = 0
    lags_s: list[float] = dataclasses.field(default_factory=list)
    budget_exhausted: bool = False
    replanned: int = 0  # jobs moved to their true slot (scheduler/tzreplan.py)


def _array_literal(values: list) -> str:
    """``values`` (ints or UUID strings) as a PostgreSQL array literal ``'{a,b,...}'``.

    One ``str.join`` in C: psycopg's binary list dumper walks the list in
    Python (~1 µs per element, a third of the node's CPU in a herd), while the
    store parses a literal of 5,000 ints in well under a millisecond.
    """
    return "{" + ",".join(map(str, values)) + "}"


def _epochs_literal(firable: dict[int, int]) -> str:
    """The fencing epoch of every partition, ``'{e0,e1,...}'`` indexed by partition id
    (1-based in SQL: partition p at p + 1), NULL where not held: the fences'
    expected epochs, looked up by subscript."""
    return _array_literal(["NULL" if firable.get(pid) is None else firable[pid] for pid in range(PARTITION_COUNT)])


class _Batch:
    """Column arrays for one ``fire_runs`` statement (see its comment in sql/queries.sql).

    Jobs are scalars (partition, id, revision, plan number); what to do with
    them is in the plan arrays, one entry per distinct outcome (next slot,
    runs, skip), so a herd of jobs sharing a schedule and slot shares one
    plan. A plan's runs are ``f_*[p_fire_lo - 1 : p_fire_hi]``; its skip is
    ``s_*[p_skip - 1]`` (0: none). Numbers are 1-based (SQL arrays).
    """

    __slots__ = (
        "pids",
        "jids",
        "revs",
        "plans",
        "p_from",
        "p_next_nominal",
        "p_next_due",
        "p_fire_lo",
        "p_fire_hi",
        "p_skip",
        "f_nominal",
        "f_scheduled",
        "s_first",
        "s_until",
        "s_slots",
        "s_reasons",
        "partitions",
        "plan_numbers",
    )

    def __init__(self) -> None:
        for name in self.__slots__[:-2]:
            setattr(self, name, [])
        self.partitions: set[int] = set()
        self.plan_numbers: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self.pids)

    def add_plan(self, plan, from_nominal) -> int:
        """Append ``plan`` (a :class:`scheduler.planner.Plan`) made for jobs whose
        stored next slot was ``from_nominal``; return its number (1-based).

        The statement advances a job only if its slot is still ``from_nominal``
        and the plan's next slot is later (compare-and-set, forward only).
        """
        self.p_from.append(from_nominal)
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

    def params(self, node_id: str, firable: dict[int, int], now: datetime | None) -> dict:
        """The statement's parameters; ``now`` is the store clock's pin (None in production)."""
        fence = sorted(self.partitions)
        position = {pid: i for i, pid in enumerate(fence, 1)}
        params = {name: getattr(self, name) for name in self.__slots__[4:-2]}
        params.update(
            pids=_array_literal(self.pids),
            jids=_array_literal(self.jids),
            revs=_array_literal(self.revs),
            plans=_array_literal(self.plans),
            fpos=_array_literal([position[pid] for pid in self.pids]),
            node_id=node_id,
            fence_pids=fence,
            fence_epochs=[firable[pid] for pid in fence],
            epochs=_epochs_literal(firable),
            now=now,
        )
        return params


@dataclasses.dataclass
class _Herd:
    """One herd of a pass (see "Herds" above): the ``jobs`` timers of ``tenant`` due
    at ``due`` in the firable partitions ``pids`` (ascending, whole partitions;
    when the pass's cursor is inside the instant, ``after`` = its (partition,
    job id) and only the timers after it), and the ``fire_group`` plan arrays
    of their schedules. ``cut``: the pass's quota ran out inside the instant
    (the tenant is saturated)."""

    tenant: str
    due: object  # datetime (aware UTC)
    pids: list[int]
    jobs: int
    cut: bool
    after: tuple[int, str] | None = None
    plans: dict[str, list] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Sent:
    """A chunk queued on the pipeline: its statement (``query`` name and
    ``params``, for a re-send), the partitions it fences, the per-timer
    ``batch`` (``None`` for a herd chunk), its statement's and its COMMIT's
    cursors, and once waited for, ``outcome`` = (the statement's row, COMMIT
    succeeded)."""

    query: str
    params: dict
    partitions: set[int]
    batch: _Batch | None
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

    Lifecycle (CONTRIBUTING.md rule 6): :meth:`tick` is one iteration (tests call it);
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
        self._replan: list[tuple[int, str]] = []  # this tick's jobs whose stored slot is no slot

    # ------------------------------------------------------------------ store

    def _connection(self, role: str) -> psycopg.Connection:
        """The ``read`` (due scan) or ``write0``, ``write1`` (firing lanes) connection."""
        conn = self._conns.get(role)
        if conn is None or conn.closed:
            s = self._s
            conn = self._conns[role] = store.node_connect(s, f"scheduler-fire:{s.node_id}")
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
        # Numbered, not locked: the lease loop releases a draining partition only
        # after the tick that may fire it has ended, without ever waiting for it.
        number, firable = self._table.begin_tick()
        try:
            if firable:
                try:
                    self._tick(firable, result)
                except (psycopg.Error, SchedulerError, OSError) as exc:
                    self._metrics.error(getattr(exc, "sqlstate", None))
                    log.event(
                        "tick_failed",
                        logging.WARNING,
                        node=self._s.node_id,
                        error=(str(exc).splitlines() or [type(exc).__name__])[0],
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
        self._replan.clear()
        try:
            with contextlib.ExitStack() as pipelines:
                for lane in lanes:
                    pipelines.enter_context(lane.pipeline())
                self._pass(read, lanes, firable, quotas, {}, granted, fetched, used, last, sent, result)
                saturated = {t: weights[t] for t, q in quotas.items() if q > 0 and fetched[t] >= q}
                leftover = budget - sum(fetched.values())
                if leftover > 0 and saturated:
                    left_limits = (
                        None if limits is None else {t: limits[t] - quotas[t] for t in saturated if t in limits}
                    )
                    extra = DeficitRoundRobin.redistribute(leftover, saturated, left_limits)
                    for tenant, quota in extra.items():
                        granted[tenant] += quota
                    # Fair shares first: the first pass holds every tenant's
                    # share, so all of a small tenant's due work. Its chunks
                    # commit before the surplus is streamed, planned and sent,
                    # so the big tenants' extra runs never take the CPU from
                    # them; measured in the 5 M-job herd: small tenants' lag
                    # p99 1.0-1.24 s -> 0.72-0.85 s (docs/performance.md).
                    # The surplus's herds (index probes and a small sample)
                    # are looked up meanwhile, shortening the bubble.
                    after = dict(last)
                    herds = self._find_herds(read, firable, extra, after)
                    for item in sent:
                        item.wait()
                    self._pass(read, lanes, firable, extra, after, granted, fetched, used, last, sent, result, herds)
        except psycopg.Error as exc:
            failed = self._collect(sent, result)
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
                row = store.run_transaction(
                    write,
                    lambda c, item=item: store.execute(c, item.query, item.params, prepare=FIRE_RUNS_PREPARE)[0],
                    on_retry=self._metrics.retry,
                )
                self._account(item, row, result)
        else:
            self._collect(sent, result)
        if self._replan:
            self._replan_slots(result)
        result.due_read = sum(fetched.values())
        self._drr.charge(used, quotas)
        for tenant, bucket in self._buckets.items():
            bucket.tokens -= used.get(tenant, 0)
        if any(fetched[t] >= q > 0 for t, q in granted.items()):
            result.budget_exhausted = True
        self._metrics.due_backlog.set(sum(granted.values()) if result.budget_exhausted else 0)

    def _pass(
        self,
        read: psycopg.Connection,
        lanes: list[psycopg.Connection],
        firable: dict[int, int],
        quotas: dict[str, int],
        after: dict[str, tuple],
        granted: dict[str, int],
        fetched: Counter,
        used: Counter,
        last: dict[str, tuple],
        sent: list,
        result: TickResult,
        herds: dict[str, _Herd] | None = None,
    ) -> None:
        """One pass over ``quotas`` (after the cursors ``after``): herds through
        ``fire_group``, every other tenant's fair set per timer.

        A herd is the head of its tenant's fair set; the tenant's timers due
        after it wait for the next pass or tick, and its cursor moves past
        the herd's last partition. Tenants are served smallest quota first
        throughout (the per-timer chunks of small tenants go out before the
        herds'). ``herds``: this pass's, if already looked up (the surplus
        pass); otherwise looked up here among shares of at least
        :data:`FIRST_PASS_HERD_QUOTA` (the first pass).
        """
        if herds is None:
            herds = self._find_herds(read, firable, quotas, after, FIRST_PASS_HERD_QUOTA)
        rest = {t: q for t, q in quotas.items() if t not in herds}
        self._stream(read, lanes, firable, rest, after, granted, fetched, used, last, sent, result)
        for tenant in sorted(herds, key=lambda t: (quotas[t], t)):
            herd = herds[tenant]
            self._send_herd(lanes, firable, herd, sent)
            before = fetched[tenant]
            fetched[tenant] += herd.jobs
            used[tenant] += herd.jobs
            if herd.cut:  # the quota ran out in the herd: saturated, whatever it fetched
                fetched[tenant] = max(fetched[tenant], before + quotas[tenant])
            last[tenant] = (herd.due, herd.pids[-1], _LAST_UUID)

    def _find_herds(
        self,
        read: psycopg.Connection,
        firable: dict[int, int],
        quotas: dict[str, int],
        after: dict[str, tuple],
        min_quota: int = 0,
    ) -> dict[str, _Herd]:
        """This pass's herds, at most one per tenant, planned.

        Only tenants with a quota of at least ``min_quota`` (and
        :data:`HERD_MIN_JOBS`) are looked at.
        A tenant's herd is its oldest due instant after its cursor (the head
        of its fair set), whole partitions of it in partition order, from the
        one after the cursor's (if the cursor is inside the instant) while
        they fit in its quota, when that is at least :data:`HERD_MIN_JOBS`
        timers. Its plans are those of the schedules found in a sample of
        its jitter-free timers (:data:`HERD_SAMPLE`) whose plan is exactly
        "fire this slot, then the next" (at most :data:`HERD_MAX_SCHEDULES`);
        a candidate with none is dropped and the per-timer path serves the
        tenant. Timers the plans do not cover stay due: when too few are left
        at the instant to form a herd, the per-timer path fires them. Reads
        ``herd_heads``, then per herd ``herd_counts`` (:meth:`_herd_extent`)
        and ``herd_schedules``.
        """
        tenants = sorted(t for t, q in quotas.items() if q >= max(min_quota, HERD_MIN_JOBS))
        if not tenants:
            return {}
        cursors = [after.get(t, NO_CURSOR) for t in tenants]
        heads = store.execute(
            read,
            "herd_heads",
            {
                "tenants": tenants,
                "after_due": [c[0] for c in cursors],
                "after_pid": [c[1] for c in cursors],
                "after_job": [uuid.UUID(c[2]) for c in cursors],
                "partition_ids": list(firable),
                "min_jobs": HERD_MIN_JOBS,
                "now": self._clock.store_now_or_none(),
            },
        )
        herds: dict[str, _Herd] = {}
        for head in heads:
            herd = self._herd_extent(
                read, firable, head["tenant"], head["due"], quotas[head["tenant"]], after.get(head["tenant"])
            )
            if herd is not None:
                herds[herd.tenant] = herd
        for tenant, herd in list(herds.items()):
            rows = store.execute(
                read,
                "herd_schedules",
                {
                    "tenant": tenant,
                    "due": herd.due,
                    "pids": herd.pids,
                    "per_partition": max(1, -(-HERD_SAMPLE // max(1, len(herd.pids)))),
                    "now": self._clock.store_now_or_none(),
                },
            )
            plans = [(row, self._herd_plan(row, herd.due)) for row in rows]
            plans = [(row, nxt) for row, nxt in plans if nxt is not False][:HERD_MAX_SCHEDULES]
            if not plans:
                del herds[tenant]
                continue
            for row, next_nominal in plans:
                for name, value in (
                    ("kinds", row["kind"]),
                    ("cron_exprs", row["cron_expr"]),
                    ("cron_dialects", row["cron_dialect"]),
                    ("tzs", row["tz"]),
                    ("interval_ss", row["interval_s"]),
                    ("anchor_ats", row["anchor_at"]),
                    ("fire_ats", row["fire_at"]),
                    ("misfires", row["misfire"]),
                    ("catchup_window_ss", row["catchup_window_s"]),
                    ("misfire_grace_ss", row["misfire_grace_s"]),
                    ("next_nominals", next_nominal),
                ):
                    herd.plans.setdefault(name, []).append(value)
        return herds

    def _herd_extent(
        self, read: psycopg.Connection, firable: dict[int, int], tenant: str, due, quota: int, cursor: tuple | None
    ) -> _Herd | None:
        """The partitions of ``tenant``'s herd at ``due`` that fit in ``quota``.

        Counts the herd's timers per firable partition in partition order
        (``herd_counts``, :data:`HERD_COUNT_BATCH` partitions a query) from
        the cursor's partition (if the cursor is inside the instant) until
        the quota is reached, so the probes follow what the pass can fire.
        Returns ``None`` if fewer than :data:`HERD_MIN_JOBS` timers fit.
        """
        inside = cursor is not None and cursor[0] == due
        lo = cursor[1] if inside else 0
        pids = [pid for pid in sorted(firable) if pid >= lo]
        taken: list[int] = []
        jobs, cut = 0, False
        for i in range(0, len(pids), HERD_COUNT_BATCH):
            batch = pids[i : i + HERD_COUNT_BATCH]
            rows = store.execute(
                read,
                "herd_counts",
                {
                    "tenant": tenant,
                    "due": due,
                    "pids": batch,
                    "after_pid": cursor[1] if inside else None,
                    "after_job": uuid.UUID(cursor[2]) if inside else None,
                },
            )
            counts = {row["partition_id"]: row["n"] for row in rows}
            for pid in batch:
                n = counts.get(pid, 0)
                if jobs + n > quota:
                    cut = True
                    break
                jobs += n
                taken.append(pid)
            if cut:
                break
        if jobs < HERD_MIN_JOBS:
            return None
        return _Herd(tenant, due, taken, jobs, cut, after=(cursor[1], cursor[2]) if inside else None)

    def _herd_plan(self, row: dict, due):
        """The next slot after ``due`` of a ``herd_schedules`` row (``None``: the
        schedule ends), or ``False`` if its timers need the per-timer planner."""
        key = (
            row["kind"],
            row["cron_expr"],
            row["cron_dialect"],
            row["tz"],
            row["interval_s"],
            row["anchor_at"],
            row["fire_at"],
        )
        try:
            schedule = self._schedules.for_key(key)
        except ValidationError:
            return False  # the per-timer path logs it, per job
        if row["kind"] == "cron" and not tzreplan.is_slot(schedule, due):
            return False  # stored under other tzdata rules: the per-timer path replans it
        now = row["store_now"]
        plan = plan_job(
            schedule,
            job_id=_NIL_UUID,
            next_nominal=due,
            now=now,
            misfire=row["misfire"],
            catchup_window_s=row["catchup_window_s"],
            misfire_grace_s=row["misfire_grace_s"],
            jitter_s=0,
            limit=2,
        )
        if plan.skip is not None or plan.fires != [(due, due)]:
            return False  # catch-up, skipped slots, a policy's choice of slot
        if plan.next_nominal is not None and plan.next_nominal <= now:
            return False  # the next slot is due too: catch-up
        return plan.next_nominal

    def _send_herd(self, lanes: list[psycopg.Connection], firable: dict[int, int], herd: _Herd, sent: list) -> None:
        """Queue ``herd``'s ``fire_group`` chunks: its firable partitions in
        contiguous slices of about :data:`CHUNK_JOBS` timers."""
        pids = herd.pids
        slices = min(len(pids), max(1, -(-herd.jobs // CHUNK_JOBS)))
        size = -(-len(pids) // slices)
        epochs = _epochs_literal(firable)
        for i in range(0, len(pids), size):
            chunk = pids[i : i + size]
            # The cursor bound holds trivially for partitions after the
            # cursor's, so every chunk carries it.
            params = dict(
                herd.plans,
                tenant=herd.tenant,
                due=herd.due,
                pids=chunk,
                lo_pid=herd.after and herd.after[0],
                lo_job=herd.after and herd.after[1],
                epochs=epochs,
                node_id=self._s.node_id,
                now=self._clock.store_now_or_none(),
            )
            sent.append(self._send(lanes[len(sent) % len(lanes)], "fire_group", params, set(chunk)))

    def _stream(
        self,
        read: psycopg.Connection,
        lanes: list[psycopg.Connection],
        firable: dict[int, int],
        quotas: dict[str, int],
        after: dict[str, tuple],
        granted: dict[str, int],
        fetched: Counter,
        used: Counter,
        last: dict[str, tuple],
        sent: list,
        result: TickResult,
    ) -> None:
        """Stream due rows for ``quotas`` (after the cursors ``after``);
        plan and send a firing statement per chunk.

        Tenants with the smallest quotas come first, so small tenants' runs are
        in the first statements of the tick. Chunks are pipelined on
        ``lanes`` (BEGIN; fire_runs; COMMIT per chunk, round robin): the
        store executes them while this thread plans the next.
        """
        tenants = sorted((t for t, q in quotas.items() if q > 0), key=lambda t: (quotas[t], t))
        if not tenants:
            return
        cursors = [after.get(t, NO_CURSOR) for t in tenants]
        params = {
            "tenants": tenants,
            "quotas": [quotas[t] for t in tenants],
            "after_due": [c[0] for c in cursors],
            "after_pid": [c[1] for c in cursors],
            "after_job": [uuid.UUID(c[2]) for c in cursors],
            "partition_ids": list(firable),
            "now": self._clock.store_now_or_none(),
        }
        batch = _Batch()
        with read.cursor(row_factory=tuple_row) as cur:
            for row in cur.stream(store.QUERIES["select_due_jobs"], params, size=STREAM_ROWS):
                tenant = row[_TENANT]
                fetched[tenant] += 1
                last[tenant] = (row[_NEXT_DUE], row[_PARTITION], row[_JOB_ID])
                self._plan_row(batch, row, firable, granted, used, result)
                if len(batch.pids) >= CHUNK_JOBS:
                    sent.append(self._send_batch(lanes[len(sent) % len(lanes)], batch, firable))
                    batch = _Batch()
        if batch.pids:
            sent.append(self._send_batch(lanes[len(sent) % len(lanes)], batch, firable))

    def _send_batch(self, write: psycopg.Connection, batch: _Batch, firable: dict[int, int]) -> _Sent:
        """Queue one per-timer chunk (``fire_runs``) on the pipelined ``write`` connection."""
        params = batch.params(self._s.node_id, firable, self._clock.store_now_or_none())
        sent = self._send(write, "fire_runs", params, batch.partitions)
        sent.batch = batch
        return sent

    def _send(self, write: psycopg.Connection, query: str, params: dict, partitions: set[int]) -> _Sent:
        """Queue one chunk's transaction (BEGIN; ``query``; COMMIT) on the pipelined ``write`` connection."""
        write.execute("BEGIN")
        cur = write.cursor()
        cur.execute(store.QUERIES[query], params, prepare=FIRE_RUNS_PREPARE)
        return _Sent(query, params, partitions, None, cur, write.execute("COMMIT"))

    def _collect(self, sent: list[_Sent], result: TickResult) -> list[_Sent]:
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
                failed.append(item)
            else:
                self._account(item, row, result)
        sent.clear()
        return failed

    def _replan_slots(self, result: TickResult) -> None:
        """Move this tick's jobs whose stored slot is not a slot under this node's
        tzdata (set aside by :meth:`_plan_row`) to their true slot; a later tick
        fires it (scheduler/tzreplan.py). Re-reads them: one compare-and-set
        transaction on the first write connection."""
        conn = self._connection("write0")
        rows = store.execute(
            conn,
            "jobs_by_keys",
            {"pids": [pid for pid, _ in self._replan], "jids": [uuid.UUID(j) for _, j in self._replan]},
        )
        items = []
        for row in rows:
            if row["kind"] != "cron" or row["next_nominal_at"] is None:
                continue
            try:
                if not tzreplan.is_slot(self._schedules.for_row(row), row["next_nominal_at"]):
                    items.append(tzreplan.replan_item(row))
            except ValidationError:
                continue
        result.replanned = tzreplan.replan_jobs(conn, items, self._schedules)
        self._metrics.slots_replanned.inc(result.replanned)

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
                bucket = self._buckets[tenant] = TokenBucket(
                    rate, burst, burst if bucket is None else min(burst, bucket.tokens), now_s
                )
            limits[tenant] = int(bucket.refill(now_s))
        return limits or None

    def _plan_row(
        self,
        batch: _Batch,
        row: tuple,
        firable: dict[int, int],
        granted: dict[str, int],
        used: Counter,
        result: TickResult,
    ) -> None:
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
        if row[_SCHEDULE][0] == "cron" and not tzreplan.is_slot(schedule, row[_NEXT_NOMINAL]):
            # Stored under other tzdata rules: never fired as stored (an early
            # run, then a second one); replanned at the end of the tick.
            self._replan.append((row[_PARTITION], row[_JOB_ID]))
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
                schedule,
                job_id=uuid.UUID(row[_JOB_ID]),
                next_nominal=row[_NEXT_NOMINAL],
                now=now,
                misfire=row[_MISFIRE],
                catchup_window_s=row[_CATCHUP],
                misfire_grace_s=row[_GRACE],
                jitter_s=jitter_s,
                limit=remaining,
            )
            if key is not None and len(plan.fires) <= 1 and plan.skip is None:
                self._plan_memo[key] = plan
            else:
                key = None  # a plan of this job alone (jitter, catch-up, skip)
        number = batch.plan_numbers.get(key) if key is not None else None
        if number is None:
            number = batch.add_plan(plan, row[_NEXT_NOMINAL])
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

    def _account(self, item: _Sent, row: dict, result: TickResult) -> None:
        """Count one committed chunk; drop leases the fence rejected."""
        fenced = set(row["fenced"])
        rejected = sorted(item.partitions - fenced)
        if rejected:
            self._table.drop(rejected)
            result.fence_rejected.extend(rejected)
            self._metrics.fence_rejections.inc(len(rejected))
            self._metrics.lease_events.labels(kind="lost").inc(len(rejected))
            log.event(
                "fence_rejected", logging.WARNING, node=self._s.node_id, partitions=len(rejected), sample=rejected[:8]
            )
        if item.batch is not None:
            stale = sum(1 for pid in item.batch.pids if pid in fenced) - row["advanced"]
            if stale > 0:
                result.stale_jobs += stale
                self._metrics.stale_jobs.inc(stale)
            result.skipped_ranges += row["skipped"]
            self._metrics.slots_skipped.inc(row["skipped"])
        else:
            result.herd_fired += row["inserted"]
            self._metrics.herd_runs_fired.inc(row["inserted"])
        lags = row["lags_s"] if item.batch is not None else [row["lag_s"]] * row["inserted"]
        result.fired += row["inserted"]
        result.lags_s.extend(lags)
        self._metrics.runs_fired.inc(row["inserted"])
        self._metrics.dispatch_lag.observe_many(lags)

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
