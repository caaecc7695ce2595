"""The node-local lease table: which partitions this node holds, at which epoch, until when.

:class:`Lease` (one held lease), :class:`LeaseTable` (the firing loop reads it,
the lease loop writes it; ticks are numbered so a release never waits for a
tick) and :func:`fair_share` (the most partitions one node should hold). Pure:
no store, no coordinator; the protocol around it is in the package docstring
(:mod:`scheduler.coordination`).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterable

from scheduler.clock import Clock
from scheduler.partition import PARTITION_COUNT


@dataclasses.dataclass(frozen=True)
class Lease:
    """A lease this node holds: partition, epoch (fencing token), local deadline.

    ``deadline_mono`` is on the node's monotonic clock (seconds): the time the
    claim or last renewal was *sent* plus the TTL; the store's expiry is later.
    """

    partition_id: int
    epoch: int
    deadline_mono: float


class LeaseTable:
    """Thread-safe, node-local view of the leases this node holds.

    The firing loop reads; the lease loop writes. They share no lock that is
    held across store calls: the firing loop brackets each tick with
    :meth:`begin_tick` (which numbers the tick and hands it its firable
    partitions) and :meth:`end_tick`; a lease marked draining is left out of
    every tick that begins afterwards, and :meth:`releasable` offers it for
    release only once every tick that began before it was marked has ended.
    The lease loop compares those numbers without ever waiting for a tick, so
    a long tick delays a release (the draining lease is renewed meanwhile),
    never a renewal or a heartbeat.
    """

    def __init__(self, clock: Clock, safety_margin_s: float) -> None:
        self._clock = clock
        self._margin_s = safety_margin_s
        self._leases: dict[int, Lease] = {}
        self._draining: dict[int, int] = {}  # partition -> ticks begun when it started draining
        self._ticks_begun = 0
        self._ticks_ended = 0
        self._lock = threading.Lock()

    def grant(self, grants: Iterable[tuple[int, int]], sent_mono: float, ttl_s: float) -> None:
        """Record claimed or renewed ``(partition_id, epoch)`` pairs.

        ``sent_mono`` is when the claim or renewal was sent (this table's
        clock, seconds); the local deadline is ``sent_mono + ttl_s``.
        """
        with self._lock:
            for pid, epoch in grants:
                self._leases[pid] = Lease(pid, epoch, sent_mono + ttl_s)

    def drop(self, partition_ids: Iterable[int]) -> None:
        """Forget leases (released or lost)."""
        with self._lock:
            for pid in partition_ids:
                self._leases.pop(pid, None)
                self._draining.pop(pid, None)

    def start_draining(self, partition_ids: Iterable[int]) -> None:
        """Stop firing these held partitions from the next tick on (about to be released).

        Idempotent: a partition already draining keeps its place.
        """
        with self._lock:
            for pid in partition_ids:
                if pid in self._leases and pid not in self._draining:
                    self._draining[pid] = self._ticks_begun

    def set_draining(self, partition_ids: Iterable[int]) -> None:
        """Make exactly these held partitions draining: start the new ones, fire the others again."""
        wanted = set(partition_ids)
        with self._lock:
            for pid in [pid for pid in self._draining if pid not in wanted]:
                del self._draining[pid]
        self.start_draining(sorted(wanted))

    def releasable(self) -> list[Lease]:
        """Draining leases no tick can be firing any more, by partition id.

        A lease qualifies once every tick that had begun when it started
        draining has ended; later ticks never had it. Never waits.
        """
        with self._lock:
            return [
                self._leases[pid]
                for pid, begun in sorted(self._draining.items())
                if begun <= self._ticks_ended and pid in self._leases
            ]

    def draining(self) -> set[int]:
        """Partition ids marked draining (held, not fired, waiting to be released)."""
        with self._lock:
            return set(self._draining)

    def held(self) -> dict[int, Lease]:
        """All held leases by partition id (including draining and past-deadline ones)."""
        with self._lock:
            return dict(self._leases)

    def _firable_locked(self) -> dict[int, int]:
        limit = self._clock.monotonic() + self._margin_s
        return {
            pid: lease.epoch
            for pid, lease in self._leases.items()
            if lease.deadline_mono > limit and pid not in self._draining
        }

    def firable(self) -> dict[int, int]:
        """``{partition_id: epoch}`` this node may try to fire now.

        Excludes draining leases and leases within ``safety_margin_s`` of
        their local deadline.
        """
        with self._lock:
            return self._firable_locked()

    def begin_tick(self) -> tuple[int, dict[int, int]]:
        """Start a firing tick: return its number (1, 2, ...) and what it may fire (:meth:`firable`).

        The firing loop must call :meth:`end_tick` with that number when the
        tick's statements have all finished (committed or failed).
        """
        with self._lock:
            self._ticks_begun += 1
            return self._ticks_begun, self._firable_locked()

    def end_tick(self, number: int) -> None:
        """Mark tick ``number`` (from :meth:`begin_tick`) and every earlier one ended."""
        with self._lock:
            self._ticks_ended = max(self._ticks_ended, number)

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)


def fair_share(live_nodes: int) -> int:
    """⌈1024 / live_nodes⌉: the most partitions one node should hold (docs/design.md §2)."""
    return math.ceil(PARTITION_COUNT / max(1, live_nodes))
