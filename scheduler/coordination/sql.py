"""The SQL coordinator: leases and membership as rows in the store (the default)."""

from __future__ import annotations

import logging
import os
import socket
import uuid

import psycopg

from scheduler import log, store
from scheduler.clock import Clock, SystemClock
from scheduler.coordination.protocol import CoordinatorBase, read_fences, release_lease_rows
from scheduler.coordination.rewind import RenewalWatermarks
from scheduler.coordination.table import Lease
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store import StoreSession


class SqlCoordinator(CoordinatorBase):
    """Leases and membership as rows in the SQL store (the default coordinator).

    Holds one dedicated autocommit store session (:class:`StoreSession`,
    reopened after a failure). Store writes per second for N nodes holding P
    partitions: N heartbeats and N renewal statements (P lease row writes) every ``renew_interval_s``, plus
    claims. The heartbeat (``nodes``) and the renewal (``leases``) are
    separate transactions, heartbeat first, and neither touches the
    ``partitions`` rows the firing fence locks: only a claim does. Store
    times (heartbeat, expiry, "expired") are the store's clock, or the
    ``clock``'s pin in tests (:class:`StoreSession`). Each renewal also
    checks that the store still holds what the previous one wrote
    (:class:`~scheduler.coordination.rewind.RenewalWatermarks`: a store
    that went back in time is logged and counted).
    """

    def __init__(self, settings: Settings, metrics: Metrics, clock: Clock | None = None) -> None:
        self._settings = settings
        self._clock = clock or SystemClock()
        self._session = StoreSession(settings, metrics, self._clock)
        self.node_id = settings.node_id
        self.incarnation = uuid.uuid4()
        self._watermarks = RenewalWatermarks(settings.node_id, metrics)

    def _tx(self, body):
        """Run ``body(conn)`` in a transaction of the store session (retried on 40001)."""
        return self._session.transaction(body)

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
        """Heartbeat for the first time; if another process heartbeat as this node id within
        ``responsive_s`` (a node running with the same id, or this node's previous process),
        log ``node_id_in_use`` (WARNING): this one then claims nothing that one holds and
        waits, a standby, until its leases expire."""
        if self.node_id in self.live_nodes():
            log.event(
                "node_id_in_use",
                logging.WARNING,
                node=self.node_id,
                why="another process heartbeat as this node id in the last "
                f"{self._settings.responsive_s:g}s (a node running with the same --node-id, or this "
                "node's previous process): this one takes over only what that one lets expire",
            )
        self.heartbeat()

    def heartbeat(self) -> bool:
        """Upsert this node's ``nodes`` row (its own transaction); always True."""
        self._tx(self._heartbeat)
        return True

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        """One ``renew_leases`` statement over ``leases`` (lease rows only); the pairs renewed.

        The rows' ``renewed_at`` before the update are checked against what
        this node's previous renewal (or claim) wrote (:class:`RenewalWatermarks`).
        """
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
        self._watermarks.check(rows)
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
        self._watermarks.claimed(rows)
        return [(row["partition_id"], row["owner_epoch"]) for row in rows]

    def release(self, leases: list[Lease]) -> list[int]:
        return release_lease_rows(self._session, self.node_id, leases)

    def fences(self, partition_ids: list[int]) -> dict[int, tuple[str | None, int]]:
        """The fence rows of ``partition_ids`` (:func:`read_fences`)."""
        return read_fences(self._session, partition_ids)

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

    def close(self) -> None:
        """Close the store session."""
        self._session.close()
