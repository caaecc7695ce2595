"""The coordinator interface: every method a coordinator offers, declared (docs/design.md §2).

:class:`Coordinator` is the protocol the lease loop and the node program
against; :class:`CoordinatorBase` gives the optional parts their no-op
defaults (no pruning, no preflight, no membership watch), so an
implementation states what it does instead of being probed for it.
Implementations: :class:`~scheduler.coordination.sql.SqlCoordinator` (the
default) and :class:`~scheduler.coordination.etcd.EtcdCoordinator`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from scheduler import store
from scheduler.coordination.table import Lease


class Coordinator(Protocol):
    """Ownership decisions: membership, claim, renew, release (docs/design.md §2).

    The firing transaction and its fence do not depend on which coordinator
    is used. Every method but :attr:`watches_membership` and
    :meth:`set_on_change` may raise :class:`~scheduler.errors.StoreError`,
    ``psycopg.Error`` or :class:`~scheduler.errors.CoordinatorError` (the
    etcd client's errors); the lease loop survives them.
    """

    node_id: str

    @property
    def watches_membership(self) -> bool:
        """True if the coordinator reports membership and lease changes itself
        (through the callback of :meth:`set_on_change`), so the lease loop can
        rebalance at once instead of at its next poll (etcd); False if changes
        are only seen by polling :meth:`live_nodes` (SQL)."""
        ...

    def set_on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from any thread) when a member joins or leaves or a
        partition is freed. Only called when :attr:`watches_membership` is True."""
        ...

    def preflight(self) -> None:
        """Called by the node before it starts its loops; raises
        :class:`~scheduler.errors.SchedulerError` to refuse the start (etcd: its
        revision below the stored epochs)."""
        ...

    def join(self) -> None:
        """Announce this node (heartbeat) before the first poll."""
        ...

    def heartbeat(self) -> bool:
        """Record this node's membership heartbeat, on its own (its own transaction).

        Returns True if it did; False if :meth:`renew` carries the heartbeat
        (etcd: the keep-alive of the node's one lease is both).
        """
        ...

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        """Renew ``leases``; return the ``(partition, epoch)`` still ours.

        Must not wait for the firing fence's locks (the lease is not kept on
        the rows the fence locks).
        """
        ...

    def live_nodes(self) -> list[str]:
        """Node ids that count when shares are computed, sorted.

        SQL: heartbeat younger than ``Settings.responsive_s`` (not the TTL);
        etcd: members whose key (on their etcd lease) exists.
        """
        ...

    def claim(self, limit: int) -> list[tuple[int, int]]:
        """Claim up to ``limit`` free/expired partitions; return ``(partition, new epoch)``."""
        ...

    def release(self, leases: list[Lease]) -> list[int]:
        """Release ``leases``; return the partition ids actually released."""
        ...

    def fences(self, partition_ids: list[int]) -> dict[int, tuple[str | None, int]]:
        """The store's fence rows ``{partition: (owner node, epoch)}`` of ``partition_ids``
        (one read; the lease loop's rewind check, :mod:`scheduler.coordination.rewind`)."""
        ...

    def prune(self) -> None:
        """Forget members dead for ``Settings.node_prune_after_s`` (the lease loop
        calls it about once a minute)."""
        ...

    def leave(self) -> None:
        """Withdraw membership (graceful stop)."""
        ...

    def close(self) -> None:
        """Free connections (and, etcd, the watch and its event loop)."""
        ...


class CoordinatorBase:
    """No-op defaults for the optional parts of :class:`Coordinator`.

    A subclass that watches membership overrides :attr:`watches_membership`
    (True) and :meth:`set_on_change`; one with dead members to forget
    overrides :meth:`prune`; one that can refuse a start overrides
    :meth:`preflight`. The required methods (join, heartbeat, renew,
    live_nodes, claim, release, fences, leave, close) have no default.
    """

    @property
    def watches_membership(self) -> bool:
        """False: membership changes are seen by polling :meth:`live_nodes`."""
        return False

    def set_on_change(self, callback: Callable[[], None]) -> None:
        """Nothing: a coordinator that does not watch never calls back."""

    def preflight(self) -> None:
        """Nothing to check before the node starts."""

    def prune(self) -> None:
        """Nothing to forget."""


def release_lease_rows(session: store.StoreSession, node_id: str, leases: list[Lease]) -> list[int]:
    """Free the store's lease rows of ``leases`` that ``node_id`` still holds at
    their epochs (``release_leases``: keyed on node and epoch, so a stale epoch
    frees nothing; the fence row keeps its epoch), in one transaction of
    ``session``; return the partitions freed. Both coordinators release this
    way (the etcd one then deletes its keys)."""
    if not leases:
        return []
    rows = session.transaction(
        lambda conn: store.execute(
            conn,
            "release_leases",
            {
                "node_id": node_id,
                "partition_ids": [lease.partition_id for lease in leases],
                "epochs": [lease.epoch for lease in leases],
            },
        )
    )
    return [row["partition_id"] for row in rows]


def read_fences(session: store.StoreSession, partition_ids: list[int]) -> dict[int, tuple[str | None, int]]:
    """The fence rows of ``partition_ids`` (``select_fences``, one read in a transaction of
    ``session``): ``{partition: (owner node or None, epoch)}``; ``{}`` for no ids.
    Both coordinators answer :meth:`Coordinator.fences` this way."""
    if not partition_ids:
        return {}
    rows = session.transaction(
        lambda conn: store.execute(conn, "select_fences", {"partition_ids": list(partition_ids)})
    )
    return {row["partition_id"]: (row["owner_node"], row["owner_epoch"]) for row in rows}
