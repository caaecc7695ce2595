"""The midnight herd: many jobs due at one instant, one big tenant, many small ones.

Shape (docs/design.md §5): ``jobs`` cron jobs all due at the same minute boundary
``T`` (expressions of the kinds found in the real corpus, in several zones, all
matching ``T``), one big tenant holding ``big_share`` of them and
``tenants - 1`` small tenants sharing the rest, among ``background_jobs``
not due for months. ``nodes`` node processes fire them; drain time runs from
``T`` to the last run's ``fired_at``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import queries, report
from bench.load import copy_jobs, cron_row, ensure_tenants, reset_store, start_node, wait_until
from scheduler import store
from scheduler.audit import verify
from scheduler.schedule import CronSchedule
from scheduler.zones import load_zone

BACKGROUND_EXPRS = ("0 0 1 1 *", "30 3 1 */6 *", "15 4 29 2 *", "0 12 25 12 *")
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney")


def herd_expressions(t: datetime) -> list[tuple[str, str]]:
    """(expression, zone) pairs that all fire at ``t`` (a minute boundary), corpus-like."""
    out = []
    for zone in ZONES:
        lt = t.astimezone(load_zone(zone))
        m, h, d, mon, dow = lt.minute, lt.hour, lt.day, lt.month, (lt.weekday() + 1) % 7
        out += [
            (f"{m} {h} * * *", zone),
            (f"{m} * * * *", zone),
            (f"{m} {h} * * {dow}", zone),
            (f"{m} {h} {d} * *", zone),
            (f"{m} {h} {d} {mon} *", zone),
        ]
        for step in (5, 10, 15, 30):
            if m % step == 0:
                out.append((f"*/{step} * * * *", zone))
    out.append(("* * * * *", "UTC"))
    for expr, zone in out:  # guard: every expression must fire exactly at t
        assert CronSchedule(expr, zone).next_after(t - timedelta(seconds=1)) == t, (expr, zone)
    return out


@dataclasses.dataclass
class HerdResult:
    jobs: int
    background_jobs: int
    tenants: int
    nodes: int
    drain_s: float
    runs: int
    missing: int
    duplicates: int
    unexpected: int
    throughput_runs_per_s: float
    lag_p50_s: float
    lag_p99_s: float
    lag_max_s: float
    small_tenants_lag_p99_s: float | None
    big_tenant_lag_p99_s: float | None
    node_rss_mb_max: float | None
    nominal_time: str
    max_rate_per_s: float | None


def run_herd(
    dsn: str,
    jobs: int,
    background_jobs: int,
    tenants: int,
    big_share: float,
    nodes: int,
    out_dir: Path,
    max_rate: float | None = None,
    lead_s: float = 15.0,
    progress=None,
    timeout_s: float = 600.0,
) -> HerdResult:
    """Load, fire and measure one herd; see the module doc. Raises TimeoutError if it never drains."""
    conn = reset_store(dsn)
    small = [f"small-{i:03d}" for i in range(max(0, tenants - 1))]
    ensure_tenants(conn, ["big", *small])
    created = store.now(conn)

    if background_jobs:
        bar = progress(total=background_jobs, desc="background jobs (COPY)") if progress else None
        nexts = {e: CronSchedule(e).next_after(created) for e in BACKGROUND_EXPRS}
        rows = (
            cron_row(small[i % len(small)] if small else "big", e, "UTC", nexts[e], created)
            for i in range(background_jobs)
            for e in (BACKGROUND_EXPRS[i % len(BACKGROUND_EXPRS)],)
        )
        copy_jobs(conn, rows, bar.update if bar else None)
        if bar:
            bar.close()

    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    extra = [] if max_rate is None else ["--max-rate-per-s", str(max_rate)]
    procs = [start_node(dsn, f"bench-{i}", log_dir, extra) for i in range(nodes)]
    try:
        wait_until(
            lambda: queries.execute(conn, "count_owned_partitions")[0]["owned"] == 1024,
            60,
            what="nodes to own all 1,024 partitions",
        )
        now = store.now(conn)
        # The herd instant: the first minute boundary after loading should be done.
        ready = now + timedelta(seconds=jobs / 40_000 + lead_s)
        t = ready.replace(second=0, microsecond=0) + timedelta(minutes=1)
        exprs = herd_expressions(t)
        big_count = int(round(jobs * big_share)) if small else jobs
        bar = progress(total=jobs, desc=f"herd jobs due at {t:%H:%M:%S}Z (COPY)") if progress else None

        def herd_rows():
            for i in range(jobs):
                tenant = "big" if i < big_count else small[(i - big_count) % len(small)]
                expr, zone = exprs[i % len(exprs)]
                yield cron_row(tenant, expr, zone, t, created)

        copy_jobs(conn, herd_rows(), bar.update if bar else None)
        if bar:
            bar.close()
        # A real midnight herd hits a table vacuumed long ago; without this the
        # bench would measure autovacuum of a fresh bulk load racing the herd.
        conn.execute("VACUUM ANALYZE jobs")
        loaded = store.now(conn)
        if loaded >= t:
            raise RuntimeError(f"loading took past the herd instant {t}: raise --lead-s")
        time.sleep(max(0.0, (t - loaded).total_seconds()))
        bar = progress(total=jobs, desc="firing") if progress else None
        fired = [0]
        polls = [0]

        def update_bar() -> None:
            n = jobs - queries.execute(conn, "count_due_at", {"nominal": t})[0]["due"]
            bar.update(n - fired[0])
            fired[0] = n

        def drained() -> bool:
            # The drain check is a few index probes; counting what is left
            # walks the remaining due entries, so the bar moves every 5 s
            # only: the probe must not take the store's CPU from the herd.
            polls[0] += 1
            done = not queries.execute(conn, "any_due_at", {"nominal": t})[0]["due"]
            if bar and (done or polls[0] % 10 == 0):
                update_bar()
            return done

        wait_until(drained, timeout_s, interval_s=0.5, what="the herd to drain")
        if bar:
            bar.close()
        rss = [p.peak_rss_mb() for p in procs]
    finally:
        for proc in procs:
            proc.stop()
    stats = queries.execute(conn, "herd_stats", {"nominal": t})[0]
    # The audit window [t, t + 1 s) must be over (store clock) before it is
    # audited: a small herd drains in well under a second.
    wait_until(lambda: store.now(conn) >= t + timedelta(seconds=1), 5, interval_s=0.05, what="the herd second to pass")
    audit = verify(conn, t, t + timedelta(seconds=1))
    series = queries.execute(conn, "herd_series", {"nominal": t})
    result = HerdResult(
        jobs=jobs,
        background_jobs=background_jobs,
        tenants=tenants,
        nodes=nodes,
        drain_s=stats["drain_s"],
        runs=stats["runs"],
        missing=audit.missing,
        duplicates=audit.duplicates,
        unexpected=audit.unexpected,
        throughput_runs_per_s=stats["runs"] / stats["drain_s"] if stats["drain_s"] else math.inf,
        lag_p50_s=stats["lag_p50_s"],
        lag_p99_s=stats["lag_p99_s"],
        lag_max_s=stats["lag_max_s"],
        small_tenants_lag_p99_s=stats["small_p99_s"],
        big_tenant_lag_p99_s=stats["big_p99_s"],
        node_rss_mb_max=max((r for r in rss if r is not None), default=None),
        nominal_time=t.isoformat(),
        max_rate_per_s=max_rate,
    )
    report.plot_lag(series, out_dir / f"herd-{uuid.uuid4().hex[:6]}.png", f"herd: {jobs:,} jobs, {nodes} node(s)")
    conn.close()
    return result


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, default=str) + "\n")


def utcnow() -> datetime:
    return datetime.now(UTC)
