"""Steady load: a sustained firing rate (the seed's peak minute, 12,000 runs/s).

``rate × period_s`` interval jobs with period ``period_s``, their anchors
spread evenly over the period, so ``rate`` runs fall due every second.
``nodes`` node processes fire them for ``seconds``; lateness percentiles and
the audit come from the runs of the middle of the run (the first and last
:data:`EDGE_S` seconds are left out: start-up and shutdown are not steady).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta
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

EDGE_S = 5


@dataclasses.dataclass
class SteadyResult:
    rate: int
    period_s: int
    jobs: int
    nodes: int
    seconds: int
    runs: int
    missing: int
    duplicates: int
    throughput_runs_per_s: float
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    node_rss_mb_max: float | None


def tenant_names(tenants: int) -> list[str]:
    """The steady workload's tenants: ``tenant-00``, ``tenant-01``, ..."""
    return [f"tenant-{i:02d}" for i in range(tenants)]


def load_steady(conn, rate: int, period_s: int, tenants: int, progress=None, prepare=None) -> tuple[datetime, int]:
    """Create :func:`tenant_names` and COPY ``rate × period_s`` interval jobs (period
    ``period_s``, anchors spread evenly from ``base``, the whole second
    ``period_s`` seconds from now, so ``rate`` runs fall due every second from
    ``base``) over them, round robin; call ``prepare(conn, created)`` if given
    (e.g. to give them HTTP targets); VACUUM ANALYZE ``jobs``. Returns
    ``(base, jobs)``."""
    names = tenant_names(tenants)
    ensure_tenants(conn, names)
    now = store.now(conn)
    base = now.replace(microsecond=0) + timedelta(seconds=period_s)
    jobs = rate * period_s

    values = register_specs(conn, [interval_spec(period_s, base + timedelta(seconds=i)) for i in range(period_s)])

    def rows():
        for i in range(jobs):
            anchor = base + timedelta(seconds=i % period_s)
            yield job_row(names[i % tenants], values[i % period_s], anchor, now)

    bar = progress(total=jobs, desc="interval jobs (COPY)") if progress else None
    copy_jobs(conn, rows(), bar.update if bar else None)
    if bar:
        bar.close()
    if prepare is not None:
        prepare(conn, now)
    conn.execute("VACUUM ANALYZE jobs")
    return base, jobs


def steady_window(started: datetime, ended: datetime, base: datetime) -> tuple[datetime, datetime]:
    """The measured window ``[since, until)`` of nominal times: from the later of the nodes'
    start and ``base``, and to their end, each cut by :data:`EDGE_S` seconds and
    truncated to whole seconds (start-up and shutdown are not steady)."""
    since = max(started, base).replace(microsecond=0) + timedelta(seconds=EDGE_S)
    until = ended.replace(microsecond=0) - timedelta(seconds=EDGE_S)
    return since, until


def run_steady(
    dsn: str, rate: int, seconds: int, nodes: int, out_dir: Path, period_s: int = 10, tenants: int = 10, progress=None
) -> SteadyResult:
    """Load ``rate × period_s`` interval jobs, fire for ``seconds``, measure."""
    if seconds <= 2 * EDGE_S:
        raise ValueError(f"--seconds must exceed {2 * EDGE_S}")
    conn = reset_store(dsn)
    base, jobs = load_steady(conn, rate, period_s, tenants, progress)
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = [start_node(dsn, f"steady-{i}", log_dir) for i in range(nodes)]
    try:
        wait_until(
            lambda: queries.execute(conn, "count_owned_partitions")[0]["owned"] == 1024,
            60,
            what="nodes to own all 1,024 partitions",
        )
        started = store.now(conn)
        time.sleep(seconds)
        ended = store.now(conn)
        rss = [p.peak_rss_mb() for p in procs]
    finally:
        for proc in procs:
            proc.stop()
    since, until = steady_window(started, ended, base)
    audit = verify(conn, since, until)
    window_s = (until - since).total_seconds()
    conn.close()
    return SteadyResult(
        rate=rate,
        period_s=period_s,
        jobs=jobs,
        nodes=nodes,
        seconds=seconds,
        runs=audit.runs,
        missing=audit.missing,
        duplicates=audit.duplicates,
        throughput_runs_per_s=audit.runs / window_s if window_s > 0 else 0.0,
        lag_p50_s=audit.lateness_p50_s,
        lag_p99_s=audit.lateness_p99_s,
        lag_max_s=audit.lateness_max_s,
        node_rss_mb_max=max((r for r in rss if r is not None), default=None),
    )
