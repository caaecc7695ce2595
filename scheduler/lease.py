"""Partition leases: who *should* fire each partition (docs/design.md §2, §6).

The protocol
------------
1,024 partitions each have two rows: the **fence** in ``partitions``
(``owner_node``, ``owner_epoch``: the fencing token, locked ``FOR SHARE`` by
every firing statement) and the **lease** in ``leases`` (``owner_node``, a
copy of the epoch it was claimed at, ``lease_expires_at``, ``acquired_at``,
``renewed_at``). A node:

* **joins** by upserting its heartbeat row (``nodes``);
* **heartbeats** every ``renew_interval_s``, in a transaction of its own;
  a node whose heartbeat is older than ``Settings.responsive_s`` (renew + 2
  polls, by the store's clock) no longer counts when shares are computed
  (its leases still protect what it holds until they expire: the TTL);
* **renews** all its leases every ``renew_interval_s``, right after the
  heartbeat, with one UPDATE of lease rows keyed on (node, partition,
  epoch). It writes only ``leases``, never the ``partitions`` rows the fence
  locks, so firing (its share locks, a long tick) cannot delay it;
* **polls** every ``poll_interval_s``: its fair share is ⌈1024 / responsive
  nodes⌉ (a cap); under it, it **claims** free or expired leases with one
  statement that takes the lease rows and bumps ``partitions.owner_epoch``
  (waiting, as a takeover must, for an in-flight firing commit of the
  previous owner); over it, it marks the excess **draining**: no tick that
  begins afterwards fires them, they keep being renewed, and they are
  **released** (lease rows only; the fence keeps its epoch until the next
  claim bumps it) once every tick that began before has ended
  (:class:`LeaseTable` numbers ticks; the lease loop never waits for one);
* **leaves** (SIGTERM) by releasing everything and deleting its heartbeat.

State machine of one lease, as this node sees it::

    (none) --claim--> HELD --renew ok--> HELD
                       |  \\--renew misses it--> LOST (taken over; dropped)
                       |  \\--deadline - margin passes--> HELD but not firable
                       |--over share--> DRAINING (renewed, not fired)
                                          |--earlier ticks ended, release--> (none)
                                          |--back under share--> HELD

Why it is safe
--------------
The lease only says who *should* fire; the epoch says who *may*. Every firing
statement locks the partition rows it fires ``FOR SHARE`` where ``owner_node``
and ``owner_epoch`` are still ours (``fire_runs`` in queries.sql). A takeover
bumps the epoch with an UPDATE of those rows that must wait for that lock, so
either the old owner's firing commits first (and the new owner then sees the
advanced jobs) or the takeover commits first (and the old owner's statement
matches no partition and commits nothing). A paused node cannot hold the
lock past its lease: node sessions run with lock/statement/idle-in-transaction
timeouts well below the TTL. Keeping the lease on its own row changes none of
this: only claims write ``partitions``, and every claim bumps the epoch.

Liveness: a node stops firing a partition ``safety_margin_s`` before its
lease's deadline as measured on its own monotonic clock from the moment it
*sent* the claim/renewal (a conservative bound: the store's expiry is later).
That margin, ≥ 0.5 s, covers clock rate drift; the epoch covers the rest.

Restart under the same ``--node-id``: leases are keyed on (node, epoch) and a
new process knows no epochs, so it never renews or fires its predecessor's
leases; it claims afresh (new epochs) once they are free or expired.

Failure: if the store is unreachable, renewals fail, leases reach their local
deadline and the node stops firing; another node claims them after the TTL.
Crash failover lateness is bounded by TTL + poll + tick ≈ 12 s (§6).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from typing import Protocol

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.errors import SchedulerError
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings
from scheduler.store import StoreSession


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


class Coordinator(Protocol):
    """Ownership decisions: membership, claim, renew, release (docs/design.md §2).

    Implementations: :class:`SqlCoordinator` (default) and the etcd one. The
    firing transaction and its fence do not depend on which is used. All
    methods may raise :class:`~scheduler.errors.StoreError` or
    ``psycopg.Error`` (or the etcd client's errors); the lease loop survives
    them.
    """

    node_id: str

    def join(self) -> None:
        """Announce this node (heartbeat) before the first poll."""

    def heartbeat(self) -> bool:
        """Record this node's membership heartbeat, on its own (its own transaction).

        Returns True if it did; False if :meth:`renew` carries the heartbeat
        (etcd: the keep-alive of the node's one lease is both).
        """

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        """Renew ``leases``; return the ``(partition, epoch)`` still ours.

        Must not wait for the firing fence's locks (the lease is not kept on
        the rows the fence locks).
        """

    def live_nodes(self) -> list[str]:
        """Node ids that count when shares are computed, sorted.

        SQL: heartbeat younger than ``Settings.responsive_s`` (not the TTL);
        etcd: members whose key (on their etcd lease) exists.
        """

    def claim(self, limit: int) -> list[tuple[int, int]]:
        """Claim up to ``limit`` free/expired partitions; return ``(partition, new epoch)``."""

    def release(self, leases: list[Lease]) -> list[int]:
        """Release ``leases``; return the partition ids actually released."""

    def leave(self) -> None:
        """Withdraw membership (graceful stop)."""

    def close(self) -> None:
        """Free connections."""


class SqlCoordinator(StoreSession):
    """Leases and membership as rows in the SQL store (the default coordinator).

    Uses one dedicated autocommit connection, reopened after a failure. Store
    writes per second for N nodes holding P partitions: N heartbeats and N
    renewal statements (P lease row writes) every ``renew_interval_s``, plus
    claims. The heartbeat (``nodes``) and the renewal (``leases``) are
    separate transactions, heartbeat first, and neither touches the
    ``partitions`` rows the firing fence locks: only a claim does. Store
    times (heartbeat, expiry, "expired") are the store's clock, or the
    ``clock``'s pin in tests (:class:`StoreSession`).
    """

    def __init__(self, settings: Settings, metrics: Metrics, clock: Clock | None = None) -> None:
        super().__init__(settings, metrics, clock)
        self.node_id = settings.node_id
        self.incarnation = uuid.uuid4()

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        store.execute(
            conn,
            "upsert_heartbeat",
            {
                "node_id": self.node_id,
                "incarnation": self.incarnation,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "now": self._clock.store_now_or_none(),
            },
        )

    def join(self) -> None:
        self.heartbeat()

    def heartbeat(self) -> bool:
        """Upsert this node's ``nodes`` row (its own transaction); always True."""
        self._tx(self._heartbeat)
        return True

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        """One ``renew_leases`` statement over ``leases`` (lease rows only); the pairs renewed."""
        if not leases:
            return []
        rows = self._tx(
            lambda conn: store.execute(
                conn,
                "renew_leases",
                {
                    "node_id": self.node_id,
                    "ttl_s": self._settings.lease_ttl_s,
                    "partition_ids": [lease.partition_id for lease in leases],
                    "epochs": [lease.epoch for lease in leases],
                    "now": self._clock.store_now_or_none(),
                },
            )
        )
        return [(row["partition_id"], row["owner_epoch"]) for row in rows]

    def live_nodes(self) -> list[str]:
        """Nodes that heartbeat on time: age below :meth:`Settings.responsive_s`.

        Shares are computed over these. A node that stopped heartbeating (dead
        or frozen) stops counting a few seconds after its last heartbeat, long
        before its leases expire, so when its leases (or a dead peer's) expire
        the responsive nodes' shares already cover them: overlapping failures
        (one node killed, another frozen) do not leave partitions unclaimed
        until the frozen node's heartbeat reaches the TTL. Only free or
        expired partitions are ever claimed, so a slow heartbeat costs nothing
        but a share computed a little high for a moment.
        """
        rows = self._tx(
            lambda conn: store.execute(
                conn,
                "list_live_nodes",
                {"max_age_s": self._settings.responsive_s, "now": self._clock.store_now_or_none()},
            )
        )
        return [row["node_id"] for row in rows]

    def claim(self, limit: int) -> list[tuple[int, int]]:
        if limit <= 0:
            return []
        rows = self._tx(
            lambda conn: store.execute(
                conn,
                "claim_partitions",
                {
                    "node_id": self.node_id,
                    "ttl_s": self._settings.lease_ttl_s,
                    "limit": limit,
                    "now": self._clock.store_now_or_none(),
                },
            )
        )
        return [(row["partition_id"], row["owner_epoch"]) for row in rows]

    def release(self, leases: list[Lease]) -> list[int]:
        if not leases:
            return []
        rows = self._tx(
            lambda conn: store.execute(
                conn,
                "release_leases",
                {
                    "node_id": self.node_id,
                    "partition_ids": [lease.partition_id for lease in leases],
                    "epochs": [lease.epoch for lease in leases],
                },
            )
        )
        return [row["partition_id"] for row in rows]

    def leave(self) -> None:
        self._tx(
            lambda conn: store.execute(
                conn, "delete_heartbeat", {"node_id": self.node_id, "incarnation": self.incarnation}
            )
        )

    def prune(self) -> None:
        """Delete heartbeat rows of nodes dead for ``node_prune_after_s``."""
        self._tx(
            lambda conn: store.execute(
                conn,
                "prune_nodes",
                {"prune_after_s": self._settings.node_prune_after_s, "now": self._clock.store_now_or_none()},
            )
        )


class LeaseLoop:
    """Keeps this node's share of leases: heartbeat, renew, poll, claim, drain, release.

    Lifecycle: :meth:`run_once` does one iteration (tests call it directly
    with a manual clock and a fake coordinator: tests/unit/test_lease_loop.py);
    :meth:`run` loops until ``stop`` is set, then
    :meth:`leave` releases everything.

    Nothing here ever waits for the firing loop. Over its share, the loop
    marks the excess draining (:meth:`LeaseTable.set_draining`), keeps
    renewing it, and releases it on a later iteration once
    :meth:`LeaseTable.releasable` says the ticks that may have been firing it
    have ended.

    ``on_claimed`` is called after partitions are claimed, so the firing loop
    can tick at once instead of waiting for its next second: overdue jobs of a
    dead node fire one poll after its TTL, not one poll plus one tick.

    A coordinator that *watches* membership and leases (etcd) offers
    ``set_on_change(callback)``; the loop registers :meth:`wake` there, so a
    member joining or leaving, or a partition key deleted (expired or
    released), triggers a rebalance at once instead of at the next poll. With
    such a coordinator, whoever sets ``stop`` must also call :meth:`wake`.
    """

    def __init__(
        self,
        settings: Settings,
        coordinator: Coordinator,
        table: LeaseTable,
        clock: Clock,
        metrics: Metrics,
        on_claimed=None,
    ) -> None:
        self._s = settings
        self._coord = coordinator
        self._table = table
        self._clock = clock
        self._metrics = metrics
        self._on_claimed = on_claimed
        self._next_renew = 0.0
        self._next_poll = 0.0
        self._next_prune = 0.0
        self._joined = False
        self.last_heartbeat_mono = 0.0
        """Monotonic time (seconds) of the last successful heartbeat; 0.0 before one."""
        self._claiming = True
        self._drain_reason: dict[str, object] = {"reason": "over_share"}
        self._wake = threading.Event()
        self._poll_requested = False
        self._watching = hasattr(coordinator, "set_on_change")
        if self._watching:
            coordinator.set_on_change(self.wake)

    def wake(self) -> None:
        """Rebalance as soon as possible (membership or a lease changed); any thread."""
        self._poll_requested = True
        self._wake.set()

    def run_once(self) -> None:
        """Heartbeat and renew if due, poll membership and rebalance if due,
        then release the draining leases no tick can be firing any more.

        Store failures are logged and counted; they never escape (a lease
        that cannot be renewed simply stops being firable at its deadline).
        """
        now = self._clock.monotonic()
        try:
            if not self._joined:
                self._coord.join()
                self._joined = True
                self.last_heartbeat_mono = now
            if now >= self._next_renew:
                self._renew(now)
                self._next_renew = now + self._s.renew_interval_s
            if now >= self._next_poll or self._poll_requested:
                self._poll_requested = False
                self._rebalance()
                self._next_poll = now + self._s.poll_interval_s
            releasable = self._table.releasable()
            if releasable:
                self._release(releasable, **self._drain_reason)
            if now >= self._next_prune and hasattr(self._coord, "prune"):
                self._coord.prune()
                self._next_prune = now + 60.0
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event(
                "store_unavailable",
                logging.WARNING,
                component="lease",
                error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            # Try again soon; the table's deadlines keep firing safe meanwhile.
            self._next_renew = now + min(1.0, self._s.renew_interval_s)
            self._next_poll = now + self._s.poll_interval_s
        finally:
            self._metrics.partitions_owned.set(len(self._table))

    def _renew(self, now: float) -> None:
        """Heartbeat, then renew every held lease (draining ones too), each its own transaction."""
        beat = self._coord.heartbeat()
        if beat:
            self.last_heartbeat_mono = now
        held = list(self._table.held().values())
        sent = self._clock.monotonic()
        renewed = self._coord.renew(held)
        if not beat:
            self.last_heartbeat_mono = now
        self._table.grant(renewed, sent, self._s.lease_ttl_s)
        kept = {pid for pid, _ in renewed}
        lost = [lease for lease in held if lease.partition_id not in kept]
        if lost:
            self._table.drop(lease.partition_id for lease in lost)
            self._metrics.lease_events.labels(kind="lost").inc(len(lost))
            log.event(
                "lease_lost",
                logging.WARNING,
                node=self._s.node_id,
                partitions=len(lost),
                sample=[lease.partition_id for lease in lost[:8]],
            )
        self._metrics.lease_events.labels(kind="renewed").inc(len(renewed))

    def stop_claiming(self) -> None:
        """Keep renewing but claim nothing more (the node is stopping).

        Without this, a node that got SIGTERM while a peer's leases expired
        could claim partitions only to release them a moment later.
        """
        self._claiming = False

    def _rebalance(self) -> None:
        live = self._coord.live_nodes()
        if self._coord.node_id not in live:
            live.append(self._coord.node_id)
        self._metrics.live_nodes.set(len(live))
        share = fair_share(len(live))
        held = self._table.held()
        if len(held) < share and self._claiming:
            sent = self._clock.monotonic()
            claimed = self._coord.claim(share - len(held))
            if claimed:
                self._table.grant(claimed, sent, self._s.lease_ttl_s)
                self._metrics.lease_events.labels(kind="claimed").inc(len(claimed))
                log.event(
                    "lease_claimed",
                    node=self._s.node_id,
                    partitions=len(claimed),
                    held=len(held) + len(claimed),
                    share=share,
                    live_nodes=len(live),
                )
                if self._on_claimed is not None:
                    self._on_claimed()
        else:
            # Over the share: drain the excess (highest partition ids); they are
            # released by run_once once no tick can be firing them. Back under
            # it (a peer left meanwhile): fire them again.
            excess = sorted(held)[share:]
            self._table.set_draining(excess)
            if excess:
                self._drain_reason = {"reason": "over_share", "share": share}

    def _release(self, leases: list[Lease], reason: str, **fields: object) -> None:
        """Release ``leases`` (draining ones no tick is using) and forget them."""
        pids = [lease.partition_id for lease in leases]
        released = self._coord.release(leases)
        self._table.drop(pids)
        self._metrics.lease_events.labels(kind="released").inc(len(released))
        log.event("lease_released", node=self._s.node_id, partitions=len(released), reason=reason, **fields)

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set, waking every ≤ ``poll_interval_s`` (or at :meth:`wake`)."""
        while not stop.is_set():
            self._wake.clear()
            self.run_once()
            wake = min(self._next_renew, self._next_poll) - self._clock.monotonic()
            self._clock.wait(self._wake if self._watching else stop, max(0.01, wake))

    def leave(self) -> None:
        """Release all leases and withdraw membership; best effort, never raises.

        Called after the firing loop has stopped. A lease a tick may still be
        firing (the firing loop did not stop) is not released: it expires.
        """
        try:
            held = self._table.held()
            if held:
                self._table.start_draining(held)
                releasable = self._table.releasable()
                if releasable:
                    self._release(releasable, reason="shutdown")
                if len(releasable) < len(held):
                    log.event(
                        "leave_partial",
                        logging.WARNING,
                        node=self._s.node_id,
                        left_to_expire=len(held) - len(releasable),
                        note="a firing tick was still running; its leases expire after the TTL",
                    )
            self._coord.leave()
            log.event("node_left", node=self._s.node_id)
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event("leave_failed", logging.WARNING, node=self._s.node_id, error=str(exc))
        finally:
            self._metrics.partitions_owned.set(len(self._table))


def make_coordinator(settings: Settings, metrics: Metrics, clock: Clock | None = None) -> Coordinator:
    """The coordinator ``settings.coordinator`` names: ``sql`` (default) or ``etcd``.

    ``clock`` (default: the system clock) is the node's injected clock; the
    etcd coordinator reads its local time from it (the SQL one keeps no local
    time: the store's clock judges its leases), and both send its store pin
    (:meth:`~scheduler.clock.Clock.store_now_or_none`, None in production)
    as the ``now`` of their store queries. The etcd one needs the optional
    ``etcd`` extra (``pip install '.[etcd]'``).
    """
    kind = getattr(settings, "coordinator", "sql")
    if kind == "etcd":
        from scheduler.etcd_coordinator import EtcdCoordinator

        return EtcdCoordinator(settings, metrics, clock)
    return SqlCoordinator(settings, metrics, clock)
