"""The midnight herd: many jobs due at one instant, one big tenant, many small ones.

Shape (docs/design.md §5): ``jobs`` cron jobs all due at the same minute boundary
``T``, one big tenant holding ``big_share`` of them and ``tenants - 1`` small
tenants sharing the rest, among ``background_jobs`` not due for months.
``nodes`` node processes fire them; drain time runs from ``T`` to the last
run's ``fired_at``.

The herd's (expression, zone) pairs (:mod:`bench.pairs`): by default the
bench's own herd, the corpus-like expressions of
:func:`~bench.pairs.herd_expressions` (26 pairs in five zones, timers spread
evenly); with ``distinct_schedules`` K, K distinct pairs from every IANA zone
with Zipf-like popularity (:func:`~bench.pairs.distinct_pairs`). Every job
carries its registered ``schedule_key`` (:func:`bench.load.register_specs`).

Several herds in one run (:func:`run_herds`, ``bench herd
--distinct-schedules 26,5000``): the store is reset, the background loaded
and the nodes started once; then each herd in turn is loaded while nothing
is due (the previous herd's timers deleted first, so those that fire again
every minute or hour stay out of it), fired at its own minute boundary,
measured (``herd_stats``) and audited over ``[T, T + 1 s)`` while the nodes
keep running.
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
from bench.load import (
    copy_jobs,
    cron_spec,
    ensure_tenants,
    job_row,
    register_specs,
    reset_store,
    start_node,
    wait_until,
)
from bench.pairs import DEFAULT_SEED, herd_expressions, herd_plan, plan_seconds
from scheduler import store
from scheduler.audit import verify
from scheduler.schedule import CronSchedule

BACKGROUND_EXPRS = ("0 0 1 1 *", "30 3 1 */6 *", "15 4 29 2 *", "0 12 25 12 *")

__all__ = [
    "BACKGROUND_EXPRS",
    "Herd",
    "HerdResult",
    "herd_expressions",
    "load_background",
    "run_herd",
    "run_herds",
    "small_tenants",
]


@dataclasses.dataclass
class HerdResult:
    """One herd's figures (seconds; lag = ``fired_at`` − scheduled time).

    ``distinct_schedules``: the herd's (expression, zone) pairs;
    ``drain_vs_first``: ``drain_s`` over that of the first herd of the same
    run (:func:`run_herds`; 1.0 for the first, ``None`` from
    :func:`run_herd`); ``node_rss_mb_max``: the nodes' peak RSS so far in
    the run.
    """

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
    distinct_schedules: int | None = None
    drain_vs_first: float | None = None


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
    """Load, fire and measure the bench's own herd (:func:`bench.pairs.herd_expressions`);
    see the module doc. Raises TimeoutError if it never drains."""
    (result,) = run_herds(
        dsn,
        jobs,
        background_jobs,
        tenants,
        big_share,
        nodes,
        out_dir,
        [None],
        max_rate=max_rate,
        lead_s=lead_s,
        progress=progress,
        timeout_s=timeout_s,
    )
    result.drain_vs_first = None
    return result


def run_herds(
    dsn: str,
    jobs: int,
    background_jobs: int,
    tenants: int,
    big_share: float,
    nodes: int,
    out_dir: Path,
    distinct_schedules: list[int | None],
    max_rate: float | None = None,
    lead_s: float = 15.0,
    progress=None,
    timeout_s: float = 600.0,
    seed: int = DEFAULT_SEED,
) -> list[HerdResult]:
    """Load the background once, start the nodes, then fire and measure one herd of
    ``jobs`` timers per entry of ``distinct_schedules`` (its pairs as
    :func:`bench.pairs.herd_plan` makes them: ``None`` or 26 the bench's own
    herd), in that order, at successive minute boundaries; see the module doc.

    Returns the results in the same order, ``drain_vs_first`` filled.
    Raises ValueError before touching the store if an entry is below 1 or
    above ``jobs``; TimeoutError if a herd never drains; RuntimeError if
    loading a herd took past its instant (raise ``lead_s``).
    """
    for k in distinct_schedules:
        if k is not None and not 1 <= k <= jobs:
            raise ValueError(f"--distinct-schedules {k}: must be 1 to --jobs ({jobs})")
    conn = reset_store(dsn)
    small = load_background(conn, tenants, background_jobs, progress)

    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    extra = [] if max_rate is None else ["--max-rate-per-s", str(max_rate)]
    procs = [start_node(dsn, f"bench-{i}", log_dir, extra) for i in range(nodes)]
    results: list[HerdResult] = []
    try:
        wait_until(
            lambda: queries.execute(conn, "count_owned_partitions")[0]["owned"] == 1024,
            60,
            what="nodes to own all 1,024 partitions",
        )
        last_created = None
        for k in distinct_schedules:
            if last_created is not None:
                # The last herd's timers that fire again (every minute, every
                # hour, ...) must stay out of this one: forget them while nothing is due.
                tag = {"created": last_created}
                store.run_transaction(conn, lambda c: queries.execute(c, "delete_jobs_created_at", tag))
                # Their index entries are cleaned now, before the next herd's
                # instant is chosen: the VACUUM after its load stays short.
                conn.execute("VACUUM jobs")
            herd = Herd(jobs, background_jobs, tenants, nodes, small, big_share, max_rate, k, seed)
            last_created = herd.load(conn, lead_s, progress)
            results.append(herd.fire(conn, procs, out_dir, progress, timeout_s))
    finally:
        for proc in procs:
            proc.stop()
        conn.close()
    first = results[0].drain_s
    for result in results:
        result.drain_vs_first = result.drain_s / first if first else None
    return results


def small_tenants(tenants: int) -> list[str]:
    """The herd's small tenants' names (``tenants - 1`` of them; the big one is ``big``)."""
    return [f"small-{i:03d}" for i in range(max(0, tenants - 1))]


def load_background(conn, tenants: int, background_jobs: int, progress=None) -> list[str]:
    """Create the herd's tenants (``big`` and :func:`small_tenants`) and COPY
    ``background_jobs`` jobs not due for months (:data:`BACKGROUND_EXPRS`,
    spread over the small tenants, or ``big`` without any). Returns the small
    tenants' names."""
    small = small_tenants(tenants)
    ensure_tenants(conn, ["big", *small])
    if not background_jobs:
        return small
    created = store.now(conn)
    bar = progress(total=background_jobs, desc="background jobs (COPY)") if progress else None
    nexts = {e: CronSchedule(e).next_after(created) for e in BACKGROUND_EXPRS}
    specs = [cron_spec(e, "UTC") for e in BACKGROUND_EXPRS]
    values = dict(zip(BACKGROUND_EXPRS, register_specs(conn, specs), strict=True))
    rows = (
        job_row(small[i % len(small)] if small else "big", values[e], nexts[e], created)
        for i in range(background_jobs)
        for e in (BACKGROUND_EXPRS[i % len(BACKGROUND_EXPRS)],)
    )
    copy_jobs(conn, rows, bar.update if bar else None)
    if bar:
        bar.close()
    return small


@dataclasses.dataclass
class Herd:
    """One herd of a run: its shape; ``t`` and ``pairs`` once loaded (:meth:`load`, then
    :meth:`fire`; ``bench deliver`` drives it the same way). ``on_second``: ``t`` is the
    next whole second after loading (``seconds``-dialect crons,
    :func:`bench.pairs.seconds_pairs`) instead of the next minute boundary."""

    jobs: int
    background_jobs: int
    tenants: int
    nodes: int
    small: list[str]
    big_share: float
    max_rate: float | None
    k: int | None
    seed: int
    t: datetime | None = None
    pairs: int = 0
    on_second: bool = False

    def load(self, conn, lead_s: float, progress, prepare=None) -> datetime:
        """Choose ``t`` (the first minute boundary, or whole second if ``on_second``, after
        loading should be done), register
        the herd's specs, COPY its timers, call ``prepare(conn, created)`` if
        given (e.g. to give them HTTP targets), VACUUM ANALYZE ``jobs``. Returns
        the timers' ``created_at`` (a store time no other job has). Raises
        RuntimeError if loading took past ``t``."""
        now = store.now(conn)
        ready = now + timedelta(seconds=self.jobs / 40_000 + plan_seconds(self.k) + lead_s)
        if self.on_second:
            t = ready.replace(microsecond=0) + timedelta(seconds=1)
        else:
            t = ready.replace(second=0, microsecond=0) + timedelta(minutes=1)
        self.t = t
        pairs, pair_of = herd_plan(t, self.jobs, self.k, self.seed, on_second=self.on_second)
        self.pairs = len(pairs)
        dialect = "seconds" if self.on_second else "unix"
        values = register_specs(conn, [cron_spec(expr, zone, dialect) for expr, zone in pairs])
        created = store.now(conn)
        small = self.small
        big_count = int(round(self.jobs * self.big_share)) if small else self.jobs
        label = f"herd jobs due at {t:%H:%M:%S}Z, {len(pairs):,} schedules (COPY)"
        bar = progress(total=self.jobs, desc=label) if progress else None

        def herd_rows():
            for i in range(self.jobs):
                tenant = "big" if i < big_count else small[(i - big_count) % len(small)]
                yield job_row(tenant, values[pair_of[i]], t, created)

        copy_jobs(conn, herd_rows(), bar.update if bar else None)
        if bar:
            bar.close()
        if prepare is not None:
            prepare(conn, created)
        # A real midnight herd hits a table vacuumed long ago; without this the
        # bench would measure autovacuum of a fresh bulk load racing the herd.
        conn.execute("VACUUM ANALYZE jobs")
        loaded = store.now(conn)
        if loaded >= t:
            raise RuntimeError(f"loading took past the herd instant {t}: raise --lead-s")
        return created

    def fire(self, conn, procs, out_dir: Path, progress, timeout_s: float) -> HerdResult:
        """Sleep to ``t``, wait for the herd to drain, measure and audit it (the nodes
        keep running). Raises TimeoutError if it never drains."""
        self.drain(conn, progress, timeout_s)
        return self.measure(conn, procs, out_dir)

    def drain(self, conn, progress, timeout_s: float) -> None:
        """Sleep to ``t`` and wait until no herd timer is due any more. Raises
        TimeoutError if that takes over ``timeout_s`` seconds."""
        t = self.t
        jobs = self.jobs
        time.sleep(max(0.0, (t - store.now(conn)).total_seconds()))
        bar = progress(total=jobs, desc="firing") if progress else None
        fired = [0]
        polls = [0]

        def update_bar() -> None:
            n = jobs - queries.execute(conn, "count_due_at", {"nominal": t})[0]["due"]
            bar.update(n - fired[0])
            fired[0] = n

        def drained() -> bool:
            # The bench must not take the store's CPU from the herd it measures.
            # The drain check is an index probe per tenant, but each walks the
            # herd's dead index entries (the jobs advanced so far): ~50-100 ms a
            # probe mid-herd among 5 M jobs, so every 2 s; counting what is left
            # walks every remaining due entry (~0.4 s a count), so the bar moves
            # every 20 s only. The figures come from the runs' fired_at, not from
            # when a poll noticed the drain.
            polls[0] += 1
            done = not queries.execute(conn, "any_due_at", {"nominal": t})[0]["due"]
            if bar and (done or polls[0] % 10 == 0):
                update_bar()
            return done

        wait_until(drained, timeout_s, interval_s=2.0, what="the herd to drain")
        if bar:
            bar.close()

    def measure(self, conn, procs, out_dir: Path) -> HerdResult:
        """The drained herd's figures and audit (``verify`` over ``[t, t + 1 s)``), its plot
        in ``out_dir``, the nodes' (``procs``, still running) peak RSS."""
        t = self.t
        jobs = self.jobs
        rss = [p.peak_rss_mb() for p in procs]
        stats = queries.execute(conn, "herd_stats", {"nominal": t})[0]
        # The audit window [t, t + 1 s) must be over (store clock) before it is
        # audited: a small herd drains in well under a second.
        wait_until(
            lambda: store.now(conn) >= t + timedelta(seconds=1), 5, interval_s=0.05, what="the herd second to pass"
        )
        audit = verify(conn, t, t + timedelta(seconds=1))
        series = queries.execute(conn, "herd_series", {"nominal": t})
        title = f"herd: {jobs:,} jobs, {self.pairs:,} schedules, {self.nodes} node(s)"
        report.plot_lag(series, out_dir / f"herd-{uuid.uuid4().hex[:6]}.png", title)
        return HerdResult(
            jobs=jobs,
            background_jobs=self.background_jobs,
            tenants=self.tenants,
            nodes=self.nodes,
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
            max_rate_per_s=self.max_rate,
            distinct_schedules=self.pairs,
        )


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, default=str) + "\n")


def utcnow() -> datetime:
    return datetime.now(UTC)
