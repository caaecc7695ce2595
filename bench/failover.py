"""Failover timing: jobs firing every second, one node killed (or stopped), measured.

For each trial: ``nodes`` node processes share ``jobs`` interval-1 s jobs;
after a steady phase the victim (``bench-0``) is killed with SIGKILL
(``crash``) or stopped with SIGTERM (``graceful``). Reported over all trials,
for the jobs in the partitions the victim owned (the *affected* jobs):

* lateness p50/p99/max of their runs around the failure (fired_at − scheduled);
* ``reown_s``: from the kill to every partition being owned by a live node;
* missing / duplicate runs from ``verify`` over the whole trial window;
* ``coordination_writes_per_s``: row writes to ``partitions`` and ``nodes``
  per second during the trial (pg_stat_user_tables), the cost of the
  coordinator in the store.
"""

from __future__ import annotations

import dataclasses
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

from bench.load import NodeProcess, copy_jobs, ensure_tenants, reset_store, wait_until
from scheduler import store
from scheduler.audit import verify
from scheduler.partition import partition_of

STEADY_S = 6.0
AFTER_S = 6.0


@dataclasses.dataclass
class FailoverResult:
    kind: str
    trials: int
    nodes: int
    jobs: int
    affected_runs: int
    lateness_p50_s: float | None
    lateness_p99_s: float | None
    lateness_max_s: float | None
    reown_s: float
    missing: int
    duplicates: int
    coordination_writes_per_s: float


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_failover(dsn: str, kind: str, nodes: int, jobs: int, trials: int, out_dir: Path,
                 node_args: tuple[str, ...] = (), coordinator_args=None) -> FailoverResult:
    """Run ``trials`` failures of ``kind`` (``crash`` or ``graceful``); see the module doc.

    ``coordinator_args(i)`` may return extra ``scheduler node`` arguments for
    node ``i`` (e.g. ``--coordinator etcd --etcd-endpoints ...``).
    """
    lateness: list[float] = []
    reowns: list[float] = []
    missing = duplicates = 0
    writes = seconds = 0.0
    for trial in range(trials):
        conn = reset_store(dsn)
        ensure_tenants(conn, ["failover"])
        now = store.execute(conn, "store_now")[0]["store_now"]
        anchor = now.replace(microsecond=0) + timedelta(seconds=1)

        def rows():
            for _ in range(jobs):
                job_id = uuid.uuid4()
                yield (partition_of(job_id), job_id, "failover", "interval", None, None, None, 1,
                       anchor, "all", anchor, anchor, now, now)

        copy_jobs(conn, rows())
        log_dir = out_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        procs = []
        for i in range(nodes):
            extra = [*node_args, *(coordinator_args(i) if coordinator_args else ())]
            procs.append(NodeProcess(dsn, f"bench-{i}", log_dir, extra))
        try:
            wait_until(lambda: store.execute(conn, "count_owned_partitions")[0]["owned"] == 1024,
                       60, what="nodes to own all 1,024 partitions")
            started = store.execute(conn, "store_now")[0]["store_now"]
            w0 = store.execute(conn, "coordination_writes")[0]["writes"]
            time.sleep(STEADY_S)
            victim = procs[0]
            owned = [r["partition_id"] for r in store.execute(conn, "partitions_of_node",
                                                                {"node_id": victim.node_id})]
            killed_at = store.execute(conn, "store_now")[0]["store_now"]
            victim.signal(signal.SIGKILL if kind == "crash" else signal.SIGTERM)
            t_kill = time.monotonic()
            wait_until(lambda: store.execute(conn, "count_orphans_among", {
                "partition_ids": owned, "node_id": victim.node_id})[0]["orphans"] == 0,
                60, interval_s=0.05, what="the victim's partitions to be owned again")
            reowns.append(time.monotonic() - t_kill)
            time.sleep(AFTER_S)
            ended = store.execute(conn, "store_now")[0]["store_now"]
            w1 = store.execute(conn, "coordination_writes")[0]["writes"]
        finally:
            for proc in procs:
                proc.stop()
        writes += w1 - w0
        seconds += (ended - started).total_seconds()
        window = (killed_at - timedelta(seconds=1), ended - timedelta(seconds=2))
        rows_ = store.execute(conn, "lateness_in_partitions", {
            "partition_ids": owned, "since": window[0], "until": window[1]})
        lateness += [r["lateness_s"] for r in rows_]
        audit = verify(conn, (started + timedelta(seconds=1)).replace(microsecond=0),
                       (ended - timedelta(seconds=2)).replace(microsecond=0))
        missing += audit.missing
        duplicates += audit.duplicates
        conn.close()
    return FailoverResult(
        kind=kind, trials=trials, nodes=nodes, jobs=jobs, affected_runs=len(lateness),
        lateness_p50_s=_percentile(lateness, 0.5), lateness_p99_s=_percentile(lateness, 0.99),
        lateness_max_s=max(lateness) if lateness else None,
        reown_s=max(reowns) if reowns else float("nan"), missing=missing, duplicates=duplicates,
        coordination_writes_per_s=writes / seconds if seconds else 0.0)
