"""Herds: thousands of one tenant's timers due at one instant, fired in the store.

At a midnight the timers due in a tick are mostly *herds*: thousands of one
tenant's timers due at the same instant, holding anything from a few dozen
to tens of thousands of distinct schedules (the same ``0 0 * * *`` in
hundreds of zones, its weekday and every-six-hours cousins, a long tail).
Shipping each timer to the node and back (the per-timer path,
:mod:`scheduler.firing.batch`) costs more than firing it, so each pass first
looks at the head of the fair set of every tenant whose quota is at least
:attr:`~scheduler.firing.limits.FiringLimits.herd_min_jobs`: its oldest due
instant, if at least that many of its timers are due then (``herd_heads``:
index entries only). For such a herd the node counts the instant's timers
per firable partition in partition order and takes whole partitions while
they fit in the quota (``herd_counts``), reads the herd's distinct schedule
keys with their counts from the due index (``herd_schedule_keys``: index
entries only; every job carries the key of its spec, see
:mod:`scheduler.identity`), plans each key once (its spec from the
``schedules`` table, cached forever: a key's spec never changes; the plan
memoized per (key, instant) across ticks), and fires the herd with
``fire_group``: per slice of its partitions, one fenced statement in which
the store finds the herd's timers itself (exact index probes per
partition, so a node never reads another node's rows), joins them with the
plans by key, advances each to its plan's next slot and inserts its run.
No timer travels; the store does ~14 µs of work per run instead of ~25 µs,
and the node almost none.

Herds are measured ahead when possible: in the waits between ticks the
look-ahead (:mod:`scheduler.firing.lookahead`) has the finder read, for the
coming seconds, each herd's timer count and schedule keys per firable
partition (``lookahead_herds``, :meth:`HerdFinder.read_ahead`), so at the
instant :meth:`~HerdFinder.extent` and the plans take them from memory
instead of ``herd_counts`` and ``herd_schedule_keys``. Read at the instant,
those walk every timer of the herd while the first pass's updates have
just cleared the pages' all-visible bits: each index entry a heap visit,
0.35-1.0 s of store time in the 5 M-job herd's first two seconds, beside the
small tenants' firing and claims (docs/performance.md, "2026-12-04,
evening"); read seconds before, the same walk is index entries only. What
was read ahead is only a measure: a partition is taken from it only under
the fencing epoch it was read under (otherwise the herd is counted at the
instant, as before), the cursor's own partition is always counted at the
instant, and the partitions a herd fired are zeroed (a failed tick forgets
everything). A timer added, edited or re-keyed after the read is still
found by ``fire_group`` itself, or stays due for the per-timer path: counts
only size a pass's share, they never decide what fires.

A timer's overlap policy (docs/delivery.md) is applied by ``fire_group``
itself, in the same statement and tick: ``allow`` timers (nearly all) take
the plain insert; the others are checked against their unfinished runs
(``runs_overlap_idx``) and fired, left waiting, skipped or made to replace.

A timer is fired this way only if it is jitter-free and its key's plan is
exactly "fire this slot, then the next one" (on time within its misfire
policy, no catch-up, nothing skipped, a slot under this node's tzdata);
every other timer of the instant stays due, and the per-timer path fires
it: a herd whose planned keys cover fewer than ``herd_min_jobs`` timers is
dropped at once (the per-timer path serves the tenant in this pass), and
the remainder of a fired herd is too small to form a herd again next tick.
Keys past ``herd_max_schedules`` (the rarest) are left to the next tick. A
tenant's timers due after its herd's instant wait for the next pass or
tick; the herd's partitions come in partition order, so within an instant a
tenant is served in (partition, job id) order by both paths. A timer edited
between the plan and the statement no longer has its key or slot and is
left due for the next tick. Measured effect in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from datetime import datetime, timedelta

import psycopg

from scheduler import store, tzreplan
from scheduler.clock import Clock
from scheduler.errors import ValidationError
from scheduler.firing.limits import FiringLimits
from scheduler.firing.state import NO_CURSOR, Tick
from scheduler.planner import plan_job
from scheduler.spec import ScheduleCache

_NIL_UUID = uuid.UUID(int=0)  # plan_job's job id where jitter is 0 (unused)

AHEAD_KEEP_S = 60.0
"""A herd measured ahead is kept until this long after its instant (seconds): a
herd larger than a tick's budget is fired over several ticks, each taking its
partitions from the same measure."""


@dataclasses.dataclass
class AheadHerd:
    """A herd measured ahead (``lookahead_herds``): ``epochs``, the firable
    partitions when it was read (partition id → fencing epoch); ``counts``,
    its timers per partition (partitions holding none left out); ``keys``,
    per partition its schedule keys' counts (``[(key, n)]``; timers without
    a key count in ``counts`` only). Partitions a herd fired since are zeroed
    (:meth:`HerdFinder.send`)."""

    epochs: dict[int, int]
    counts: dict[int, int]
    keys: dict[int, list[tuple[int, int]]]

    def fits(self, firable: dict[int, int], pids: list[int]) -> bool:
        """Whether every one of ``pids`` was read under its epoch in ``firable``."""
        epochs = self.epochs
        return all(epochs.get(pid) == firable[pid] for pid in pids)


@dataclasses.dataclass
class Herd:
    """One herd of a pass: the ``jobs`` timers of ``tenant`` due at ``due`` (aware
    UTC) in the firable partitions ``pids`` (ascending, whole partitions;
    when the pass's cursor is inside the instant, ``after`` = its (partition,
    job id) and only the timers after it), and the ``fire_group`` plan arrays
    of its schedule keys (``plans``: ``schedule_keys`` and ``next_nominals``,
    one entry per planned key, dumped once for all its chunks).
    ``cut``: the pass's quota ran out inside the instant (the tenant is
    saturated)."""

    tenant: str
    due: datetime
    pids: list[int]
    jobs: int
    cut: bool
    after: tuple[int, str] | None = None
    plans: dict[str, store.FrozenArray] = dataclasses.field(default_factory=dict)
    ahead: AheadHerd | None = None
    """The measure its partitions were taken from, if read ahead (its keys come
    from it too)."""
    store_now: datetime | None = None
    """The store's clock when the herd was found (``herd_heads``): the ``now`` its plans are made for."""


@dataclasses.dataclass(frozen=True)
class HerdSlot:
    """The plan of a herd's schedule: fire the herd's slot, then move to
    ``next_nominal`` (None: the schedule ends after it)."""

    next_nominal: datetime | None


class HerdFinder:
    """Finds, plans and sends a pass's herds for one firer (see the module doc).

    ``schedules`` is the firer's schedule cache, ``clock`` its injected clock
    (its store pin is each query's ``now``), ``limits`` its thresholds.
    """

    def __init__(self, node_id: str, schedules: ScheduleCache, clock: Clock, limits: FiringLimits) -> None:
        self._node_id = node_id
        self._schedules = schedules
        self._clock = clock
        self._limits = limits
        self._specs: dict[int, store.Row] = {}
        self._ahead: dict[tuple[str, datetime], AheadHerd] = {}

    def find(self, tick: Tick, quotas: dict[str, int], after: dict[str, tuple], min_quota: int = 0) -> dict[str, Herd]:
        """This pass's herds, at most one per tenant, planned.

        Only tenants with a quota of at least ``min_quota`` (and
        ``herd_min_jobs``) are looked at. A tenant's herd is its oldest due
        instant after its cursor in ``after`` (the head of its fair set),
        whole partitions of it in partition order, from the one after the
        cursor's (if the cursor is inside the instant) while they fit in its
        quota, when that is at least ``herd_min_jobs`` timers. Its plans are
        those of its schedule keys (most common first, at most
        ``herd_max_schedules``) whose plan is exactly "fire this slot, then
        the next"; a candidate whose planned keys cover fewer than
        ``herd_min_jobs`` timers is dropped and the per-timer path serves
        the tenant. Reads ``herd_heads``, then per herd ``herd_counts``
        (:meth:`extent`), ``herd_schedule_keys`` and, for keys not seen
        before, ``schedules_by_keys``; a herd measured ahead
        (:meth:`read_ahead`) reads at most the cursor's partition's count.
        """
        limits = self._limits
        tenants = sorted(t for t, q in quotas.items() if q >= max(min_quota, limits.herd_min_jobs))
        if not tenants:
            return {}
        cursors = [after.get(t, NO_CURSOR) for t in tenants]
        heads = store.execute(
            tick.read,
            "herd_heads",
            {
                "tenants": tenants,
                "after_due": [c[0] for c in cursors],
                "after_pid": [c[1] for c in cursors],
                "after_job": [uuid.UUID(c[2]) for c in cursors],
                "partition_ids": list(tick.firable),
                "min_jobs": limits.herd_min_jobs,
                "now": self._clock.store_now_or_none(),
            },
        )
        herds: dict[str, Herd] = {}
        for head in heads:
            herd = self.extent(tick, head["tenant"], head["due"], quotas[head["tenant"]], after.get(head["tenant"]))
            if herd is not None:
                herd.store_now = head["store_now"]
                if self._planned(tick, herd):
                    herds[herd.tenant] = herd
        return herds

    def _key_counts(self, tick: Tick, herd: Herd) -> list[tuple[int, int]]:
        """The herd's schedule keys with their timer counts, most common first (then
        by key), at most ``herd_max_schedules``: from its measure read ahead, or
        ``herd_schedule_keys``."""
        if herd.ahead is not None:
            total: Counter[int] = Counter()
            keys = herd.ahead.keys
            for pid in herd.pids:
                for key, n in keys.get(pid, ()):
                    total[key] += n
            ranked = sorted(total.items(), key=lambda kn: (-kn[1], kn[0]))
            return ranked[: self._limits.herd_max_schedules]
        rows = store.execute(
            tick.read,
            "herd_schedule_keys",
            {
                "tenant": herd.tenant,
                "due": herd.due,
                "pids": herd.pids,
                "after_pid": herd.after and herd.after[0],
                "after_job": herd.after and uuid.UUID(herd.after[1]),
                "max_keys": self._limits.herd_max_schedules,
            },
        )
        return [(row["schedule_key"], row["n"]) for row in rows]

    def _planned(self, tick: Tick, herd: Herd) -> bool:
        """Fill ``herd.plans`` from its schedule keys; False if they cover fewer
        than ``herd_min_jobs`` of its timers (then the herd is not fired)."""
        counted = self._key_counts(tick, herd)
        if not counted:
            return False
        self._load_specs(tick.read, [key for key, _ in counted])
        keys: list[int] = []
        nexts: list[datetime | None] = []
        covered = 0
        now = herd.store_now
        assert now is not None
        for key, n in counted:
            slot = self.plan(key, herd.due, now)
            if slot is not None:
                keys.append(key)
                nexts.append(slot.next_nominal)
                covered += n
        if covered < self._limits.herd_min_jobs:
            return False
        # Dumped once: the plans travel unchanged with every chunk of the herd.
        herd.plans = {
            "schedule_keys": store.FrozenArray(keys, "int8"),
            "next_nominals": store.FrozenArray(nexts, "timestamptz"),
        }
        return True

    def _load_specs(self, conn: psycopg.Connection, keys: list[int]) -> None:
        """Read the ``schedules`` rows of the keys not cached yet (a key's spec
        never changes, so a cached row is never stale)."""
        missing = [key for key in keys if key not in self._specs]
        if not missing:
            return
        if len(self._specs) + len(missing) > self._limits.herd_spec_cache:
            self._specs.clear()  # rare (the fleet's distinct specs outgrew it): start over
        for row in store.execute(conn, "schedules_by_keys", {"schedule_keys": missing}):
            self._specs[row["schedule_key"]] = row

    def extent(self, tick: Tick, tenant: str, due: datetime, quota: int, cursor: tuple | None) -> Herd | None:
        """The partitions of ``tenant``'s herd at ``due`` that fit in ``quota``.

        Counts the herd's timers per firable partition in partition order
        (``herd_counts``, ``herd_count_batch`` partitions a query) from
        the cursor's partition (if the cursor is inside the instant) until
        the quota is reached, so the probes follow what the pass can fire.
        A herd measured ahead (:meth:`read_ahead`) whose partitions all
        have the epochs they were read under takes their counts from the
        measure; only the cursor's partition (timers after the cursor) is
        counted by ``herd_counts``. Returns ``None`` if fewer than
        ``herd_min_jobs`` timers fit.
        """
        inside = cursor is not None and cursor[0] == due
        lo = cursor[1] if inside else 0
        pids = [pid for pid in sorted(tick.firable) if pid >= lo]
        ahead = self._ahead.get((tenant, due))
        if ahead is not None and not ahead.fits(tick.firable, pids):
            ahead = None
        taken: list[int] = []
        jobs, cut = 0, False
        step = self._limits.herd_count_batch
        for i in range(0, len(pids), step):
            batch = pids[i : i + step]
            # Measured ahead, only the cursor's partition (the batch's first) is counted now.
            asked = batch if ahead is None else batch[:1] if inside and i == 0 else []
            counts = {}
            if asked:
                rows = store.execute(
                    tick.read,
                    "herd_counts",
                    {
                        "tenant": tenant,
                        "due": due,
                        "pids": asked,
                        "after_pid": cursor[1] if inside else None,
                        "after_job": uuid.UUID(cursor[2]) if inside else None,
                    },
                )
                counts = {row["partition_id"]: row["n"] for row in rows}
            if ahead is not None:
                counts = {pid: counts.get(pid, 0) if pid in asked else ahead.counts.get(pid, 0) for pid in batch}
            for pid in batch:
                n = counts.get(pid, 0)
                if jobs + n > quota:
                    cut = True
                    break
                jobs += n
                taken.append(pid)
            if cut:
                break
        if jobs < self._limits.herd_min_jobs:
            return None
        return Herd(tenant, due, taken, jobs, cut, after=(cursor[1], cursor[2]) if inside else None, ahead=ahead)

    def read_ahead(
        self,
        conn: psycopg.Connection,
        tenants: list[str],
        firable: dict[int, int],
        after: datetime,
        until: datetime,
        now: datetime,
        budget_s: float,
    ) -> int:
        """Measure the herds of ``tenants`` due in (``after``, ``until``] in the
        ``firable`` partitions (partition id → epoch) ahead of their instant
        (``lookahead_herds``, see the module doc), replacing what was read of
        them before, and forget the herds whose instant is more than
        :data:`AHEAD_KEEP_S` before the store's ``now``, and those of the oldest
        instants while more than ``lookahead_herd_rows`` partitions are kept in
        all. Returns how many herds were measured: 0 for a read cut at
        ``lookahead_herd_rows`` (nothing of it is kept: a cut measure would
        under-count). The read may take at most
        ``budget_s`` seconds (``psycopg.errors.QueryCanceled`` past it, as
        every other store error, propagates; nothing is kept then)."""
        horizon = now - timedelta(seconds=AHEAD_KEEP_S)
        self._ahead = {k: v for k, v in self._ahead.items() if k[1] >= horizon}
        limits = self._limits
        rows = store.execute_within(
            conn,
            "lookahead_herds",
            {
                "tenants": tenants,
                "partition_ids": list(firable),
                "after": after,
                "until": until,
                "min_jobs": limits.herd_min_jobs,
                "max_rows": limits.lookahead_herd_rows,
            },
            budget_s,
        )
        if len(rows) >= limits.lookahead_herd_rows:
            return 0
        epochs = dict(firable)
        measured: dict[tuple[str, datetime], AheadHerd] = {}
        for row in rows:
            herd = measured.get((row["tenant"], row["due"]))
            if herd is None:
                herd = measured[(row["tenant"], row["due"])] = AheadHerd(epochs, {}, {})
            pid = row["partition_id"]
            herd.counts[pid] = row["n"]
            herd.keys[pid] = list(zip(row["keys"], row["key_counts"], strict=True))
        self._ahead.update(measured)
        # Bounded: past lookahead_herd_rows partitions in all, the herds of the oldest
        # instants are forgotten (they are counted at their instant if still due).
        kept = sum(len(herd.counts) for herd in self._ahead.values())
        for key in sorted(self._ahead, key=lambda k: (k[1], k[0])):
            if kept <= limits.lookahead_herd_rows:
                break
            kept -= len(self._ahead.pop(key).counts)
        return len(measured)

    def forget(self) -> None:
        """Drop every herd measured ahead (after a failed tick: which of its
        partitions fired is not known)."""
        self._ahead.clear()

    def prepare(self, conn: psycopg.Connection, pairs: list[tuple[int, datetime]]) -> int:
        """Do ahead of time what planning the (schedule key, due instant) ``pairs``
        will need (:mod:`scheduler.firing.lookahead`): load the keys' specs,
        check the slots and walk to the next ones, all memoized; returns how
        many pairs were prepared. Reads ``schedules_by_keys`` on ``conn`` for
        keys not seen before."""
        self._load_specs(conn, sorted({key for key, _ in pairs}))
        for key, due in pairs:
            self.plan(key, due, due)
        return len(pairs)

    def plan(self, key: int, due: datetime, now: datetime) -> HerdSlot | None:
        """The plan at store time ``now`` of the timers with schedule key ``key``
        whose slot is ``due``, or ``None`` if they need the per-timer planner
        (an unknown key or invalid spec, jitter, a slot that is no slot under
        this node's tzdata, catch-up, skipped slots, a policy's choice).

        The same function of (spec, slot, now) as the per-timer planner's
        (:func:`scheduler.planner.plan_job` with ``limit=2``); the schedule's
        answers (the slot check's among them) are memoized per instant by the
        schedule cache.
        """
        spec = self._specs.get(key)
        if spec is None or spec["jitter_s"] != 0:
            return None
        try:
            schedule = self._schedules.for_row(spec)
        except ValidationError:
            return None  # the per-timer path logs it, per job
        if spec["kind"] == "cron" and not tzreplan.is_slot(schedule, due):
            return None  # stored under other tzdata rules: the per-timer path replans it
        plan = plan_job(
            schedule,
            job_id=_NIL_UUID,
            next_nominal=due,
            now=now,
            misfire=spec["misfire"],
            catchup_window_s=spec["catchup_window_s"],
            misfire_grace_s=spec["misfire_grace_s"],
            jitter_s=0,
            limit=2,
        )
        if plan.skip is not None or plan.fires != [(due, due)]:
            return None  # catch-up, skipped slots, a policy's choice of slot
        if plan.next_nominal is not None and plan.next_nominal <= now:
            return None  # the next slot is due too: catch-up
        return HerdSlot(plan.next_nominal)

    def send(self, tick: Tick, herd: Herd) -> None:
        """Queue ``herd``'s ``fire_group`` chunks on the tick's pipeline: its firable
        partitions in contiguous slices of about ``chunk_jobs`` timers."""
        pids = herd.pids
        slices = min(len(pids), max(1, -(-herd.jobs // self._limits.chunk_jobs)))
        size = -(-len(pids) // slices)
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
                epochs=tick.epochs,
                node_id=self._node_id,
                now=self._clock.store_now_or_none(),
            )
            tick.pipeline.send("fire_group", params, set(chunk))
        if herd.ahead is not None:  # fired (or left due for the per-timer path): none left to count
            for pid in pids:
                herd.ahead.counts.pop(pid, None)
                herd.ahead.keys.pop(pid, None)
