"""Retention: delete old runs, skip ranges and soft-deleted jobs in bounded batches.

What goes
---------
With a retention of ``R`` seconds and ``cutoff = store now − R`` (computed once
per pass, on the store's clock; a node's retention loop reads it through its
clock's store pin, so a test that pins the store clock gets an exact
cutoff, see scheduler/clock.py):

* runs whose ``nominal_time < cutoff`` and that are finished (state
  ``succeeded``, ``dead``, ``canceled``) or predate delivery (state NULL):
  an unfinished run (``pending``, ``leased``, ``failed``) is never deleted,
  whatever its age (docs/delivery.md);
* skip ranges whose ``until_nominal < cutoff`` (entirely older);
* jobs soft-deleted (``jobs delete``) before ``cutoff``; their runs and skips
  are older still, so tables are pruned in that order. A pruned job's
  ``job_delivery`` row is deleted in the same transaction.

Nothing the firing path needs is touched: a live job's progress is its own
row's ``next_nominal_at``, not its runs, and deleted jobs are never due. An
audit (``verify``) of a window older than the retention reports the pruned
runs as missing: audit before pruning, or choose a retention longer than any
window you audit.

How
---
A pass walks each table's primary key (``partition_id`` first) over the
given partitions, :data:`PARTITIONS_PER_STATEMENT` partitions per statement
and at most ``batch_rows`` rows per DELETE (``prune_runs``, ``prune_skips``,
``prune_jobs`` in queries.sql): ``DELETE … WHERE key IN (SELECT key … AFTER
keyset … LIMIT n) RETURNING key``; the next batch continues after the
largest key returned, so every row is read once per pass and no statement is
unbounded. Each batch is its own transaction, retried whole on 40001/40P01
(deleting twice is harmless). The form uses no ``ctid`` and no
data-modifying CTE, so it runs on CockroachDB too.

``scheduler runs prune --older-than 7d`` runs a whole pass over all 1,024
partitions (:func:`prune`). A node with ``retention_s`` set runs
:class:`RetentionLoop` on its own thread and connection over the partitions
it holds leases for (no coordination needed: every partition has one
holder), at most one batch per ``retention_batch_interval_s``, so pruning
never competes with firing for more than a sliver of the store.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.errors import SchedulerError, ValidationError
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import MAX_RETENTION_S, Settings

PARTITIONS_PER_STATEMENT = 64
"""Partitions one retention statement walks: bounds the rows one statement may
scan to about 1/16 of a table when little is old."""

PASS_INTERVAL_S = 60.0
"""A node starts a new retention pass this long after the previous one ended."""

STATEMENT_TIMEOUT_S = 30.0
"""statement_timeout of the retention session. Above the node's usual 40 % of
the TTL on purpose: retention never locks ``partitions`` rows, so it cannot
hold up a takeover, and a scan of 64 partitions of a large table may take a while."""

TABLES = (("runs", "prune_runs"), ("skips", "prune_skips"), ("jobs", "prune_jobs"))
"""Pruned in this order: a deleted job's runs and skips go before the job."""

_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def duration_seconds(text: str) -> float | None:
    """Seconds in ``text`` (``7d``, ``12h``, ``30m``, ``45s``, ``1d12h`` or plain seconds,
    any sign or size), or ``None`` if it is not such a duration. Range checks are the caller's."""
    value = str(text).strip().lower()
    try:
        return float(value)
    except ValueError:
        if value and _DURATION.sub("", value) == "":
            return sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(value))
    return None


def parse_duration(text: str, field: str = "older_than") -> float:
    """Seconds in ``text``: ``7d``, ``12h``, ``30m``, ``45s``, ``1d12h`` or plain seconds (``3600``).

    Raises :class:`ValidationError` (naming ``field``) unless the result is a
    number of seconds > 0 and at most :data:`MAX_RETENTION_S` (100 years).
    """
    seconds = duration_seconds(text)
    if seconds is None or not 0 < seconds < float("inf"):
        raise ValidationError(field, "must be a duration > 0 such as 7d, 12h, 30m, 45s or seconds", text)
    if seconds > MAX_RETENTION_S:
        raise ValidationError(field, f"must be at most {MAX_RETENTION_S // 86_400}d (100 years)", text)
    return seconds


@dataclasses.dataclass
class PruneReport:
    """Rows deleted per table, DELETE statements run, and the cutoff used (store time)."""

    runs: int = 0
    skips: int = 0
    jobs: int = 0
    batches: int = 0
    cutoff: datetime | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class PruneWalk:
    """One retention pass as a sequence of bounded batches (:meth:`step`).

    ``partition_ids`` are walked in ascending order, table by table
    (:data:`TABLES`), :data:`PARTITIONS_PER_STATEMENT` at a time, resuming
    after the last deleted key. :attr:`done` once every table is walked.
    """

    def __init__(self, partition_ids: Iterable[int], cutoff: datetime, batch_rows: int) -> None:
        pids = sorted(set(partition_ids))
        self._chunks = [pids[i : i + PARTITIONS_PER_STATEMENT] for i in range(0, len(pids), PARTITIONS_PER_STATEMENT)]
        self._cutoff = cutoff
        self._batch_rows = batch_rows
        self._table = 0
        self._chunk = 0
        self._after: tuple = (None, None, None)
        self.report = PruneReport(cutoff=cutoff)

    @property
    def done(self) -> bool:
        return self._table >= len(TABLES) or not self._chunks

    def step(self, conn: psycopg.Connection, on_retry: Callable[[str], None] | None = None) -> tuple[str, int]:
        """Run one DELETE batch; return ``(table, rows deleted)``. Raises store errors."""
        if self.done:
            return "", 0
        table, query = TABLES[self._table]
        params = {
            "partition_ids": self._chunks[self._chunk],
            "cutoff": self._cutoff,
            "limit": self._batch_rows,
            "after_pid": self._after[0],
            "after_job": self._after[1],
            "after_time": self._after[2],
        }

        def body(c: psycopg.Connection) -> list[dict]:
            rows = store.execute(c, query, params)
            if table == "jobs" and rows:  # a pruned job's delivery settings go with it
                keys = {"pids": [r["partition_id"] for r in rows], "jids": [r["job_id"] for r in rows]}
                store.execute(c, "delete_job_deliveries_by_keys", keys)
            return rows

        rows = store.run_transaction(conn, body, on_retry=on_retry)
        deleted = len(rows)
        setattr(self.report, table, getattr(self.report, table) + deleted)
        self.report.batches += 1
        if deleted < self._batch_rows:  # this chunk of this table is done
            self._after = (None, None, None)
            self._chunk += 1
            if self._chunk >= len(self._chunks):
                self._chunk = 0
                self._table += 1
        else:
            last = max(rows, key=lambda r: (r["partition_id"], r["job_id"], r["key_time"] or datetime.min))
            self._after = (last["partition_id"], last["job_id"], last["key_time"])
        return table, deleted


def cutoff_for(conn: psycopg.Connection, older_than_s: float, now: datetime | None = None) -> datetime:
    """``store now − older_than_s`` on the store's clock (``now``: its pin, None in production)."""
    return store.now(conn, now) - timedelta(seconds=older_than_s)


def prune(
    conn: psycopg.Connection,
    older_than_s: float,
    *,
    partition_ids: Iterable[int] | None = None,
    batch_rows: int = 1000,
    on_retry: Callable[[str], None] | None = None,
    now: datetime | None = None,
) -> PruneReport:
    """Delete runs, skips and soft-deleted jobs older than ``older_than_s`` seconds (one pass).

    ``partition_ids`` defaults to all 1,024; ``now`` pins the store's clock
    the cutoff is counted from (tests; None: the store's ``now()``). Raises
    ValidationError for a non-positive age or batch size, StoreError /
    ``psycopg.Error`` if the store fails (batches already committed stay
    deleted; re-running resumes).
    """
    if not 0 < older_than_s < float("inf"):
        raise ValidationError("older_than", "must be a duration > 0", older_than_s)
    if not (isinstance(batch_rows, int) and batch_rows >= 1):
        raise ValidationError("batch_rows", "must be a whole number >= 1", batch_rows)
    walk = PruneWalk(
        range(PARTITION_COUNT) if partition_ids is None else partition_ids,
        cutoff_for(conn, older_than_s, now),
        batch_rows,
    )
    while not walk.done:
        walk.step(conn, on_retry)
    return walk.report


class RetentionLoop:
    """A node's retention thread: :class:`PruneWalk` passes over the partitions it holds.

    Lifecycle (CONTRIBUTING.md rule 6): :meth:`run_once` runs at most one batch
    (tests call it); :meth:`run` calls it every ``retention_batch_interval_s``
    until ``stop`` is set; :meth:`close` frees the connection. Store failures
    are counted and logged, never raised: the walk resumes on the next call.
    """

    def __init__(self, settings: Settings, held: Callable[[], Iterable[int]], clock: Clock, metrics: Metrics) -> None:
        if settings.retention_s is None:
            raise ValueError("RetentionLoop needs settings.retention_s")
        self._s = settings
        self._held = held
        self._clock = clock
        self._metrics = metrics
        self._session = store.StoreSession(
            settings, clock=clock, role="retention", statement_timeout_s=STATEMENT_TIMEOUT_S
        )
        self._walk: PruneWalk | None = None
        self._next_pass = 0.0
        self.passes = 0
        """Completed passes (for tests and logs)."""

    def _connection(self) -> psycopg.Connection:
        return self._session.connection()

    def run_once(self) -> int:
        """Start a pass if one is due, then run one batch; return the rows it deleted."""
        now = self._clock.monotonic()
        try:
            if self._walk is None:
                if now < self._next_pass:
                    return 0
                held = list(self._held())
                if not held:
                    return 0
                conn = self._connection()
                self._walk = PruneWalk(
                    held,
                    cutoff_for(conn, self._s.retention_s, self._clock.store_now_or_none()),
                    self._s.retention_batch_rows,
                )
            started = self._clock.monotonic()
            table, deleted = self._walk.step(self._connection(), self._metrics.retry)
            self._metrics.retention_batch_duration.observe(self._clock.monotonic() - started)
            if deleted:
                self._metrics.retention_pruned.labels(table=table).inc(deleted)
            if self._walk.done:
                report = self._walk.report
                self.passes += 1
                self._walk = None
                self._next_pass = self._clock.monotonic() + PASS_INTERVAL_S
                log.event(
                    "retention_pass_done",
                    node=self._s.node_id,
                    runs=report.runs,
                    skips=report.skips,
                    jobs=report.jobs,
                    batches=report.batches,
                    cutoff=report.cutoff,
                )
            return deleted
        except (psycopg.Error, SchedulerError, OSError) as exc:
            self._metrics.error(getattr(exc, "sqlstate", None))
            log.event(
                "retention_failed",
                logging.WARNING,
                node=self._s.node_id,
                error=(str(exc).splitlines() or [type(exc).__name__])[0],
            )
            self.close()
            return 0
        except Exception as exc:  # a bug must not end the loop silently: log it loudly, go on
            log.event(
                "retention_crashed",
                logging.ERROR,
                exc_info=True,
                node=self._s.node_id,
                error=f"{type(exc).__name__}: {exc}",
            )
            self._walk = None
            self._next_pass = now + PASS_INTERVAL_S
            self.close()
            return 0

    def run(self, stop: threading.Event) -> None:
        """Run one batch per ``retention_batch_interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            self.run_once()
            self._clock.wait(stop, self._s.retention_batch_interval_s)

    def close(self) -> None:
        """Close the retention connection."""
        self._session.close()
