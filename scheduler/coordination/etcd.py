"""The etcd coordinator: leases and membership in etcd, epochs in the store (docs/design.md §2).

Keys, under ``settings.etcd_prefix`` (default ``/scheduler/``)::

    <prefix>members/<node id>        {"incarnation", "host", "pid"}   attached to the node's lease
    <prefix>partitions/<0000-1023>   <node id>                        attached to the node's lease

One etcd lease per node process (TTL ``lease_ttl_s`` rounded up to whole
seconds; etcd raises it to its own minimum, 2 s with the default election
timeout), kept alive every ``renew_interval_s``. The membership key and every
partition key hang on it, so when a node dies they all expire together.

* **Membership by watching.** A watch task on the prefix keeps a mirror of
  the members and of the partition keys (list, then watch from the listed
  revision + 1; re-list after any watch failure). ``live_nodes()`` reads the
  mirror: no membership polling. A member joining or leaving, or a
  partition key deleted (expired or released), wakes the lease loop
  (:meth:`set_on_change`), which rebalances at once rather than at its next
  poll: this is what makes etcd failover faster than the SQL poll.
* **Claim** = one etcd transaction per chunk of ≤ 128 free keys (etcd's
  default ``--max-txn-ops``): ``create_revision == 0`` for every key, then
  put each with our lease; on failure the transaction returns the keys' current
  values, the taken ones are dropped and the rest retried in smaller chunks.
  Free keys are tried in rendezvous-hash order over the live members (each
  node first tries the partitions it "wins"), so racing claimers rarely
  collide. The mirror picks the candidates; if it shows nothing free while
  the node is under its share, etcd is listed at most once per TTL (timed by
  the node's injected clock, like every local time here). The claim's
  revision is the **epoch**, written with ``claim_partitions_at_epoch``
  (``SET owner_epoch = :rev WHERE owner_epoch < :rev`` on the fence row, and
  the store's lease row with it), so a new owner that pauses before writing
  cannot overwrite a newer one.
* **Epoch regression.** A partition whose stored epoch is already ≥ the
  revision (a reset etcd, or a switch from the SQL coordinator's counters)
  is not fenced by our write: it is logged at ERROR (``epoch_regression``
  with the partition, the stored epoch and the revision), not returned (so
  never fired) and its key is deleted (so it is not held unfenced). At join,
  if etcd's current revision is below the store's largest
  ``owner_epoch``, the node refuses to start (:meth:`preflight`) or, if it
  learns it later, to join. See docs/operations.md for the way out.
* **Renew** = one keep-alive plus one ``LeaseTimeToLive(keys=True)``: the
  partitions returned are those whose key still hangs on our lease. If the
  lease has expired (a paused process), every key is gone: nothing is
  returned (the lease loop logs ``lease_lost``), and a new lease and
  membership key are made at once. Keys on our lease that the lease loop
  does not hold (a claim whose store write failed) are deleted.
* **Release** = the store's lease row first (``release_leases``, so it
  reads free; the fence row keeps its epoch), then the keys (a transaction
  per chunk of 64, each delete conditional on the key hanging on our lease
  and its ``create_revision`` being the lease's epoch: keyed on node and
  epoch, so a stale epoch or another node's lease releases nothing).
  **Leave** revokes the lease.

Store writes per second are only claims and releases; the steady state costs
the store nothing (the fence is the same as with the SQL coordinator). etcd
requests in the steady state: 2 per node per ``renew_interval_s``.

Threading: the interface is synchronous (called from the lease loop
thread); the etcd calls run on a private event loop
(:class:`~scheduler.coordination.etcd_link.EtcdLink`). etcd failures become
:class:`~scheduler.errors.CoordinatorError`, which the lease loop logs and
retries; a connection failure moves to the next endpoint.

Rooms: this module (the coordinator's decisions), ``etcd_member`` (the
node's lease and membership key), ``etcd_link`` (event
loop, client, bounded calls), ``etcd_mirror`` (the watch and its mirror),
``etcd_partitions`` (the partition-key transactions), ``etcd_keys`` (key
layout, endpoints, claim order; pure).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable

import psycopg

from scheduler import log
from scheduler.clock import Clock, SystemClock
from scheduler.coordination.etcd_epochs import EpochFence
from scheduler.coordination.etcd_keys import ClaimOrder, KeyLayout, first_line, parse_endpoints
from scheduler.coordination.etcd_link import EtcdLink, aetcd
from scheduler.coordination.etcd_member import EtcdMember
from scheduler.coordination.etcd_mirror import EtcdMirror
from scheduler.coordination.etcd_partitions import MAX_TXN_OPS, PartitionKeys
from scheduler.coordination.protocol import CoordinatorBase, read_fences, release_lease_rows
from scheduler.coordination.table import Lease
from scheduler.errors import ConfigError, CoordinatorError, EpochRegressionError, SchedulerError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store import StoreSession

CLAIM_TXNS_MAX = 24
"""Claim transactions one ``claim()`` call may send (lost races included)."""


class EtcdCoordinator(CoordinatorBase):
    """Ownership decisions in etcd; epochs written to the store. See the module docstring.

    ``clock`` (default :class:`~scheduler.clock.SystemClock`) is the node's
    injected clock; its ``monotonic()`` times the coordinator's local
    decisions (how long ago etcd itself was last listed), so tests can step it,
    and its store pin is the ``now`` of the store queries it sends through
    the store session it holds
    (:class:`~scheduler.store.StoreSession`).
    """

    def __init__(self, settings: Settings, metrics: Metrics, clock: Clock | None = None) -> None:
        if aetcd is None:
            raise ConfigError(
                "coordinator: 'etcd' needs the optional etcd extra "
                "(pip install 'trigger-engine[etcd]', which brings aetcd)"
            )
        self._settings = settings
        self._clock = clock or SystemClock()
        self.node_id = settings.node_id
        endpoints = parse_endpoints(settings.etcd_endpoints)
        self._layout = KeyLayout(settings.etcd_prefix)
        # Each etcd request is bounded like a store statement: well below the TTL.
        self._timeout_s = settings.effective_statement_timeout_s
        self._order = ClaimOrder(self.node_id)
        self._held: dict[int, int] = {}  # partition -> epoch (claim revision) this process holds
        self._epochs_checked = False
        self._session = StoreSession(settings, metrics, self._clock)
        self._link = EtcdLink(endpoints, self._timeout_s, f"etcd-{self.node_id}")
        self._member = EtcdMember(self._link, self._layout, self.node_id, max(1, math.ceil(settings.lease_ttl_s)))
        self.incarnation = self._member.incarnation
        self._mirror = EtcdMirror(self._link, self._layout, self.node_id)
        self._keys = PartitionKeys(self._link, self._layout)
        self._epochs = EpochFence(settings, self._clock, self._session, self._link, self._layout)
        self._last_listed = self._clock.monotonic()

    # ------------------------------------------------------------------ plumbing

    @property
    def endpoint(self) -> str:
        """``host:port`` of the etcd endpoint in use."""
        return self._link.endpoint

    @property
    def requests(self) -> int:
        """etcd requests this coordinator sent (watch events not counted)."""
        return self._link.requests

    @property
    def watches_membership(self) -> bool:
        """True: the watch reports membership changes and freed partitions."""
        return True

    def set_on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from the watch thread) when membership changes or a key is freed."""
        self._mirror.on_change = callback

    @property
    def _lease_id(self) -> int | None:
        """The node's etcd lease (None: none now)."""
        return self._member.lease_id

    def _call(self, fn, *args, what: str):
        return self._link.call(fn, *args, what=what)

    def _delete(self, items: list[tuple[int, int | None]], what: str) -> list[int]:
        """Delete our keys of ``(partition, epoch or None)`` (:meth:`PartitionKeys.delete`)."""
        return self._link.call(self._keys.delete, items, self._lease_id, what=what)

    # ------------------------------------------------------------------ membership

    async def _join(self) -> None:
        await self._member.register()
        await self._mirror.start(self._timeout_s * 2)

    def join(self) -> None:
        """Grant the lease, put the membership key, start the watch; check epochs once.

        Raises :class:`EpochRegressionError` if etcd's revision is not above the
        store's largest ``owner_epoch`` (see :meth:`check_epochs`).
        """
        self._call(self._join, what="join")
        if not self._epochs_checked:
            self.check_epochs()
            self._epochs_checked = True

    def check_epochs(self) -> None:
        """Refuse (:class:`EpochRegressionError`) if etcd's revision is below a
        stored ``owner_epoch`` (:meth:`EpochFence.check
        <scheduler.coordination.etcd_epochs.EpochFence.check>`)."""
        self._epochs.check()

    def preflight(self) -> None:
        """Called by the node before it starts its loops: join and check epochs now.

        An :class:`EpochRegressionError` propagates (the node refuses to start);
        an unreachable etcd or store is only logged (the lease loop keeps trying).
        """
        try:
            self.join()
        except EpochRegressionError:
            raise
        except (CoordinatorError, psycopg.Error, SchedulerError, OSError) as exc:
            log.event(
                "coordinator_unavailable",
                logging.WARNING,
                node=self.node_id,
                endpoint=self.endpoint,
                error=first_line(exc),
                note="the lease loop keeps trying",
            )

    def live_nodes(self) -> list[str]:
        if not self._mirror.is_synced():
            raise CoordinatorError(f"etcd {self.endpoint}: membership not known yet (watch not synced)")
        return self._mirror.member_ids()

    def leave(self) -> None:
        """Revoke the lease: the membership key and any remaining partition keys go at once."""
        if self._lease_id is None:
            return
        self._held.clear()
        self._call(self._member.revoke, what="revoke")

    # ------------------------------------------------------------------ renew

    def heartbeat(self) -> bool:
        """Nothing on its own: the keep-alive in :meth:`renew` is the heartbeat; returns False."""
        return False

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        attached = self._call(self._member.keepalive, what="keep-alive")
        if attached is None:
            lost = len(self._held)
            had_lease = self._lease_id is not None
            self._member.lease_id = None
            self._held.clear()
            if had_lease:
                log.event(
                    "etcd_lease_expired",
                    logging.WARNING,
                    node=self.node_id,
                    partitions=lost,
                    note="every key on it is gone; joining again with a new lease",
                )
            self._call(self._member.register, what="re-register")
            return []
        mine = {pid for pid in map(self._layout.pid, attached) if pid is not None}
        held = {lease.partition_id for lease in leases}
        for pid in [pid for pid in self._held if pid not in mine]:
            del self._held[pid]
        orphans = sorted(mine - held)
        if orphans:  # on our lease but not held by the loop (a claim whose store write failed)
            log.event(
                "etcd_orphan_keys",
                logging.WARNING,
                node=self.node_id,
                partitions=len(orphans),
                sample=orphans[:8],
                note="deleting keys this node holds but does not fire",
            )
            self._delete([(pid, None) for pid in orphans], what="delete orphans")
            for pid in orphans:
                self._held.pop(pid, None)
        return [
            (lease.partition_id, lease.epoch)
            for lease in leases
            if lease.partition_id in mine and self._held.get(lease.partition_id) == lease.epoch
        ]

    # ------------------------------------------------------------------ claim
    def claim(self, limit: int) -> list[tuple[int, int]]:
        if limit <= 0:
            return []
        if self._lease_id is None:
            self._call(self._member.register, what="register")
        with self._mirror.lock:
            taken = set(self._mirror.owners)
            members = sorted(self._mirror.members)
        candidates = self._order.candidates(taken | set(self._held), members)
        now = self._clock.monotonic()
        if not candidates and now - self._last_listed > self._settings.lease_ttl_s:
            # Under share and the mirror says nothing is free: check etcd itself now and
            # then (bounds the harm of a stalled watch; never written into the mirror).
            self._last_listed = now
            listed = self._call(self._keys.listed, what="list")
            candidates = self._order.candidates(listed | set(self._held), members)
        claimed: list[tuple[int, int]] = []
        error: Exception | None = None
        txns = 0
        size = MAX_TXN_OPS
        while candidates and len(claimed) < limit and txns < CLAIM_TXNS_MAX:
            txns += 1
            chunk = candidates[: min(size, limit - len(claimed))]
            try:
                ok, revision, now_taken = self._call(
                    self._keys.claim, chunk, self.node_id.encode(), self._lease_id, what="claim"
                )
            except CoordinatorError as exc:
                error = exc
                break
            if not ok:  # lost a race for some keys: drop those, retry the rest in smaller chunks
                # (Not written into the mirror: the watch may already have applied a
                # later delete of the same key, and would never correct it.)
                lost = set(now_taken)
                lost |= self._mirror.taken()  # the watch has probably seen more by now
                candidates = [pid for pid in candidates if pid not in lost]
                size = max(1, size // 4)
                continue
            size = min(MAX_TXN_OPS, size * 2)
            candidates = candidates[len(chunk) :]
            try:
                fenced = self._epochs.write(chunk, revision)
            except (psycopg.Error, SchedulerError) as exc:
                # Held in etcd but not fenced in the store: give the keys back.
                with contextlib.suppress(SchedulerError):
                    self._delete([(pid, revision) for pid in chunk], what="undo claim")
                error = exc
                break
            regressed = [pid for pid in chunk if pid not in fenced]
            if regressed:
                self._regressed(regressed, revision)
            for pid in chunk:
                if pid in fenced:
                    self._held[pid] = revision
                    claimed.append((pid, revision))
        if error is not None:
            if not claimed:
                raise error
            log.event(
                "claim_partial", logging.WARNING, node=self.node_id, claimed=len(claimed), error=first_line(error)
            )
        return claimed

    def _regressed(self, pids: list[int], revision: int) -> None:
        """Stored epoch ≥ our revision: say so loudly, never fire them, give the keys back."""
        self._epochs.report_regressed(pids, revision)
        with contextlib.suppress(SchedulerError):
            self._delete([(pid, revision) for pid in pids], what="drop regressed")

    # ------------------------------------------------------------------ release

    def release(self, leases: list[Lease]) -> list[int]:
        if not leases:
            return []
        release_lease_rows(self._session, self.node_id, leases)
        items = [(lease.partition_id, lease.epoch) for lease in leases]
        deleted = self._delete(items, what="release")
        for lease in leases:  # a stale epoch releases nothing: the lease held stays held
            if self._held.get(lease.partition_id) == lease.epoch:
                del self._held[lease.partition_id]
        return deleted

    def fences(self, partition_ids: list[int]) -> dict[int, tuple[str | None, int]]:
        """The store's fence rows of ``partition_ids`` (:func:`read_fences`: the epochs live in the store)."""
        return read_fences(self._session, partition_ids)

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """Stop the watch, close the etcd client and the event loop, then the store session."""
        self._mirror.closing = True
        self._link.close(self._mirror.stop)
        self._session.close()
