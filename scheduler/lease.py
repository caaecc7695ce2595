"""Partition leases: who *should* fire each partition (DESIGN.md §2, §6).

The protocol
------------
1,024 partitions each have one row in ``partitions`` with ``owner_node``,
``owner_epoch`` (the fencing token) and ``lease_expires_at``. A node:

* **joins** by upserting its heartbeat row (``nodes``); live nodes are those
  whose heartbeat is younger than the lease TTL, judged by the store's clock;
* **polls** every ``poll_interval_s``: its fair share is ⌈1024 / live⌉ (a
  cap); under it, it **claims** free or expired partitions with one
  conditional UPDATE that also bumps ``owner_epoch``; over it, it
  **releases** the excess, after the firing tick that may be using them ends;
* **renews** all its leases every ``renew_interval_s`` with one UPDATE keyed
  on (node, partition, epoch), in the same transaction as its heartbeat, so
  a dead node's heartbeat and leases go stale at the same store instant;
* **leaves** (SIGTERM) by releasing everything and deleting its heartbeat.

State machine of one lease, as this node sees it::

    (none) --claim--> HELD --renew ok--> HELD
                       |  \\--renew misses it--> LOST (taken over; dropped)
                       |  \\--deadline - margin passes--> HELD but not firable
                       |--over share--> DRAINING --tick done, release--> (none)

Why it is safe
--------------
The lease only says who *should* fire; the epoch says who *may*. Every firing
statement locks the partition rows it fires ``FOR SHARE`` where ``owner_node``
and ``owner_epoch`` are still ours (``fire_runs`` in queries.sql). A takeover
bumps the epoch with an UPDATE that must wait for that lock, so either the
old owner's firing commits first (and the new owner then sees the advanced
jobs) or the takeover commits first (and the old owner's statement matches
no partition and commits nothing). A paused node cannot hold the lock past
its lease: node sessions run with lock/statement/idle-in-transaction
timeouts well below the TTL.

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
from scheduler.errors import SchedulerError, StoreError
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings


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

    The firing loop reads :meth:`firable`; the lease loop writes. ``tick_lock``
    is held by the firing loop for the whole of a tick, so a release that takes
    it first waits for the tick that may be firing those partitions.
    """

    def __init__(self, clock: Clock, safety_margin_s: float) -> None:
        self._clock = clock
        self._margin_s = safety_margin_s
        self._leases: dict[int, Lease] = {}
        self._draining: set[int] = set()
        self._lock = threading.Lock()
        self.tick_lock = threading.Lock()

    def grant(self, grants: Iterable[tuple[int, int]], sent_mono: float, ttl_s: float) -> None:
        """Record claimed or renewed ``(partition_id, epoch)`` pairs."""
        with self._lock:
            for pid, epoch in grants:
                self._leases[pid] = Lease(pid, epoch, sent_mono + ttl_s)

    def drop(self, partition_ids: Iterable[int]) -> None:
        """Forget leases (released or lost)."""
        with self._lock:
            for pid in partition_ids:
                self._leases.pop(pid, None)
                self._draining.discard(pid)

    def start_draining(self, partition_ids: Iterable[int]) -> None:
        """Stop firing these partitions from the next tick on (about to be released)."""
        with self._lock:
            self._draining.update(pid for pid in partition_ids if pid in self._leases)

    def held(self) -> dict[int, Lease]:
        """All held leases by partition id (including draining and past-deadline ones)."""
        with self._lock:
            return dict(self._leases)

    def firable(self) -> dict[int, int]:
        """``{partition_id: epoch}`` this node may try to fire now.

        Excludes draining leases and leases within ``safety_margin_s`` of
        their local deadline.
        """
        limit = self._clock.monotonic() + self._margin_s
        with self._lock:
            return {
                pid: lease.epoch
                for pid, lease in self._leases.items()
                if lease.deadline_mono > limit and pid not in self._draining
            }

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)


def fair_share(live_nodes: int) -> int:
    """⌈1024 / live_nodes⌉: the most partitions one node should hold (DESIGN.md §2)."""
    return math.ceil(PARTITION_COUNT / max(1, live_nodes))


class Coordinator(Protocol):
    """Ownership decisions: membership, claim, renew, release (DESIGN.md §2).

    Implementations: :class:`SqlCoordinator` (default) and the etcd one. The
    firing transaction and its fence do not depend on which is used. All
    methods may raise :class:`~scheduler.errors.StoreError` or
    ``psycopg.Error`` (or the etcd client's errors); the lease loop survives
    them.
    """

    node_id: str

    def join(self) -> None:
        """Announce this node (heartbeat) before the first poll."""

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        """Heartbeat and renew ``leases``; return the ``(partition, epoch)`` still ours."""

    def live_nodes(self) -> list[str]:
        """Node ids considered live now, sorted."""

    def claim(self, limit: int) -> list[tuple[int, int]]:
        """Claim up to ``limit`` free/expired partitions; return ``(partition, new epoch)``."""

    def release(self, leases: list[Lease]) -> list[int]:
        """Release ``leases``; return the partition ids actually released."""

    def leave(self) -> None:
        """Withdraw membership (graceful stop)."""

    def close(self) -> None:
        """Free connections."""


class StoreSession:
    """A coordinator's own store connection: one autocommit session, reopened after a failure.

    Shared by :class:`SqlCoordinator` and the etcd coordinator (which writes
    only the claim's epoch and releases). The session carries the node
    timeouts (lock, statement, idle in transaction) and the application name
    ``scheduler-lease:<node id>``.
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._conn: psycopg.Connection | None = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            s = self._settings
            self._conn = store.node_connect(s, f"scheduler-lease:{s.node_id}")
        return self._conn

    def _tx(self, body):
        try:
            conn = self._connection()
            return store.run_transaction(conn, body, on_retry=self._metrics.retry)
        except (psycopg.Error, StoreError) as exc:
            self._metrics.error(getattr(exc, "sqlstate", None))
            if isinstance(exc, StoreError) or isinstance(exc, psycopg.OperationalError) \
                    or (self._conn is not None and self._conn.closed):
                self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class SqlCoordinator(StoreSession):
    """Leases and membership as rows in the SQL store (the default coordinator).

    Uses one dedicated autocommit connection, reopened after a failure. Store
    writes per second for N nodes holding P partitions: N heartbeats and N
    renewal statements (P row writes) every ``renew_interval_s``, plus claims.
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        super().__init__(settings, metrics)
        self.node_id = settings.node_id
        self.incarnation = uuid.uuid4()

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        store.execute(conn, "upsert_heartbeat", {
            "node_id": self.node_id, "incarnation": self.incarnation,
            "host": socket.gethostname(), "pid": os.getpid()})

    def join(self) -> None:
        self._tx(self._heartbeat)

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        def body(conn: psycopg.Connection) -> list[tuple[int, int]]:
            self._heartbeat(conn)
            if not leases:
                return []
            rows = store.execute(conn, "renew_leases", {
                "node_id": self.node_id, "ttl_s": self._settings.lease_ttl_s,
                "partition_ids": [lease.partition_id for lease in leases],
                "epochs": [lease.epoch for lease in leases]})
            return [(row["partition_id"], row["owner_epoch"]) for row in rows]

        return self._tx(body)

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
        rows = self._tx(lambda conn: store.execute(
            conn, "list_live_nodes", {"ttl_s": self._settings.responsive_s}))
        return [row["node_id"] for row in rows]

    def claim(self, limit: int) -> list[tuple[int, int]]:
        if limit <= 0:
            return []
        rows = self._tx(lambda conn: store.execute(conn, "claim_partitions", {
            "node_id": self.node_id, "ttl_s": self._settings.lease_ttl_s, "limit": limit}))
        return [(row["partition_id"], row["owner_epoch"]) for row in rows]

    def release(self, leases: list[Lease]) -> list[int]:
        if not leases:
            return []
        rows = self._tx(lambda conn: store.execute(conn, "release_leases", {
            "node_id": self.node_id,
            "partition_ids": [lease.partition_id for lease in leases],
            "epochs": [lease.epoch for lease in leases]}))
        return [row["partition_id"] for row in rows]

    def leave(self) -> None:
        self._tx(lambda conn: store.execute(conn, "delete_heartbeat", {
            "node_id": self.node_id, "incarnation": self.incarnation}))

    def prune(self) -> None:
        """Delete heartbeat rows of nodes dead for ``node_prune_after_s``."""
        self._tx(lambda conn: store.execute(conn, "prune_nodes", {
            "prune_after_s": self._settings.node_prune_after_s}))

class LeaseLoop:
    """Keeps this node's share of leases: renew, poll, claim, release.

    Lifecycle (STYLE.md rule 6): :meth:`run_once` does one iteration (tests
    call it directly with a manual clock); :meth:`run` loops until ``stop``
    is set, then :meth:`leave` releases everything.

    ``on_claimed`` is called after partitions are claimed, so the firing loop
    can tick at once instead of waiting for its next second: overdue jobs of a
    dead node fire one poll after its TTL, not one poll plus one tick.

    A coordinator that *watches* membership and leases (etcd) offers
    ``set_on_change(callback)``; the loop registers :meth:`wake` there, so a
    member joining or leaving, or a partition key deleted (expired or
    released), triggers a rebalance at once instead of at the next poll. With
    such a coordinator, whoever sets ``stop`` must also call :meth:`wake`.
    """

    def __init__(self, settings: Settings, coordinator: Coordinator, table: LeaseTable,
                 clock: Clock, metrics: Metrics, on_claimed=None) -> None:
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
        """Renew if due, then poll membership and rebalance if due.

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
            if now >= self._next_prune and hasattr(self._coord, "prune"):
                self._coord.prune()
                self._next_prune = now + 60.0
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event("store_unavailable", logging.WARNING, component="lease",
                      error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            # Try again soon; the table's deadlines keep firing safe meanwhile.
            self._next_renew = now + min(1.0, self._s.renew_interval_s)
            self._next_poll = now + self._s.poll_interval_s
        finally:
            self._metrics.partitions_owned.set(len(self._table))

    def _renew(self, now: float) -> None:
        held = list(self._table.held().values())
        renewed = self._coord.renew(held)
        self.last_heartbeat_mono = now
        self._table.grant(renewed, now, self._s.lease_ttl_s)
        kept = {pid for pid, _ in renewed}
        lost = [lease for lease in held if lease.partition_id not in kept]
        if lost:
            self._table.drop(lease.partition_id for lease in lost)
            self._metrics.lease_events.labels(kind="lost").inc(len(lost))
            log.event("lease_lost", logging.WARNING, node=self._s.node_id,
                      partitions=len(lost), sample=[lease.partition_id for lease in lost[:8]])
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
                log.event("lease_claimed", node=self._s.node_id, partitions=len(claimed),
                          held=len(held) + len(claimed), share=share, live_nodes=len(live))
                if self._on_claimed is not None:
                    self._on_claimed()
        elif len(held) > share:
            excess = sorted(held.values(), key=lambda lease: lease.partition_id)[share:]
            self._release(excess, reason="over_share", share=share)

    def _release(self, leases: list[Lease], reason: str, **fields: object) -> None:
        pids = [lease.partition_id for lease in leases]
        self._table.start_draining(pids)
        with self._table.tick_lock:  # the tick that may be firing them has ended
            released = self._coord.release(leases)
        self._table.drop(pids)
        self._metrics.lease_events.labels(kind="released").inc(len(released))
        log.event("lease_released", node=self._s.node_id, partitions=len(released),
                  reason=reason, **fields)

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set, waking every ≤ ``poll_interval_s`` (or at :meth:`wake`)."""
        while not stop.is_set():
            self._wake.clear()
            self.run_once()
            wake = min(self._next_renew, self._next_poll) - self._clock.monotonic()
            self._clock.wait(self._wake if self._watching else stop, max(0.01, wake))

    def leave(self) -> None:
        """Release all leases and withdraw membership; best effort, never raises."""
        try:
            held = list(self._table.held().values())
            if held:
                self._release(held, reason="shutdown")
            self._coord.leave()
            log.event("node_left", node=self._s.node_id)
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event("leave_failed", logging.WARNING, node=self._s.node_id, error=str(exc))
        finally:
            self._metrics.partitions_owned.set(len(self._table))


def make_coordinator(settings: Settings, metrics: Metrics) -> Coordinator:
    """The coordinator ``settings.coordinator`` names: ``sql`` (default) or ``etcd``.

    The etcd one needs the optional ``etcd`` extra (``pip install '.[etcd]'``).
    """
    kind = getattr(settings, "coordinator", "sql")
    if kind == "etcd":
        from scheduler.etcd_coordinator import EtcdCoordinator

        return EtcdCoordinator(settings, metrics)
    return SqlCoordinator(settings, metrics)
