"""A tick's state: its outcome (:class:`TickResult`) and what its passes share (:class:`Tick`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import psycopg

from scheduler import store

NO_CURSOR = (datetime(1, 1, 1, tzinfo=UTC), -1, "00000000-0000-0000-0000-000000000000")
"""(next_due_at, partition_id, job_id) before every timer: a pass's cursor when
it starts from the oldest due timer (see select_due_jobs in sql/queries.sql)."""

LAST_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
"""The job id after every other: a cursor past a herd's last partition."""


@dataclasses.dataclass
class TickResult:
    """Outcome of one tick (counts; ``lags_s`` are fired_at − scheduled, store clock)."""

    due_read: int = 0
    fired: int = 0
    herd_fired: int = 0  # of ``fired``, through fire_group (see scheduler/firing/herds.py)
    skipped_ranges: int = 0
    fence_rejected: list[int] = dataclasses.field(default_factory=list)
    stale_jobs: int = 0
    lags_s: list[float] = dataclasses.field(default_factory=list)
    # Due work may be left: a tenant read all it was granted, or a conflict
    # ended the tick before its passes were all read.
    budget_exhausted: bool = False
    replanned: int = 0  # jobs moved to their true slot (scheduler/tzreplan.py)
    requests: int = 0  # run-now requests carried out (scheduler/delivery/manual.py)


@dataclasses.dataclass
class TickFailure:
    """What a tick was doing, for the ``tick_failed`` log event if a store error ends it.

    ``step``: the statement the tick was in (``tenant_weights``,
    ``find_herds`` (the herd lookup's reads), ``select_due_jobs`` (a page of
    the due scan), ``fire_runs`` or ``fire_group`` (a chunk), ``replan_slots``,
    ``fire_run_requests``); ``None`` before the first. Once the tick's chunks
    were collected: ``chunks_committed`` and ``chunks_failed`` (statement or
    COMMIT failed, or never ran: the chunks queued after a failed one on its
    lane are skipped; a chunk re-sent after a retryable error and committed
    then counts as committed), and a failed chunk names the step (the error surfaces
    wherever the tick next touches the pipeline, e.g. while reading the due
    scan). ``None`` if the tick failed before they were collected.
    """

    step: str | None = None
    chunks_committed: int | None = None
    chunks_failed: int | None = None

    def collected(self, sent: int, failed: list[Any]) -> None:
        """The tick's ``sent`` chunks were collected, ``failed`` (store.Sent) did not commit."""
        self.chunks_committed, self.chunks_failed = sent - len(failed), len(failed)
        if failed:
            self.step = failed[0].query

    def resent(self) -> None:
        """One of the failed chunks was re-sent and committed (after a retryable error)."""
        if self.chunks_committed is not None and self.chunks_failed:
            self.chunks_committed, self.chunks_failed = self.chunks_committed + 1, self.chunks_failed - 1


@dataclasses.dataclass(eq=False)
class Tick:
    """What a tick's passes share, created once per tick.

    ``firable``: partition id → fencing epoch (this tick's firable
    partitions); ``epochs``: the same as a PostgreSQL array literal indexed
    by partition id (:func:`scheduler.firing.batch.epochs_literal`), built
    once per tick and sent with every chunk; ``read``: the due-scan session;
    ``pipeline``: the write lanes and the chunks sent on them; ``quotas``:
    the first pass's fair shares (runs per tenant); ``granted``: runs each
    tenant may fire this tick (shares plus surplus); ``fetched``: due rows
    (and herd timers) read per tenant; ``used``: runs planned per tenant;
    ``last``: each tenant's cursor after what it was served
    ((next_due_at, partition_id, job_id)); ``result``: the counts.
    """

    firable: dict[int, int]
    epochs: str
    read: psycopg.Connection
    pipeline: store.Pipeline
    quotas: dict[str, int]
    granted: dict[str, int]
    result: TickResult
    fetched: Counter[str] = dataclasses.field(default_factory=Counter)
    used: Counter[str] = dataclasses.field(default_factory=Counter)
    last: dict[str, tuple] = dataclasses.field(default_factory=dict)
