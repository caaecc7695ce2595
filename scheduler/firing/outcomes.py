"""What a tick counts: committed chunks (:class:`Outcomes`) and the rate caps' tokens (:class:`RateCaps`)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from scheduler import log, store
from scheduler.coordination.rewind import RunMarks
from scheduler.coordination.table import LeaseTable
from scheduler.fairness import TokenBucket, node_share_of_cap
from scheduler.firing.state import TickResult
from scheduler.metrics import Metrics


class Outcomes:
    """Counts the chunks of a firer's ticks once committed (into the tick's
    :class:`TickResult` and the metrics), drops the leases the fence rejected,
    and hands each committed chunk's last runs to ``marks`` (the rewind check,
    :class:`~scheduler.coordination.rewind.RunMarks`), if given."""

    def __init__(self, node_id: str, table: LeaseTable, metrics: Metrics, marks: RunMarks | None = None) -> None:
        self._node_id = node_id
        self._table = table
        self._metrics = metrics
        self._marks = marks

    def collect(self, pipeline: store.Pipeline, result: TickResult) -> list[store.Sent]:
        """Count the chunks whose COMMIT succeeded (:meth:`scheduler.store.Pipeline.collect`); return the others."""
        committed, failed = pipeline.collect()
        for item, row in committed:
            self.account(item, row, result)
        return failed

    def account(self, item: store.Sent, row: store.Row, result: TickResult) -> None:
        """Count one committed chunk (``row``: its statement's counts); drop leases the fence rejected.

        ``item.batch`` is the per-timer chunk's :class:`~scheduler.firing.batch.Batch`,
        None for a herd's ``fire_group`` chunk.
        """
        if self._marks is not None:
            self._marks.committed(row)
        fenced = set(row["fenced"])
        rejected = sorted(item.partitions - fenced)
        if rejected:
            self._table.drop(rejected)
            result.fence_rejected.extend(rejected)
            self._metrics.fence_rejections.inc(len(rejected))
            self._metrics.lease_events.labels(kind="lost").inc(len(rejected))
            log.event(
                "fence_rejected", logging.WARNING, node=self._node_id, partitions=len(rejected), sample=rejected[:8]
            )
        if item.batch is not None:
            stale = sum(1 for pid in item.batch.pids if pid in fenced) - row["advanced"]
            if stale > 0:
                result.stale_jobs += stale
                self._metrics.stale_jobs.inc(stale)
        else:
            result.herd_fired += row["inserted"]
            self._metrics.herd_runs_fired.inc(row["inserted"])
        result.skipped_ranges += row["skipped"]  # misfire and overlap skips (herds: overlap only)
        self._metrics.slots_skipped.inc(row["skipped"])
        lags = row["lags_s"] if item.batch is not None else [row["lag_s"]] * row["inserted"]
        result.fired += row["inserted"]
        result.lags_s.extend(lags)
        self._metrics.runs_fired.inc(row["inserted"])
        self._metrics.dispatch_lag.observe_many(lags)


class RateCaps:
    """The token buckets of a firer's rate-capped tenants (see scheduler/fairness.py)."""

    MAX_LIMIT = 2**31 - 1
    """A tick's limit of one tenant saturates here (runs): a cap so large that its bucket
    holds more limits nothing, and whatever ``tenants.max_rate`` holds (the API and CLI
    refuse caps above :data:`scheduler.jobs.MAX_TENANT_RATE`; an older or hand-written row
    may not), a tick's limit is an ordinary integer, never ``int(inf)``."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def limits(
        self, tenants: dict[str, dict[str, Any]], owned: int, now_s: float, tick_interval_s: float
    ) -> dict[str, int] | None:
        """This tick's run limits of rate-capped tenants (``tenants``: ``tenant_weights``
        rows by tenant; ``owned``: partitions this node holds; ``now_s``: monotonic
        seconds), None if no tenant is capped."""
        limits: dict[str, int] = {}
        for tenant, row in tenants.items():
            if row["max_rate"] is None:
                self._buckets.pop(tenant, None)
                continue
            rate = node_share_of_cap(row["max_rate"], owned)
            burst = max(1.0, rate * tick_interval_s)
            bucket = self._buckets.get(tenant)
            if bucket is None or bucket.rate_per_s != rate:
                bucket = self._buckets[tenant] = TokenBucket(
                    rate, burst, burst if bucket is None else min(burst, bucket.tokens), now_s
                )
            limits[tenant] = int(min(bucket.refill(now_s), self.MAX_LIMIT))
        return limits or None

    def charge(self, used: Counter[str]) -> None:
        """Take the runs each capped tenant used this tick from its bucket."""
        for tenant, bucket in self._buckets.items():
            bucket.tokens -= used.get(tenant, 0)
