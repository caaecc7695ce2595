"""The lease loop: keeps this node's share of leases (heartbeat, renew, poll, claim, drain, release)."""

from __future__ import annotations

import logging
import threading

import psycopg

from scheduler import log
from scheduler.clock import Clock
from scheduler.coordination.protocol import Coordinator
from scheduler.coordination.rewind import RewindWatch
from scheduler.coordination.table import Lease, LeaseTable, fair_share
from scheduler.errors import SchedulerError
from scheduler.metrics import Metrics
from scheduler.settings import Settings

PRUNE_INTERVAL_S = 60.0
"""How often (seconds, the loop's clock) the lease loop asks the coordinator to :meth:`~Coordinator.prune`."""


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

    **Rejoining after a gap.** When this node's heartbeat succeeds again
    more than :attr:`Settings.responsive_s` after its previous one (the store
    or etcd was out of reach, or the node was frozen), it does not trust the
    membership it reads at once: its peers, cut off by the same outage, have
    heartbeats just as old, so they do not count yet, and every lease in the
    store may have expired. Claiming then would take the peers' partitions
    wholesale (a share of 1,024 for the first node back) only for them to
    be lost by their owners and released again by the claimer. So the node
    first heartbeats, then waits one ``responsive_s`` (``store_rejoined`` is
    logged) before it computes its share and claims or drains; meanwhile it
    renews what it still validly holds (a renewal is keyed on node and
    epoch, so an expired lease nobody took is renewed) and fires it. The
    threshold is the responsiveness interval, not the TTL: a gap longer than
    ``responsive_s`` is exactly when peers sharing the outage stop counting,
    and some of their leases may already have expired when the gap is still
    shorter than the TTL (a lease expires one TTL after its last renewal,
    which may precede the outage by up to ``renew_interval_s``). A
    rebalance is also skipped while this node's own heartbeat is older than
    ``responsive_s`` (a poll that finds the store back before the next
    heartbeat waits for it: heartbeat first). The cost: after such a gap,
    partitions of a node that died meanwhile are claimed ``responsive_s``
    later.

    **A store that went back in time** (:mod:`scheduler.coordination.rewind`):
    the loop remembers the epochs it was granted (:class:`RewindWatch`) and
    compares them with a claim's result, and with the fence rows
    (:meth:`Coordinator.fences`) of leases a renewal missed and, on the first
    renewal after a store error, of every partition it remembers; a rewind
    is logged (``store_rewound``) and counted, and the loop carries on.

    A coordinator that *watches* membership and leases (etcd: its
    :attr:`~Coordinator.watches_membership` is True) gets :meth:`wake` as its
    ``set_on_change`` callback, so a member joining or leaving, or a partition
    key deleted (expired or released), triggers a rebalance at once instead of
    at the next poll. With such a coordinator, whoever sets ``stop`` must also
    call :meth:`wake`.
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
        self._rejoin_until = 0.0  # monotonic: no share computed before it (after a gap, see above)
        self._rewind = RewindWatch(settings.node_id, metrics)
        self._store_failed = False  # a store call failed since the last rewind check of every partition
        self._claiming = True
        self._drain_reason: dict[str, object] = {"reason": "over_share"}
        self._wake = threading.Event()
        self._poll_requested = False
        self._watching = coordinator.watches_membership
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
                self._rebalance(now)
                self._next_poll = now + self._s.poll_interval_s
            releasable = self._table.releasable()
            if releasable:
                self._release(releasable, **self._drain_reason)
            if now >= self._next_prune:
                self._coord.prune()
                self._next_prune = now + PRUNE_INTERVAL_S
        except (psycopg.Error, SchedulerError, OSError) as exc:
            log.event(
                "store_unavailable",
                logging.WARNING,
                component="lease",
                error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            self._store_failed = True
            # Try again soon; the table's deadlines keep firing safe meanwhile.
            self._next_renew = now + min(1.0, self._s.renew_interval_s)
            self._next_poll = now + self._s.poll_interval_s
        finally:
            self._metrics.partitions_owned.set(len(self._table))

    def _renew(self, now: float) -> None:
        """Heartbeat, then renew every held lease (draining ones too), each its own transaction."""
        beat = self._coord.heartbeat()
        if beat:
            self._heard(now)
        held = list(self._table.held().values())
        sent = self._clock.monotonic()
        renewed = self._coord.renew(held)
        if not beat:
            self._heard(now)
        self._table.grant(renewed, sent, self._s.lease_ttl_s)
        self._rewind.granted(renewed)
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
        # Rewind check (module rewind): the fences of what a renewal missed, and, after a store
        # error (a reconnect, perhaps to a promoted standby), of every partition remembered.
        check = {lease.partition_id for lease in lost}
        if self._store_failed:
            check.update(self._rewind.known())
        if check:
            self._rewind.check_fences(self._coord.fences(sorted(check)))
        self._store_failed = False

    def _heard(self, now: float) -> None:
        """A heartbeat succeeded at ``now``; after a gap over ``responsive_s``, start the rejoin wait."""
        previous, self.last_heartbeat_mono = self.last_heartbeat_mono, now
        wait = self._s.responsive_s
        if previous and now - previous > wait:
            self._rejoin_until = now + wait
            log.event(
                "store_rejoined",
                logging.WARNING,
                node=self._s.node_id,
                gap_s=round(now - previous, 3),
                wait_s=wait,
                held=len(self._table),
                note="heartbeat sent; no new claims for one responsiveness interval, until the peers' heartbeats "
                "land (leases still held are renewed and fire meanwhile)",
            )

    def stop_claiming(self) -> None:
        """Keep renewing but claim nothing more (the node is stopping).

        Without this, a node that got SIGTERM while a peer's leases expired
        could claim partitions only to release them a moment later.
        """
        self._claiming = False

    def _rebalance(self, now: float) -> None:
        """Compute the share over the live nodes; claim up to it or drain above it.

        Skipped (nothing read) while this node's heartbeat is older than
        ``responsive_s`` or its rejoin wait lasts (see the class docstring).
        """
        if now - self.last_heartbeat_mono > self._s.responsive_s or now < self._rejoin_until:
            return
        live = self._coord.live_nodes()
        if self._coord.node_id not in live:
            live.append(self._coord.node_id)
        self._metrics.live_nodes.set(len(live))
        share = fair_share(len(live))
        held = self._table.held()
        if len(held) < share and self._claiming:
            sent = self._clock.monotonic()
            claimed = self._coord.claim(share - len(held))
            self._rewind.check_claimed(claimed)
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
