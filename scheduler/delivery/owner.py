"""The partition owner's steps for runs outside the schedule: run-now requests and buffered runs.

Split from :mod:`scheduler.delivery.manual` (the CLI side: requesting,
waiting, backfilling) so the firing thread and the delivery loop import
nothing of the admin commands. Both functions are fenced by the owner's
epochs like ``fire_runs``: a node that lost a partition changes none of its
requests or runs.

* :func:`fire_requests` (``fire_run_requests``): carried out by the firing
  thread right after a tick's chunks, so a manual run and a scheduled run
  of a ``forbid`` job never both see "no unfinished run".
* :func:`release_buffered` (``release_buffered_runs``): a step of
  :class:`~scheduler.delivery.loop.SettleLoop`.

``now`` (aware) is the store clock's pin in tests; production passes None.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from scheduler import store
from scheduler.firing.batch import epochs_literal

RELEASE_BATCH = 1000
"""Waiting ``buffer_one`` runs one release statement makes available at most."""

REQUEST_BATCH = 1000
"""Run-now requests one owner statement carries out at most (one per job)."""


def fire_requests(
    conn: psycopg.Connection,
    node_id: str,
    epochs: dict[int, int],
    now: datetime | None = None,
    epochs_text: str | None = None,
) -> list[dict[str, Any]]:
    """The owner's run-now step (``fire_run_requests``): carry out the oldest
    open request of each job of the partitions in ``epochs`` (partition id →
    epoch held), fenced. Returns the requests done (partition_id, job_id,
    request_id, outcome, nominal_time). ``epochs_text``: ``epochs`` already
    as :func:`~scheduler.firing.batch.epochs_literal` made it (the tick has it)."""
    if not epochs:
        return []
    params = {
        "node_id": node_id,
        "pids": sorted(epochs),
        "epochs": epochs_text or epochs_literal(epochs),
        "limit": REQUEST_BATCH,
        "now": now,
    }
    return store.run_transaction(conn, lambda c: store.execute(c, "fire_run_requests", params))


def release_buffered(
    conn: psycopg.Connection, node_id: str, epochs: dict[int, int], now: datetime | None = None
) -> int:
    """The owner's release step (``release_buffered_runs``; a
    :class:`~scheduler.delivery.loop.SettleLoop` step): waiting ``buffer_one``
    runs of the partitions in ``epochs`` whose job has no other unfinished run
    become available now. Fenced by the epochs. Returns the runs released."""
    if not epochs:
        return 0
    params = {
        "node_id": node_id,
        "pids": sorted(epochs),
        "epochs": epochs_literal(epochs),
        "limit": RELEASE_BATCH,
        "now": now,
    }
    return len(store.run_transaction(conn, lambda c: store.execute(c, "release_buffered_runs", params)))
