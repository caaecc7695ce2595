"""Coordination: partition leases, who *should* fire each partition (docs/design.md §2, §6).

The package
-----------
* :mod:`~scheduler.coordination.table`: :class:`Lease`, :class:`LeaseTable`
  (the node-local view the firing loop reads), :func:`fair_share`;
* :mod:`~scheduler.coordination.protocol`: the :class:`Coordinator` interface,
  every method declared, and :class:`CoordinatorBase` (no-op defaults for the
  optional ones: ``prune``, ``preflight``, the membership watch);
* :mod:`~scheduler.coordination.loop`: :class:`LeaseLoop`;
* :mod:`~scheduler.coordination.rewind`: noticing a store that went back in
  time (asynchronous failover, restored backup): logged and counted;
* :mod:`~scheduler.coordination.sql`: :class:`SqlCoordinator` (the default);
* :mod:`~scheduler.coordination.etcd` (with ``etcd_link``, ``etcd_mirror``,
  ``etcd_keys``): ``EtcdCoordinator`` (the optional ``etcd`` extra);
* :mod:`~scheduler.coordination.etcd_gateway`: etcd through its JSON gateway
  (operations tools, no extra needed);
* this face: the names above and :func:`make_coordinator`.

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
When the store comes back after a gap longer than ``responsive_s`` between
two heartbeats, a node heartbeats, renews what it still holds, and waits one
``responsive_s`` for its peers' heartbeats before it computes its share
(:class:`LeaseLoop`, "Rejoining after a gap"), so the first node back does
not claim every expired lease.
Crash failover lateness is bounded by TTL + poll + tick ≈ 12 s (§6).
"""

from __future__ import annotations

from scheduler.clock import Clock
from scheduler.coordination.loop import LeaseLoop
from scheduler.coordination.protocol import Coordinator, CoordinatorBase
from scheduler.coordination.sql import SqlCoordinator
from scheduler.coordination.table import Lease, LeaseTable, fair_share
from scheduler.metrics import Metrics
from scheduler.settings import Settings

__all__ = [
    "Coordinator",
    "CoordinatorBase",
    "Lease",
    "LeaseLoop",
    "LeaseTable",
    "SqlCoordinator",
    "fair_share",
    "make_coordinator",
]


def make_coordinator(settings: Settings, metrics: Metrics, clock: Clock | None = None) -> Coordinator:
    """The coordinator ``settings.coordinator`` names: ``sql`` (default) or ``etcd``.

    ``clock`` (default: the system clock) is the node's injected clock; the
    etcd coordinator reads its local time from it (the SQL one keeps no local
    time: the store's clock judges its leases), and both send its store pin
    (:meth:`~scheduler.clock.Clock.store_now_or_none`, None in production)
    as the ``now`` of their store queries. The etcd one needs the optional
    ``etcd`` extra (``pip install '.[etcd]'``).
    """
    if settings.coordinator == "etcd":
        # Imported here: the etcd client (the optional extra) loads only when chosen.
        from scheduler.coordination.etcd import EtcdCoordinator

        return EtcdCoordinator(settings, metrics, clock)
    return SqlCoordinator(settings, metrics, clock)
