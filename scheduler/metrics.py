"""Node metrics: an object with its own registry (CONTRIBUTING.md rule 8).

Names follow ``scheduler_<subsystem>_<name>_<unit|total>``. Labels are
bounded: SQLSTATE *class* (two characters), lease event kind, never a raw
job id, and a tenant only in the queue-depth gauge, whose label set is the
20 deepest tenants plus ``other`` (scheduler/delivery/views.py). Tests read
the registry (``Metrics.value``) as an oracle.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

LAG_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 13.0, 20.0, 30.0, 60.0, 300.0)
"""Dispatch-lag buckets (seconds): around the 2 s p99 target and the 10–13 s failover bound."""

TICK_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)

LEASE_EVENT_KINDS = ("claimed", "renewed", "released", "lost")
"""Values of the ``kind`` label of ``scheduler_lease_events_total``."""

PUSH_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Push attempt latency buckets (seconds): a local receiver's milliseconds up to long per-attempt timeouts."""

PUSH_OUTCOMES = ("succeeded", "retry", "failed")
"""Values of the ``outcome`` label of the push metrics: acked (2xx), nacked retryable
(408, 429, 5xx, timeout, connection error), nacked not retryable (other 4xx, 3xx, SSRF refused)."""

STORE_ERROR_CLASSES = ("conn", "08", "40", "57")
"""SQLSTATE classes pre-registered at 0: connection lost (no SQLSTATE), connection
exception, transaction rollback (serialization/deadlock, retries exhausted),
operator intervention (statement timeout, admin shutdown). Others appear when seen."""


class BulkHistogram:
    """A histogram that takes a whole batch of observations at once.

    prometheus-client's ``Histogram.observe`` costs ~3 µs a call; a herd tick
    commits 100,000 runs, so the firing loop records their lags in one call
    (:meth:`observe_many`, a bisect per value). Exposed through the public
    custom-collector API as a regular histogram family.
    """

    def __init__(self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry) -> None:
        self._name = name
        self._doc = documentation
        self._bounds = sorted(buckets)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        """Record every value (seconds)."""
        counts = [0] * len(self._counts)
        total = 0.0
        for value in values:
            counts[bisect.bisect_left(self._bounds, value)] += 1
            total += value
        with self._lock:
            for i, n in enumerate(counts):
                self._counts[i] += n
            self._sum += total

    def collect(self):
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, acc = [], 0
        for bound, n in zip([*map(str, self._bounds), "+Inf"], counts, strict=False):
            acc += n
            cumulative.append((bound, acc))
        yield HistogramMetricFamily(self._name, self._doc, buckets=cumulative, sum_value=total)

    def describe(self):
        return []


class _LabelSnapshot:
    """A gauge family whose whole set of series is replaced at once (:meth:`replace`),
    so a label value that left the set (a tenant no longer among the deepest)
    stops being exposed instead of keeping a stale value."""

    def __init__(self, name: str, documentation: str, label: str, registry: CollectorRegistry) -> None:
        self._name, self._doc, self._label = name, documentation, label
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def replace(self, values: dict[str, float]) -> None:
        with self._lock:
            self._values = dict(values)

    def collect(self):
        with self._lock:
            values = dict(self._values)
        family = GaugeMetricFamily(self._name, self._doc, labels=[self._label])
        for label, value in values.items():
            family.add_metric([label], value)
        yield family

    def describe(self):
        return []


class Metrics:
    """All metrics of one node process, registered in ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.runs_fired = Counter("scheduler_firing_runs_fired_total", "Runs committed by this node.", registry=r)
        self.herd_runs_fired = Counter(
            "scheduler_firing_herd_runs_fired_total",
            "Of the runs committed by this node, those fired as part of a herd (fire_group).",
            registry=r,
        )
        self.slots_skipped = Counter(
            "scheduler_firing_slots_skipped_total",
            "Misfire and overlap decisions recorded as skipped (one per skip range).",
            registry=r,
        )
        self.dispatch_lag = BulkHistogram(
            "scheduler_firing_dispatch_lag_seconds",
            "fired_at minus scheduled time (nominal + jitter) of committed runs, store clock.",
            LAG_BUCKETS_S,
            r,
        )
        self.due_backlog = Gauge(
            "scheduler_firing_due_backlog_runs",
            "Due runs left for the next tick after this tick's budget (lower bound).",
            registry=r,
        )
        self.tick_duration = Histogram(
            "scheduler_firing_tick_duration_seconds",
            "Wall time of one firing tick.",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.fence_rejections = Counter(
            "scheduler_firing_fence_rejections_total",
            "Partitions a firing statement found no longer ours (stale epoch): nothing committed for them.",
            registry=r,
        )
        self.stale_jobs = Counter(
            "scheduler_firing_stale_jobs_total",
            "Due jobs not advanced because they were edited between read and fire.",
            registry=r,
        )
        self.slots_replanned = Counter(
            "scheduler_firing_slots_replanned_total",
            "Due cron jobs whose stored slot was no slot under this node's tzdata, moved to their "
            "true slot (scheduler/tzreplan.py).",
            registry=r,
        )
        self.partitions_owned = Gauge(
            "scheduler_lease_partitions_owned", "Partitions whose lease this node holds.", registry=r
        )
        self.lease_events = Counter(
            "scheduler_lease_events_total",
            "Lease events by kind: claimed, renewed, released, lost.",
            ["kind"],
            registry=r,
        )
        self.live_nodes = Gauge("scheduler_membership_live_nodes", "Nodes with a fresh heartbeat.", registry=r)
        self.store_rewinds = Counter(
            "scheduler_store_rewind_detected_total",
            "Partitions whose store state this node found older than what it had committed there "
            "(the store went back in time: asynchronous failover, restored backup).",
            registry=r,
        )
        self._rewound: dict[int, tuple[str, float]] = {}  # partition -> (watch, monotonic s) last counted
        self._rewound_lock = threading.Lock()
        self.store_retries = Counter(
            "scheduler_store_retries_total",
            "Transactions retried, by SQLSTATE class (40 = serialization/deadlock).",
            ["sqlstate_class"],
            registry=r,
        )
        self.store_errors = Counter(
            "scheduler_store_errors_total",
            "Store operations that failed, by SQLSTATE class ('conn' = connection lost).",
            ["sqlstate_class"],
            registry=r,
        )
        self.heartbeat_age = Gauge(
            "scheduler_membership_heartbeat_age_seconds",
            "Seconds since the lease loop's last successful heartbeat (node monotonic clock); "
            "-1 before the first. Above the lease TTL the node is not ready.",
            registry=r,
        )
        self.heartbeat_age.set(-1)
        self.retention_pruned = Counter(
            "scheduler_retention_pruned_rows_total",
            "Rows deleted by the retention loop, by table (runs, skips, jobs).",
            ["table"],
            registry=r,
        )
        self.retention_batch_duration = Histogram(
            "scheduler_retention_batch_duration_seconds",
            "Wall time of one retention DELETE batch.",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.push_latency = Histogram(
            "scheduler_push_latency_seconds",
            "Wall time of one push attempt (request sent until response or failure), by outcome.",
            ["outcome"],
            buckets=PUSH_BUCKETS_S,
            registry=r,
        )
        self.push_attempts = Counter(
            "scheduler_push_attempts_total",
            "Push attempts finished by this node, by outcome (succeeded, retry, failed).",
            ["outcome"],
            registry=r,
        )
        self.delivery_settled = Counter(
            "scheduler_delivery_settled_total",
            "Runs the partition owner's settle step moved (docs/delivery.md): to pending (a retry after a "
            "backoff) or dead, by cause (expired: lease expired; failed: a nack or push failure).",
            ["to", "cause"],
            registry=r,
        )
        self.delivery_settle_duration = Histogram(
            "scheduler_delivery_settle_duration_seconds",
            "Wall time of one settle statement.",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.runs_in_flight = Gauge(
            "scheduler_delivery_runs_in_flight",
            "Runs in flight in the whole store, by state: leased (an attempt runs) or failed (awaiting "
            "its owner's settle step); refreshed every 10 s.",
            ["state"],
            registry=r,
        )
        self.queue_depth = _LabelSnapshot(
            "scheduler_delivery_queue_depth_runs",
            "Pending runs in the whole store per tenant: the 20 deepest tenants, the rest summed as "
            "tenant='other'; refreshed every 10 s.",
            "tenant",
            r,
        )
        # Bounded label sets, exposed at 0 from the start so dashboards and
        # alerts see every series before its first event.
        for kind in LEASE_EVENT_KINDS:
            self.lease_events.labels(kind=kind)
        for sqlstate_class in ("40",):
            self.store_retries.labels(sqlstate_class=sqlstate_class)
        for sqlstate_class in STORE_ERROR_CLASSES:
            self.store_errors.labels(sqlstate_class=sqlstate_class)
        for table in ("runs", "skips", "jobs"):
            self.retention_pruned.labels(table=table)
        for outcome in PUSH_OUTCOMES:
            self.push_attempts.labels(outcome=outcome)
            self.push_latency.labels(outcome=outcome)
        for to in ("pending", "dead"):
            for cause in ("expired", "failed"):
                self.delivery_settled.labels(to=to, cause=cause)
        for state in ("leased", "failed"):
            self.runs_in_flight.labels(state=state)

    def set_queue_depths(self, depths: dict[str, int]) -> None:
        """Replace the queue-depth gauge's series by ``depths`` (label value → runs);
        a tenant absent from ``depths`` disappears from the exposition."""
        self.queue_depth.replace(depths)

    def count_rewound(self, partitions: Iterable[int], watch: str, now_s: float, window_s: float) -> list[int]:
        """Count in ``scheduler_store_rewind_detected_total`` the ``partitions`` (ids) the
        rewind watch ``watch`` found rewound at monotonic ``now_s`` (seconds), except those
        a *different* watch counted within the last ``window_s`` seconds (one rewind seen
        two ways counts once; scheduler/coordination/rewind.py). Returns the partitions
        counted, in the order given. Thread-safe (the lease loop and the firer both count)."""
        counted = []
        with self._rewound_lock:
            for pid in partitions:
                last = self._rewound.get(pid)
                if last is not None and last[0] != watch and now_s - last[1] < window_s:
                    continue
                self._rewound[pid] = (watch, now_s)
                counted.append(pid)
        if counted:
            self.store_rewinds.inc(len(counted))
        return counted

    def retry(self, sqlstate: str) -> None:
        """Count one transaction retry for ``sqlstate``."""
        self.store_retries.labels(sqlstate_class=(sqlstate or "??")[:2]).inc()

    def error(self, sqlstate: str | None) -> None:
        """Count one failed store operation (``None`` sqlstate = connection level)."""
        self.store_errors.labels(sqlstate_class=sqlstate[:2] if sqlstate else "conn").inc()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Return a sample's current value (0.0 if absent); for tests and status."""
        result = self.registry.get_sample_value(name, labels or {})
        return 0.0 if result is None else result


WORKER_OUTCOMES = ("succeeded", "failed", "lost", "canceled")
"""Values of the ``outcome`` label of ``scheduler_worker_attempts_total``."""

WORKER_STORE_OPERATIONS = ("claim", "heartbeat", "ack")
"""Values of the ``operation`` label of ``scheduler_worker_store_errors_total``."""


class WorkerMetrics:
    """All metrics of one pull worker process (:mod:`scheduler.delivery.worker`), in ``self.registry``.

    Served by ``scheduler worker --metrics-port``. Labels are bounded (the
    outcome and operation names above), pre-registered at 0.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.dispatch_lag = BulkHistogram(
            "scheduler_worker_dispatch_lag_seconds",
            "First attempts claimed by this worker: claimed (store clock) minus scheduled time.",
            LAG_BUCKETS_S,
            r,
        )
        self.claimed = Counter("scheduler_worker_claimed_runs_total", "Attempts claimed by this worker.", registry=r)
        self.attempts = Counter(
            "scheduler_worker_attempts_total",
            "Attempts this worker finished, by outcome: succeeded (ack committed), failed (nack "
            "committed), lost (lease lost or expired, or ack/nack refused), canceled (the run was canceled).",
            ["outcome"],
            registry=r,
        )
        self.inflight = Gauge(
            "scheduler_worker_inflight_runs",
            "Attempts held by this worker: handler running or ack/nack not yet committed.",
            registry=r,
        )
        self.store_errors = Counter(
            "scheduler_worker_store_errors_total",
            "Store calls of this worker that failed (then retried), by operation.",
            ["operation"],
            registry=r,
        )
        for outcome in WORKER_OUTCOMES:
            self.attempts.labels(outcome=outcome)
        for operation in WORKER_STORE_OPERATIONS:
            self.store_errors.labels(operation=operation)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Return a sample's current value (0.0 if absent); for tests."""
        result = self.registry.get_sample_value(name, labels or {})
        return 0.0 if result is None else result
