"""Failover timing: jobs firing every second, one node killed (or stopped), measured.

For each trial: ``nodes`` node processes share ``jobs`` interval-1 s jobs;
after a steady phase the victim (``bench-0``) is killed with SIGKILL
(``crash``) or stopped with SIGTERM (``graceful``). Reported over all trials,
for the jobs in the partitions the victim owned (the *affected* jobs):

* lateness p50/p99/max of their runs around the failure (fired_at − scheduled);
* ``reown_s``: from the kill to every partition being owned by a live node;
* missing / duplicate runs from ``verify`` over the whole trial window;
* ``coordination_writes_per_s``: row writes to ``partitions``, ``leases`` and
  ``nodes`` per second during the trial (pg_stat_user_tables), the cost of the
  coordinator in the store;
* ``detect_s`` (crash): from the victim's lease expiring to the last of its
  partitions claimed, worst trial: SQL, the partitions' stored lease
  expiry (``leases.lease_expires_at``) to the new ``acquired_at`` (the membership poll is
  in this gap); etcd, the victim's keys vanishing from etcd (its lease
  expired: etcd checks twice a second) to the new ``acquired_at`` (the
  watch is in this gap). The rest of a crash's lateness is the TTL since
  the victim's last renewal, the same for both;
* ``store_transactions_per_s``: every transaction the store ran per second
  (firing, leases, the bench's own probes): the same firing load under each
  setting, so differences are the coordinator's (e.g. its poll interval);
* ``etcd_requests_per_s`` (etcd coordinator): gRPC messages etcd received per
  second during the trial (its ``/metrics``: unary calls, keep-alives,
  watch requests), the cost of the coordinator in etcd.

:func:`run_comparison` runs both kinds under each coordinator (``sql``,
``etcd``): with ``etcd`` and no endpoints it starts a throwaway etcd. Each
etcd trial uses its own key prefix, and first raises etcd's revision above
the store's largest ``owner_epoch`` (the epochs the SQL coordinator left
behind), as an operator switching coordinators would (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import signal
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

from bench import queries
from bench.load import (
    copy_jobs,
    ensure_tenants,
    interval_spec,
    job_row,
    register_specs,
    reset_store,
    start_node,
    wait_until,
)
from scheduler import store
from scheduler.audit import verify
from scheduler.coordination import fair_share
from scheduler.coordination.etcd_gateway import raise_revision, range_prefix
from scheduler.devtools.etcd_server import ThrowawayEtcd, scrape_requests
from scheduler.partition import PARTITION_COUNT

STEADY_S = 6.0
AFTER_S = 6.0
STATS_SETTLE_S = 11.0
"""PostgreSQL flushes an idle session's table statistics only every 10 s: wait
that long after the last burst of claims before reading ``coordination_writes``."""
START_STAGGER_S = 1.0
"""Nodes start this far apart at random, as real fleets do: otherwise every
node's renew and poll timers share one phase, and a survivor's poll happens
to land right after the victim's lease expires."""


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
    detect_s: float | None
    missing: int
    duplicates: int
    coordination_writes_per_s: float
    store_transactions_per_s: float = 0.0
    etcd_requests_per_s: float | None = None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _balanced(conn, nodes: int) -> bool:
    rows = store.execute(conn, "partition_status", {"now": None})
    counts = Counter(row["owner_node"] for row in rows if row["owner_node"] is not None)
    return (
        len(counts) == nodes and sum(counts.values()) == PARTITION_COUNT and max(counts.values()) <= fair_share(nodes)
    )


def _etcd_requests(endpoint: str) -> float:
    return sum(scrape_requests(endpoint).values())


def _prepare(dsn: str, jobs: int, etcd_endpoint: str | None) -> tuple:
    """Reset the store and load ``jobs`` 1 s interval jobs; return the connection
    and the extra ``scheduler node`` flags for the coordinator (etcd: its
    revision raised above every stored epoch, a fresh key prefix)."""
    conn = reset_store(dsn)
    ensure_tenants(conn, ["failover"])
    flags: list[str] = []
    if etcd_endpoint is not None:
        top = conn.execute("SELECT coalesce(max(owner_epoch), 0) AS top FROM partitions").fetchone()["top"]
        raise_revision(etcd_endpoint, above=top)
        flags = [
            "--coordinator",
            "etcd",
            "--etcd-endpoints",
            etcd_endpoint,
            "--etcd-prefix",
            f"/bench/{uuid.uuid4().hex[:12]}/",
        ]
    now = store.now(conn)
    anchor = now.replace(microsecond=0) + timedelta(seconds=1)
    (values,) = register_specs(conn, [interval_spec(1, anchor)])
    copy_jobs(conn, (job_row("failover", values, anchor, now) for _ in range(jobs)))
    return conn, flags


def run_failover(
    dsn: str,
    kind: str,
    nodes: int,
    jobs: int,
    trials: int,
    out_dir: Path,
    node_args: tuple[str, ...] = (),
    coordinator_args=None,
    etcd_endpoint: str | None = None,
) -> FailoverResult:
    """Run ``trials`` failures of ``kind`` (``crash`` or ``graceful``); see the module doc.

    ``coordinator_args(i)`` may return extra ``scheduler node`` arguments for
    node ``i``. With ``etcd_endpoint`` the nodes run the etcd coordinator
    there (a fresh key prefix per trial) and etcd's request rate is measured.
    """
    lateness: list[float] = []
    reowns: list[float] = []
    detects: list[float] = []
    missing = duplicates = 0
    writes = seconds = xacts = 0.0
    etcd_requests = 0.0
    for trial in range(trials):
        own_queries = own_etcd = 0
        conn, etcd_flags = _prepare(dsn, jobs, etcd_endpoint)
        log_dir = out_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        procs = []
        stagger = random.Random(trial)
        for i in range(nodes):
            extra = [*node_args, *etcd_flags, *(coordinator_args(i) if coordinator_args else ())]
            procs.append(start_node(dsn, f"bench-{i}", log_dir, extra))
            time.sleep(stagger.uniform(0.0, START_STAGGER_S))
        try:
            wait_until(
                lambda: queries.execute(conn, "count_owned_partitions")[0]["owned"] == 1024,
                60,
                what="nodes to own all 1,024 partitions",
            )
            # ... each within its share (the start-up rebalancing is not part of the measure).
            wait_until(lambda: _balanced(conn, nodes), 60, what="every node to hold its fair share")
            time.sleep(STATS_SETTLE_S)
            started = store.now(conn)
            w0 = queries.execute(conn, "coordination_writes")[0]["writes"]
            x0 = queries.execute(conn, "store_transactions")[0]["xacts"]
            e0 = _etcd_requests(etcd_endpoint) if etcd_endpoint else 0.0
            time.sleep(STEADY_S)
            victim = procs[0]
            owned = [
                r["partition_id"] for r in queries.execute(conn, "partitions_of_node", {"node_id": victim.node_id})
            ]
            killed_at = store.now(conn)
            victim.signal(signal.SIGKILL if kind == "crash" else signal.SIGTERM)
            t_kill = time.monotonic()
            old_expiry = None
            if kind == "crash":
                time.sleep(0.2)  # a renewal the victim had already sent lands first
                old_expiry = max(
                    r["lease_expires_at"] for r in queries.execute(conn, "partition_claims", {"partition_ids": owned})
                )  # final: the victim is dead
            gone: list = []  # store time the victim's keys were seen gone from etcd

            def reowned() -> bool:
                nonlocal own_queries, own_etcd
                if etcd_endpoint is not None and not gone:
                    own_etcd += 1
                    _, kvs = range_prefix(etcd_endpoint, etcd_flags[-1] + "partitions/")
                    if not any(kv["value"] == victim.node_id for kv in kvs):
                        own_queries += 1
                        gone.append(store.now(conn))
                own_queries += 1
                return (
                    queries.execute(conn, "count_orphans_among", {"partition_ids": owned, "node_id": victim.node_id})[
                        0
                    ]["orphans"]
                    == 0
                )

            wait_until(reowned, 60, interval_s=0.02, what="the victim's partitions to be owned again")
            reowns.append(time.monotonic() - t_kill)
            if kind == "crash":
                claims = queries.execute(conn, "partition_claims", {"partition_ids": owned})
                expired = gone[0] if gone else old_expiry
                detects.append((max(r["acquired_at"] for r in claims) - expired).total_seconds())
            time.sleep(max(AFTER_S, STATS_SETTLE_S))
            ended = store.now(conn)
            w1 = queries.execute(conn, "coordination_writes")[0]["writes"]
            x1 = queries.execute(conn, "store_transactions")[0]["xacts"]
            e1 = _etcd_requests(etcd_endpoint) if etcd_endpoint else 0.0
        finally:
            for proc in procs:
                proc.stop()
        writes += w1 - w0
        # Less the bench's own probes in the window (victim's partitions, claims, store time, 3 counters).
        xacts += x1 - x0 - own_queries - 6
        etcd_requests += e1 - e0 - own_etcd
        seconds += (ended - started).total_seconds()
        window = (killed_at - timedelta(seconds=1), ended - timedelta(seconds=2))
        rows_ = queries.execute(
            conn, "lateness_in_partitions", {"partition_ids": owned, "since": window[0], "until": window[1]}
        )
        lateness += [r["lateness_s"] for r in rows_]
        audit = verify(
            conn,
            (started + timedelta(seconds=1)).replace(microsecond=0),
            (ended - timedelta(seconds=2)).replace(microsecond=0),
        )
        missing += audit.missing
        duplicates += audit.duplicates
        conn.close()
    return FailoverResult(
        kind=kind,
        trials=trials,
        nodes=nodes,
        jobs=jobs,
        affected_runs=len(lateness),
        lateness_p50_s=_percentile(lateness, 0.5),
        lateness_p99_s=_percentile(lateness, 0.99),
        lateness_max_s=max(lateness) if lateness else None,
        reown_s=max(reowns) if reowns else float("nan"),
        detect_s=max(detects) if detects else None,
        missing=missing,
        duplicates=duplicates,
        coordination_writes_per_s=writes / seconds if seconds else 0.0,
        store_transactions_per_s=xacts / seconds if seconds else 0.0,
        etcd_requests_per_s=(etcd_requests / seconds if seconds else 0.0) if etcd_endpoint else None,
    )


def run_comparison(
    dsn: str,
    coordinators: list[str],
    kinds: list[str],
    nodes: int,
    jobs: int,
    trials: int,
    out_dir: Path,
    etcd_endpoints: str | None = None,
    node_args: tuple[str, ...] = (),
) -> dict[str, dict[str, FailoverResult]]:
    """``{coordinator: {kind: result}}`` for each coordinator (``sql``, ``etcd``) and kind.

    For ``etcd`` without ``etcd_endpoints`` a throwaway etcd is started (and
    stopped); with several endpoints the first is measured.
    """
    out: dict[str, dict[str, FailoverResult]] = {}
    with contextlib.ExitStack() as stack:
        for coordinator in coordinators:
            endpoint = None
            if coordinator == "etcd":
                if etcd_endpoints:
                    endpoint = etcd_endpoints.split(",")[0].strip().removeprefix("http://")
                else:
                    endpoint = stack.enter_context(ThrowawayEtcd()).endpoint
            logs = out_dir / coordinator
            out[coordinator] = {
                kind: run_failover(dsn, kind, nodes, jobs, trials, logs, node_args, etcd_endpoint=endpoint)
                for kind in kinds
            }
    return out


@dataclasses.dataclass
class LoadResult:
    """What a balanced fleet costs its store (and etcd) per second, with no failure."""

    coordinator: str
    nodes: int
    jobs: int
    seconds: float
    coordination_writes_per_s: float
    store_transactions_per_s: float
    etcd_requests_per_s: float | None


def run_load(
    dsn: str,
    nodes: int,
    jobs: int,
    seconds: float,
    out_dir: Path,
    node_args: tuple[str, ...] = (),
    etcd_endpoint: str | None = None,
) -> LoadResult:
    """Start ``nodes`` nodes on ``jobs`` 1 s interval jobs, wait until balanced, then
    measure ``seconds`` of steady state (the bench sends two queries in the window)."""
    conn, flags = _prepare(dsn, jobs, etcd_endpoint)
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = [start_node(dsn, f"load-{i}", log_dir, [*node_args, *flags]) for i in range(nodes)]
    try:
        wait_until(lambda: _balanced(conn, nodes), 60, what="every node to hold its fair share")
        time.sleep(STATS_SETTLE_S)
        w0 = queries.execute(conn, "coordination_writes")[0]["writes"]
        x0 = queries.execute(conn, "store_transactions")[0]["xacts"]
        e0 = _etcd_requests(etcd_endpoint) if etcd_endpoint else 0.0
        t0 = time.monotonic()
        time.sleep(seconds)
        w1 = queries.execute(conn, "coordination_writes")[0]["writes"]
        x1 = queries.execute(conn, "store_transactions")[0]["xacts"]
        e1 = _etcd_requests(etcd_endpoint) if etcd_endpoint else 0.0
        elapsed = time.monotonic() - t0
    finally:
        for proc in procs:
            proc.stop()
        conn.close()
    return LoadResult(
        coordinator="etcd" if etcd_endpoint else "sql",
        nodes=nodes,
        jobs=jobs,
        seconds=elapsed,
        coordination_writes_per_s=(w1 - w0) / elapsed,
        store_transactions_per_s=(x1 - x0) / elapsed,
        etcd_requests_per_s=(e1 - e0) / elapsed if etcd_endpoint else None,
    )
