"""Look-ahead: the schedule math of the coming seconds, done before they come.

Planning a schedule for the first time at an instant costs ~80 µs (two
``next_after`` walks: the slot check and the next slot, scheduler/schedule.py),
and a midnight holds thousands of distinct schedules: 20,000 of them cost
~1.6 s of the node's CPU in the herd's first tick, on the critical path of
every tenant's runs (the small tenants' lag p99 measured 2.4 s at 20,000
schedules, 1.6 s at 5,000, against 0.8 s with 46; docs/performance.md).
None of it depends on the moment of firing: a plan is a function of the
schedule and the slot, and only the on-time check uses ``now``.

So when a tick ends early, the firer spends the rest of its wait (never
past the next tick's start) here: :meth:`LookAhead.run` reads the distinct
(schedule key, due instant) pairs of the timers due within
:attr:`~scheduler.firing.limits.FiringLimits.lookahead_s` in the node's
firable partitions (``lookahead_schedule_keys``: due-index entries only,
each read starting where the last one ended, so a timer's entry is read
once; at most ``lookahead_max_keys`` rows and one read a second, canceled
if it would outlast the wait), has the herd finder measure the herds of the
same window of the tenants that read showed with at least ``herd_min_jobs``
timers at one instant (:meth:`HerdFinder.read_ahead
<scheduler.firing.herds.HerdFinder.read_ahead>`: their timers and keys per
partition, so the instant's tick need not count them; a steady load has no
such tenant and pays nothing for it; a measure canceled because the
schedules' read took the wait is tried once more, first in the next wait)
and has
the herd finder prepare each (:meth:`HerdFinder.prepare
<scheduler.firing.herds.HerdFinder.prepare>`: the key's spec, the slot
check, the next slot, all memoized). When the instant comes, both paths
find their answers in the memos (the per-timer path shares the schedule
cache). Work left when the wait ends stays queued for the next wait.
"""

from __future__ import annotations

import collections
from collections import Counter
from datetime import datetime, timedelta

import psycopg

from scheduler import store
from scheduler.clock import Clock
from scheduler.firing.herds import HerdFinder
from scheduler.firing.limits import FiringLimits


class LookAhead:
    """Prepares the coming seconds' schedules for one firer (see the module doc)."""

    def __init__(self, herds: HerdFinder, clock: Clock, limits: FiringLimits) -> None:
        self._herds = herds
        self._clock = clock
        self._limits = limits
        self._queue: collections.deque[tuple[int, datetime]] = collections.deque()
        self._seen: set[tuple[int, datetime]] = set()
        self._last_read = float("-inf")
        self._until: datetime | None = None
        self._owed: tuple[list[str], datetime, datetime, datetime] | None = None
        """A measure of herds still to read (tenants, after, until, store now): its read
        was canceled past its wait, or had no time left; tried once more, first in the next."""
        self.prepared = 0
        """Pairs prepared so far (for tests and the curious)."""

    def run(self, conn: psycopg.Connection, tenants: list[str], firable: dict[int, int], deadline: float) -> None:
        """Prepare queued pairs until the local monotonic ``deadline`` (seconds),
        reading the coming ones first if the queue is empty and the last read
        is at least a second old. ``tenants``: the tenants to look at (the last
        tick's); ``firable``: the node's firable partitions. Store errors
        propagate (the caller logs them; nothing is changed)."""
        now = self._clock.monotonic()
        if self._owed is not None and firable and now < deadline:
            self._measure(conn, firable, deadline - now, last_try=True)
            now = self._clock.monotonic()
        if not self._queue and tenants and firable and now < deadline and now - self._last_read >= 1.0:
            self._last_read = now
            self._read(conn, tenants, firable, deadline - now)
        batch: list[tuple[int, datetime]] = []
        while self._queue and self._clock.monotonic() < deadline:
            batch.append(self._queue.popleft())
            if len(batch) >= 256 or not self._queue:
                self.prepared += self._herds.prepare(conn, batch)
                batch = []
        if batch:
            self.prepared += self._herds.prepare(conn, batch)

    def _read(self, conn: psycopg.Connection, tenants: list[str], firable: dict[int, int], budget_s: float) -> None:
        """Queue the pairs due in (the end of the last read, now + ``lookahead_s``]:
        each timer's index entry is read once. The read may take at most
        ``budget_s`` (canceled past it: the wait is the next tick's)."""
        now = store.now(conn, self._clock.store_now_or_none())
        start = now if self._until is None or self._until < now else self._until
        until = now + timedelta(seconds=self._limits.lookahead_s)
        if until <= start:
            return
        began = self._clock.monotonic()
        rows = store.execute_within(
            conn,
            "lookahead_schedule_keys",
            {
                "tenants": tenants,
                "partition_ids": list(firable),
                "after": start,
                "until": until,
                "max_keys": self._limits.lookahead_max_keys,
            },
            budget_s,
        )
        # A cut read (max_keys) is read again from its last instant next time.
        cut = len(rows) >= self._limits.lookahead_max_keys
        self._until = max(r["due"] for r in rows) - timedelta(microseconds=1) if cut else until
        self._seen = {pair for pair in self._seen if pair[1] > now}  # only the coming seconds
        timers: Counter[tuple[str, datetime]] = Counter()
        for row in rows:
            timers[(row["tenant"], row["due"])] += row["n"]
            pair = (row["schedule_key"], row["due"])
            if pair not in self._seen:
                self._seen.add(pair)
                self._queue.append(pair)
        # Only tenants with a herd coming are measured: a steady load has none, and the
        # measure's walk would cost it as much store time as this read.
        herding = {tenant for (tenant, _), n in timers.items() if n >= self._limits.herd_min_jobs}
        if herding:
            if self._owed is not None:  # windows follow each other: one measure covers both
                owed_tenants, owed_start, _, _ = self._owed
                herding.update(owed_tenants)
                start = min(start, owed_start)
            self._owed = (sorted(herding), start, until, now)
            self._measure(conn, firable, budget_s - (self._clock.monotonic() - began), last_try=False)

    def _measure(self, conn: psycopg.Connection, firable: dict[int, int], budget_s: float, *, last_try: bool) -> None:
        """Read the owed measure of herds (:meth:`HerdFinder.read_ahead
        <scheduler.firing.herds.HerdFinder.read_ahead>`) within ``budget_s`` (with no time
        left it stays owed). Canceled past it after the schedules' read took the wait, it
        stays owed for the next wait, as long as some instant of its window is still ahead;
        canceled on its ``last_try`` (a wait of its own), it is dropped: its herds are
        counted at their instant, and no wait before them is spent on a read that does not
        fit."""
        assert self._owed is not None
        tenants, start, until, now = self._owed
        if budget_s <= 0.001:
            return  # no time to try: owed still
        try:
            self._herds.read_ahead(conn, tenants, firable, start, until, now, budget_s)
        except psycopg.errors.QueryCanceled:
            if not last_try and store.now(conn, self._clock.store_now_or_none()) < until:
                return  # owed still: tried again in the next wait
        self._owed = None
