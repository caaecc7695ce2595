"""A coordinator's own store session (held by both coordinators, never inherited)."""

from __future__ import annotations

import psycopg

from scheduler import store
from scheduler.clock import Clock, SystemClock
from scheduler.errors import StoreError
from scheduler.metrics import Metrics
from scheduler.settings import Settings


class StoreSession:
    """A coordinator's own store connection: one autocommit session, reopened after a failure.

    Held by :class:`~scheduler.coordination.sql.SqlCoordinator` and
    :class:`~scheduler.coordination.etcd.EtcdCoordinator` (which writes only
    the claim's epoch and releases) as their ``_session``. The session carries the node
    timeouts (lock, statement, idle in transaction) and the application name
    ``scheduler-lease:<node id>``. ``clock`` (default the system clock) is
    the node's injected clock: its :meth:`~scheduler.clock.Clock.store_now_or_none`
    is the ``now`` every time-dependent lease query is sent (None in
    production: the store's ``now()``).
    """

    def __init__(self, settings: Settings, metrics: Metrics, clock: Clock | None = None) -> None:
        self._settings = settings
        self._metrics = metrics
        self._clock = clock or SystemClock()
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
            if (
                isinstance(exc, StoreError)
                or isinstance(exc, psycopg.OperationalError)
                or (self._conn is not None and self._conn.closed)
            ):
                self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
