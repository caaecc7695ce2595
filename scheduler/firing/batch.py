"""The per-timer path's encoding: due rows planned into ``fire_runs`` batches.

A due row (a ``select_due_jobs`` tuple) is planned by :class:`RowPlanner`
(:func:`scheduler.planner.plan_job`, memoized) and added to a :class:`Batch`:
column arrays for one ``fire_runs`` statement. A job travels as four
scalars and a plan number; every per-row lookup in the statement is an
array subscript, so its cost is linear whatever plan the store picks.
Next-fire computations are memoized per (schedule, instant), and jitter-free
plans per (schedule, slot, policy, now): a herd of 300,000 jobs sharing a
few expressions costs a few dozen schedule computations, and a chunk sends
each distinct plan once. Arrays of ints and UUIDs go as array literals built
by one ``str.join`` (:func:`array_literal`), not psycopg's per-element dumper.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import psycopg

from scheduler import log, store, tzreplan
from scheduler.errors import ValidationError
from scheduler.firing.state import TickResult
from scheduler.partition import PARTITION_COUNT
from scheduler.planner import Plan, plan_job
from scheduler.spec import ScheduleCache

# Column positions in a ``select_due_jobs`` row (tuples: a dict per row costs
# more than the rest of the per-row work in a herd).
PARTITION, JOB_ID, TENANT = 0, 1, 2
SCHEDULE = slice(3, 10)  # kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at
MISFIRE, CATCHUP, GRACE, JITTER_S = 10, 11, 12, 13
NEXT_NOMINAL, NEXT_DUE, REVISION, STORE_NOW = 14, 15, 16, 17


def array_literal(values: list) -> str:
    """``values`` (ints or UUID strings) as a PostgreSQL array literal ``'{a,b,...}'``.

    One ``str.join`` in C: psycopg's binary list dumper walks the list in
    Python (~1 µs per element, a third of the node's CPU in a herd), while the
    store parses a literal of 5,000 ints in well under a millisecond.
    """
    return "{" + ",".join(map(str, values)) + "}"


def epochs_literal(firable: dict[int, int]) -> str:
    """The fencing epoch of every partition, ``'{e0,e1,...}'`` indexed by partition id
    (1-based in SQL: partition p at p + 1), NULL where not held: the fences'
    expected epochs, looked up by subscript. Built once per tick."""
    return array_literal(["NULL" if firable.get(pid) is None else firable[pid] for pid in range(PARTITION_COUNT)])


class Batch:
    """Column arrays for one ``fire_runs`` statement (see its comment in sql/queries.sql).

    Jobs are scalars (``pids``, ``jids``, ``revs``, ``plans``: partition, id,
    revision, plan number); what to do with them is in the plan arrays, one
    entry per distinct outcome (``p_*``: the slot it was planned from, next
    slot, next due, runs, skip), so a herd of jobs sharing a schedule and slot
    shares one plan. A plan's runs are ``f_*[p_fire_lo - 1 : p_fire_hi]``;
    its skip is ``s_*[p_skip - 1]`` (0: none). Numbers are 1-based (SQL
    arrays). ``partitions``: the partitions the statement fences;
    ``plan_numbers``: plan memo key → plan number in this batch.
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
        self.pids: list[int] = []
        self.jids: list[str] = []
        self.revs: list[int] = []
        self.plans: list[int] = []
        self.p_from: list[datetime] = []
        self.p_next_nominal: list[datetime | None] = []
        self.p_next_due: list[datetime | None] = []
        self.p_fire_lo: list[int] = []
        self.p_fire_hi: list[int] = []
        self.p_skip: list[int] = []
        self.f_nominal: list[datetime] = []
        self.f_scheduled: list[datetime] = []
        self.s_first: list[datetime] = []
        self.s_until: list[datetime] = []
        self.s_slots: list[int] = []
        self.s_reasons: list[str] = []
        self.partitions: set[int] = set()
        self.plan_numbers: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self.pids)

    def add_plan(self, plan: Plan, from_nominal: datetime) -> int:
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

    def params(self, node_id: str, firable: dict[int, int], epochs: str, now: datetime | None) -> dict[str, Any]:
        """The statement's parameters: ``firable`` (partition → epoch) and ``epochs``
        (its :func:`epochs_literal`) are the tick's; ``now`` is the store clock's
        pin (None in production)."""
        fence = sorted(self.partitions)
        position = {pid: i for i, pid in enumerate(fence, 1)}
        return {
            "p_from": self.p_from,
            "p_next_nominal": self.p_next_nominal,
            "p_next_due": self.p_next_due,
            "p_fire_lo": self.p_fire_lo,
            "p_fire_hi": self.p_fire_hi,
            "p_skip": self.p_skip,
            "f_nominal": self.f_nominal,
            "f_scheduled": self.f_scheduled,
            "s_first": self.s_first,
            "s_until": self.s_until,
            "s_slots": self.s_slots,
            "s_reasons": self.s_reasons,
            "pids": array_literal(self.pids),
            "jids": array_literal(self.jids),
            "revs": array_literal(self.revs),
            "plans": array_literal(self.plans),
            "fpos": array_literal([position[pid] for pid in self.pids]),
            "node_id": node_id,
            "fence_pids": fence,
            "fence_epochs": [firable[pid] for pid in fence],
            "epochs": epochs,
            "now": now,
        }


class RowPlanner:
    """Plans due rows into batches for one firer: the schedule cache, this tick's
    plan memo and the jobs set aside for a replan (cleared by :meth:`start_tick`)."""

    def __init__(self, schedules: ScheduleCache) -> None:
        self.schedules = schedules
        self.memo: dict[tuple, Plan] = {}
        self.replan: list[tuple[int, str]] = []
        """This tick's jobs whose stored slot is no slot (partition id, job id)."""

    def start_tick(self) -> None:
        """Forget the previous tick's plans (they were made for its ``now``) and replans."""
        self.memo.clear()
        self.replan.clear()

    def replan_slots(self, conn: psycopg.Connection) -> int:
        """Move this tick's jobs whose stored slot is not a slot under this node's
        tzdata (set aside by :meth:`plan_row`) to their true slot; a later tick
        fires it (scheduler/tzreplan.py). Re-reads them (``jobs_by_keys``), then
        one compare-and-set transaction on ``conn``; returns the jobs moved."""
        rows = store.execute(
            conn,
            "jobs_by_keys",
            {"pids": [pid for pid, _ in self.replan], "jids": [uuid.UUID(j) for _, j in self.replan]},
        )
        items = []
        for row in rows:
            if row["kind"] != "cron" or row["next_nominal_at"] is None:
                continue
            try:
                if not tzreplan.is_slot(self.schedules.for_row(row), row["next_nominal_at"]):
                    items.append(tzreplan.replan_item(row))
            except ValidationError:
                continue
        return tzreplan.replan_jobs(conn, items, self.schedules)

    def plan_row(
        self, batch: Batch, row: tuple, granted: dict[str, int], used: Counter[str], result: TickResult
    ) -> None:
        """Plan one due job (a ``select_due_jobs`` tuple) within its tenant's granted runs
        (``granted`` − ``used``, which it charges) and add it to ``batch``. Sets
        ``result.budget_exhausted`` when the tenant's runs run out."""
        tenant = row[TENANT]
        remaining = granted.get(tenant, 0) - used[tenant]
        if remaining <= 0:
            result.budget_exhausted = True
            return
        try:
            schedule = self.schedules.for_key(row[SCHEDULE])
        except ValidationError as exc:  # a row that no longer parses (e.g. tzdata change)
            log.event("job_invalid", logging.ERROR, job_id=str(row[JOB_ID]), error=str(exc))
            return
        if row[SCHEDULE][0] == "cron" and not tzreplan.is_slot(schedule, row[NEXT_NOMINAL]):
            # Stored under other tzdata rules: never fired as stored (an early
            # run, then a second one); replanned at the end of the tick.
            self.replan.append((row[PARTITION], row[JOB_ID]))
            return
        now, jitter_s = row[STORE_NOW], row[JITTER_S]
        # Without jitter a plan depends on the schedule, the slot, the policy and
        # now, not on the job: in a herd, thousands of jobs share one plan,
        # computed once per tick and sent once per statement.
        key = plan = None
        if jitter_s == 0:
            key = (id(schedule), row[NEXT_NOMINAL], row[MISFIRE], row[CATCHUP], row[GRACE], now)
            plan = self.memo.get(key)
        if plan is None:
            plan = plan_job(
                schedule,
                job_id=uuid.UUID(row[JOB_ID]),
                next_nominal=row[NEXT_NOMINAL],
                now=now,
                misfire=row[MISFIRE],
                catchup_window_s=row[CATCHUP],
                misfire_grace_s=row[GRACE],
                jitter_s=jitter_s,
                limit=remaining,
            )
            if key is not None and len(plan.fires) <= 1 and plan.skip is None:
                self.memo[key] = plan
            else:
                key = None  # a plan of this job alone (jitter, catch-up, skip)
        number = batch.plan_numbers.get(key) if key is not None else None
        if number is None:
            number = batch.add_plan(plan, row[NEXT_NOMINAL])
            if key is not None:
                batch.plan_numbers[key] = number
        pid = row[PARTITION]
        batch.partitions.add(pid)
        batch.pids.append(pid)
        batch.jids.append(row[JOB_ID])
        batch.revs.append(row[REVISION])
        batch.plans.append(number)
        used[tenant] += len(plan.fires)
        if plan.next_due is not None and plan.next_due <= now and used[tenant] >= granted[tenant]:
            result.budget_exhausted = True
