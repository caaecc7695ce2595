"""The etcd coordinator's epochs in the store: write a claim's revision, refuse a regression."""

from __future__ import annotations

import logging

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.coordination.etcd_keys import KeyLayout
from scheduler.coordination.etcd_link import EtcdLink
from scheduler.errors import EpochRegressionError, SchedulerError
from scheduler.settings import Settings
from scheduler.store import StoreSession

SWITCHING_COORDINATORS_DOC = "docs/operations.md, 'Switching coordinators'"
"""Where raising etcd's revision above the stored epochs is explained."""
EPOCH_REGRESSION_HINT = (
    "etcd's revision must exceed every stored owner_epoch (a reset etcd, or a switch "
    f"from the SQL coordinator): run `scheduler etcd raise-revision`, see "
    f"{SWITCHING_COORDINATORS_DOC}"
)
"""The ``hint`` of every ``epoch_regression`` record."""


class EpochFence:
    """The fence side of etcd claims: the claim's revision is the epoch written to the store.

    Store queries go through ``session`` (``now``: ``clock``'s store pin);
    etcd's current revision is read through ``link``.
    """

    def __init__(
        self, settings: Settings, clock: Clock, session: StoreSession, link: EtcdLink, layout: KeyLayout
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._session = session
        self._link = link
        self._layout = layout
        self._node_id = settings.node_id

    def write(self, pids: list[int], revision: int) -> set[int]:
        """``claim_partitions_at_epoch``: fence ``pids`` at ``revision`` where the stored
        epoch is below it; return the partitions fenced (the others regressed)."""
        rows = self._session.transaction(
            lambda conn: store.execute(
                conn,
                "claim_partitions_at_epoch",
                {
                    "node_id": self._node_id,
                    "epoch": revision,
                    "ttl_s": self._settings.lease_ttl_s,
                    "partition_ids": pids,
                    "now": self._clock.store_now_or_none(),
                },
            )
        )
        return {row["partition_id"] for row in rows}

    def _stored(self) -> list:
        return self._session.transaction(
            lambda conn: store.execute(conn, "partition_status", {"now": self._clock.store_now_or_none()})
        )

    async def _current_revision(self) -> int:
        client = await self._link.client()
        self._link.requests += 1
        return (await client.get_prefix(self._layout.members, keys_only=True)).header.revision

    def check(self) -> None:
        """Refuse (ERROR ``epoch_regression`` + :class:`EpochRegressionError`) if etcd's
        current revision is below an ``owner_epoch`` in the store (its next
        claims would not be above it).

        The store is read first, then etcd: an epoch written by a peer's claim
        in between came from a revision etcd has already passed, so racing
        joiners never refuse each other.
        """
        rows = self._stored()
        if not rows:
            return
        top = max(rows, key=lambda row: row["owner_epoch"])
        revision = self._link.call(self._current_revision, what="revision")
        # Every epoch this etcd produced is ≤ its current revision, and every
        # later claim is above it: only a revision *below* a stored epoch is a
        # regression (an epoch equal to it was this etcd's own last claim).
        if revision < top["owner_epoch"]:
            self.log_regression(top["partition_id"], top["owner_epoch"], revision)
            raise EpochRegressionError(
                f"etcd revision {revision} is below the store's owner_epoch {top['owner_epoch']} "
                f"(partition {top['partition_id']}): claims would not fence the previous owners; raise the "
                f"etcd revision above {top['owner_epoch']} first: `scheduler etcd raise-revision` "
                f"({SWITCHING_COORDINATORS_DOC})"
            )

    def report_regressed(self, pids: list[int], revision: int) -> None:
        """ERROR ``epoch_regression`` for each of ``pids`` (their stored epoch is ≥ ``revision``),
        with the stored epoch when the store can be read."""
        try:
            stored = {row["partition_id"]: row["owner_epoch"] for row in self._stored()}
        except (psycopg.Error, SchedulerError):
            stored = {}
        for pid in pids:
            self.log_regression(pid, stored.get(pid), revision)

    def log_regression(self, partition_id: int, stored_epoch: int | None, revision: int) -> None:
        """ERROR ``epoch_regression``: ``partition_id``'s stored epoch (None: unread) is not below ``revision``."""
        log.event(
            "epoch_regression",
            logging.ERROR,
            node=self._node_id,
            partition=partition_id,
            stored_epoch=stored_epoch,
            revision=revision,
            hint=EPOCH_REGRESSION_HINT,
        )
