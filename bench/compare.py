"""The ``compare`` workload: the same herd and steady work, side by side, in one run.

Systems, each from a clean state of its own tables on the same PostgreSQL:

* ``ours``: the engine, as real ``scheduler node`` processes (1 and 4), jobs
  COPYed into its tables as :mod:`bench.herd` does;
* ``naive``: the design the seed rejects (:mod:`bench.naive`), every worker
  process racing on due rows with ``FOR UPDATE SKIP LOCKED`` (1 and 4);
* ``ours-e2e``: ``ours`` with one node and ``processes`` workers (1 and 4 by
  default) claiming and acking every run of every tenant's queue
  (:func:`bench.consumers.start_workers`: ``processes`` processes over every
  tenant, the engine's ``scheduler worker`` or the bench's loop;
  ``Config.worker_impl``):
  the end-to-end figure;
* ``pgqueuer``, ``procrastinate`` and ``apscheduler``: the peers
  (:mod:`bench.peers`).

Workloads (:class:`Work`):

* ``herd``: ``jobs`` timers due at one instant T. For ``ours`` and ``naive``
  they are the corpus-like cron expressions of :func:`bench.pairs.herd_expressions`
  (five zones, all matching T, so T is a minute boundary), or with
  ``distinct_schedules`` K (``compare --distinct-schedules K[,K2...]``) K
  distinct (expression, zone) pairs with skewed popularity
  (:func:`bench.pairs.distinct_pairs`: the same generator and seed for both,
  spelled for each one's own T); one big tenant with 90 % of them and 50
  small ones. The peers get one deferred job (pgqueuer) or one
  ``DateTrigger`` schedule (APScheduler) per timer at T: they hold no
  schedules, so with several K they run the herd once, with the first K's
  rows (their ratios are against naive × 1 at that K).
* ``steady``: ``jobs`` timers each due every second for ``seconds`` seconds
  (a seconds-dialect ``* * * * * *`` cron for ``ours`` and ``naive``; one
  deferred job per occurrence for pgqueuer; a 1 s ``IntervalTrigger`` for
  APScheduler).

Measures, the same for every system: an *occurrence* is a (timer, nominal
time) of the window; its lateness is fire time − nominal time (``ours`` and
``naive``: the run row's ``fired_at``, the store's clock at the firing
statement; ``ours-e2e``: the run's ``first_claimed_at``, the store's clock at
the claim that handed it to a worker; peers: the wall clock on entry to the
task, same host). A row's ``stage`` says which: ``fired`` (ours, naive) or
``handed`` (to a worker: ours-e2e and the peers, whose handler start is both). An
occurrence that has not fired by ``bound_s`` after the last nominal instant
is *lost* and counts as infinitely late in the percentiles, so no system
improves its p99 by dropping work (a percentile that falls on a lost
occurrence is reported as ``null``). Throughput is occurrences fired / (last
fire − first nominal instant). ``ratio_vs_naive`` is a row's throughput over
that of ``naive`` with one process on the same workload, in the same run;
``lag_p99_vs_naive`` the same for the p99 lateness (lower is better).
``ratio_vs_ours_e2e`` and ``lag_p99_vs_ours_e2e``: the same for the
``handed`` rows against the first ``ours-e2e`` row of the workload (the
end-to-end figure: timer due → handed to a worker).
``small_tenants_lag_p99_s`` is the p99 over the 50 small tenants' occurrences
(timer ``i``'s tenant is the same in every system, and every system registers
the timers in the same shuffled order, so no first-in-first-out order favours
a tenant); ``duplicates`` counts extra calls of an occurrence.

Every system's tables are VACUUM ANALYZEd after loading, as :mod:`bench.herd`
does for the engine (a real herd hits tables analysed long ago; without it
pgqueuer's dequeue plan on a freshly filled queue is 3-4x slower).

A system that cannot run here (missing package, crash, ``ours``/``naive``
loading past T) gets a row with every occurrence lost and a ``note``; the run
goes on. A peer whose loading ends after T is measured anyway, with a note.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from psycopg import sql

from bench import consumers, naive, peers, queries
from bench.load import (
    TRUNCATE,
    copy_jobs,
    cron_spec,
    ensure_tenants,
    job_row,
    register_specs,
    reset_store,
    start_node,
    wait_until,
)
from bench.pairs import herd_plan, plan_seconds
from bench.report import percentile
from scheduler import store

SYSTEMS = ("naive", "ours", "ours-e2e", "pgqueuer", "procrastinate", "apscheduler")
"""In run order: the baseline first."""
E2E_SYSTEMS = ("ours-e2e", "pgqueuer", "procrastinate", "apscheduler")
"""Systems whose figure is *timer due → handed to a worker* (stage ``handed``): the
peers record when their handler starts; ``ours-e2e`` is the engine with
worker processes claiming the runs (``first_claimed_at``). ``ours`` and
``naive`` stop at the fired run (stage ``fired``)."""
WORKLOADS = ("herd", "steady")
TENANTS = 51
BIG_TENANT_SHARE = 0.9
PARTITIONS = 1024

COLUMNS = [
    "system",
    "workload",
    "stage",
    "processes",
    "jobs",
    "occurrences",
    "fired",
    "lost",
    "throughput_runs_per_s",
    "lag_p50_s",
    "lag_p99_s",
    "lag_max_s",
    "ratio_vs_naive",
    "lag_p99_vs_naive",
    "ratio_vs_ours_e2e",
    "lag_p99_vs_ours_e2e",
    "small_tenants_lag_p99_s",
    "note",
]

# Measurement SQL of the bench itself (the engine's own queries are in scheduler/sql).
OURS_OWNERS = """
SELECT owner_node, count(*) AS owned FROM leases
WHERE owner_node IS NOT NULL AND lease_expires_at > now()
GROUP BY owner_node
"""
OURS_FIRES = """
SELECT tenant || '/' || job_id::text AS key, extract(epoch FROM nominal_time)::float8 AS nominal_s,
       extract(epoch FROM fired_at)::float8 AS fired_s
FROM runs
WHERE nominal_time >= %(first)s AND nominal_time <= %(last)s
"""
OURS_CLAIMS = """
SELECT tenant || '/' || job_id::text AS key, extract(epoch FROM nominal_time)::float8 AS nominal_s,
       extract(epoch FROM first_claimed_at)::float8 AS fired_s
FROM runs
WHERE nominal_time >= %(first)s AND nominal_time <= %(last)s AND first_claimed_at IS NOT NULL
"""
NAIVE_DUE = "SELECT EXISTS (SELECT 1 FROM jobs WHERE next_fire_at <= %(last)s) AS due"
NAIVE_FIRES = """
SELECT tenant || '/' || job_id::text AS key, extract(epoch FROM nominal_time)::float8 AS nominal_s,
       extract(epoch FROM fired_at)::float8 AS fired_s
FROM runs
WHERE nominal_time >= %(first)s AND nominal_time <= %(last)s
"""


@dataclasses.dataclass(frozen=True)
class Work:
    """``jobs`` timers, each due at ``seconds`` nominal instants 1 s apart (herd: 1);
    a herd's ``distinct_schedules`` as :func:`bench.pairs.herd_plan` reads it
    (``None``: the bench's own herd)."""

    name: str
    jobs: int
    seconds: int = 1
    distinct_schedules: int | None = None

    @property
    def occurrences(self) -> int:
        return self.jobs * self.seconds


@dataclasses.dataclass
class Config:
    """Where and how: the store, logs (``out_dir/compare-logs``), the loss bound and the
    slack between loading and T (seconds), the naive loop's / pgqueuer's batch sizes,
    procrastinate's worker concurrency, the claim batch and implementation
    (:mod:`bench.consumers`) of ``ours-e2e``'s workers."""

    dsn: str
    out_dir: Path
    bound_s: float = 60.0
    lead_s: float = 5.0
    naive_batch: int = naive.BATCH
    naive_poll_s: float = naive.POLL_S
    pgqueuer_batch: int = peers.PGQUEUER_BATCH
    procrastinate_concurrency: int = peers.PROCRASTINATE_CONCURRENCY
    worker_batch: int = consumers.BATCH
    worker_impl: str = "scheduler"
    echo: Callable[[str], None] = print

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "compare-logs"


@dataclasses.dataclass
class Fires:
    """What one system did with one workload: fire records of the window."""

    expected: int
    first_nominal: float  # epoch s
    deadline: float  # epoch s: later fires count as lost
    records: list[tuple[str, float, float]]  # (timer key, nominal epoch s, fired epoch s)
    note: str | None = None


# ---------------------------------------------------------------- statistics


def tenant_of_key(key: str, jobs: int) -> str:
    """The tenant of a fire record's timer key: ``tenant/job_id`` (ours, naive), ``i``
    (pgqueuer) or ``s<i>`` (APScheduler)."""
    if "/" in key:
        return key.split("/", 1)[0]
    return tenant_of(int(key.lstrip("s")), jobs)


def _lags(first: dict, expected: int) -> list[float]:
    """Sorted lateness of the first fire of each occurrence, ``inf`` for each one lost."""
    lags = sorted(fired - occ[1] for occ, fired in first.items())[:expected]
    return lags + [math.inf] * (expected - len(lags))


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def summarize(system: str, work: Work, processes: int, fires: Fires, wall_s: float) -> dict:
    """One comparison row (see the module doc)."""
    first: dict[tuple[str, float], float] = {}
    calls = 0
    for key, nominal, fired in fires.records:
        if fired > fires.deadline:
            continue
        calls += 1
        occ = (key, round(nominal, 3))
        if occ not in first or fired < first[occ]:
            first[occ] = fired
    lags = _lags(first, fires.expected)
    fired_n = sum(1 for lag in lags if not math.isinf(lag))
    small = {occ: f for occ, f in first.items() if tenant_of_key(occ[0], work.jobs) != "big"}
    small_expected = (work.jobs - big_count(work.jobs)) * work.seconds
    last = max(first.values(), default=None)
    span = None if last is None else last - fires.first_nominal
    return {
        "system": system,
        "workload": work.name,
        "distinct_schedules": work.distinct_schedules,
        "processes": processes,
        "jobs": work.jobs,
        "occurrences": fires.expected,
        "fired": fired_n,
        "lost": fires.expected - fired_n,
        "duplicates": calls - len(first),
        "throughput_runs_per_s": fired_n / span if span and span > 0 else None,
        "lag_p50_s": _finite(percentile(lags, 0.50)),
        "lag_p99_s": _finite(percentile(lags, 0.99)),
        "lag_max_s": _finite(lags[-1]) if lags else None,
        "small_tenants_lag_p99_s": _finite(percentile(_lags(small, small_expected), 0.99)),
        "ratio_vs_naive": None,
        "lag_p99_vs_naive": None,
        "stage": "handed" if system in E2E_SYSTEMS else "fired",
        "ratio_vs_ours_e2e": None,
        "lag_p99_vs_ours_e2e": None,
        "nominal_first": datetime.fromtimestamp(fires.first_nominal, UTC).isoformat(),
        "bound_s": round(fires.deadline - fires.first_nominal - (work.seconds - 1), 3),
        "wall_s": round(wall_s, 1),
        "note": fires.note,
    }


def add_ratios(rows: list[dict]) -> None:
    """Fill ``ratio_vs_naive`` and ``lag_p99_vs_naive`` against naive × 1 of the same
    workload (and the same ``distinct_schedules``); for the rows of stage
    ``handed``, ``ratio_vs_ours_e2e`` and ``lag_p99_vs_ours_e2e`` against the
    first ``ours-e2e`` row of the same workload (the end-to-end figure: a
    peer's throughput ratio below 1 and p99 ratio above 1 mean ours is ahead)."""
    for workload in {(r["workload"], r.get("distinct_schedules")) for r in rows}:
        same = [r for r in rows if (r["workload"], r.get("distinct_schedules")) == workload]
        naive_base = next((r for r in same if r["system"] == "naive" and r["processes"] == 1), None)
        e2e_base = next((r for r in same if r["system"] == "ours-e2e"), None)
        for row in same:
            if naive_base is not None:
                _ratio(row, naive_base, "ratio_vs_naive", "lag_p99_vs_naive")
            if e2e_base is not None and row["stage"] == "handed":
                _ratio(row, e2e_base, "ratio_vs_ours_e2e", "lag_p99_vs_ours_e2e")


def _ratio(row: dict, base: dict, throughput_key: str, lag_key: str) -> None:
    if row["throughput_runs_per_s"] and base["throughput_runs_per_s"]:
        row[throughput_key] = row["throughput_runs_per_s"] / base["throughput_runs_per_s"]
    if row["lag_p99_s"] is not None and base["lag_p99_s"]:
        row[lag_key] = row["lag_p99_s"] / base["lag_p99_s"]


def table_rows(rows: list[dict]) -> list[dict]:
    """Rows for the Markdown table: a lateness lost in the bound reads "lost"."""
    out = []
    for row in rows:
        row = dict(row)
        for col in ("lag_p50_s", "lag_p99_s", "lag_max_s", "small_tenants_lag_p99_s"):
            if row[col] is None and row["lost"]:
                row[col] = f"> {row['bound_s']:.0f} (lost)"
        out.append(row)
    return out


# ---------------------------------------------------------------- the work


def big_count(jobs: int) -> int:
    return int(round(jobs * BIG_TENANT_SHARE))


def tenant_of(i: int, jobs: int) -> str:
    """Timer ``i``'s tenant: the first 90 % go to ``big``, the rest round-robin to 50 small ones."""
    big = big_count(jobs)
    return "big" if i < big else f"small-{(i - big) % (TENANTS - 1):03d}"


def tenants() -> list[str]:
    return ["big", *(f"small-{i:03d}" for i in range(TENANTS - 1))]


def timers(work: Work, t0: datetime) -> Iterator[tuple[str, str, str, str]]:
    """(tenant, cron expression, dialect, zone) of each timer, all first due at ``t0``,
    in :func:`bench.peers.registration_order` (herd: the pairs and popularity of
    :func:`bench.pairs.herd_plan`). Raises ValueError as ``herd_plan`` does."""
    if work.name == "herd":
        pairs, pair_of = herd_plan(t0, work.jobs, work.distinct_schedules)
        dialect = "unix"
    else:
        pairs, pair_of = [("* * * * * *", "UTC")], [0] * work.jobs
        dialect = "seconds"
    for i in peers.registration_order(work.jobs):
        expr, zone = pairs[pair_of[i]]
        yield tenant_of(i, work.jobs), expr, dialect, zone


def first_instant(now: datetime, work: Work, load_s: float, lead_s: float) -> datetime:
    """T for ``ours``/``naive``: herd, the next minute boundary (the herd's crons are
    minute-grained) after loading (``load_s``, plus making the herd's pairs);
    steady, the next whole second."""
    if work.name == "herd":
        load_s += plan_seconds(work.distinct_schedules)
    ready = now + timedelta(seconds=load_s + lead_s)
    if work.name == "herd":
        return ready.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return ready.replace(microsecond=0) + timedelta(seconds=1)


def _epoch(dt: datetime) -> float:
    return dt.timestamp()


def _sleep_until(epoch_s: float) -> None:
    time.sleep(max(0.0, epoch_s - time.time()))


def _wait_done(done: Callable[[], bool], deadline: float, interval_s: float = 0.5) -> None:
    """Poll ``done()`` until true or ``deadline`` (epoch s) passes; never raises on timeout."""
    while not done() and time.time() < deadline:
        time.sleep(interval_s)


def _fire_loaded(conn, cfg: Config, t0: datetime, last: datetime, still_due: Callable[[], bool]) -> float:
    """After loading ``jobs``: VACUUM ANALYZE it, check loading ended before ``t0``, sleep to
    ``t0`` and wait until ``still_due()`` is false or the bound after ``last`` passes.

    Returns that deadline (epoch s). Raises RuntimeError if loading ran past ``t0``.
    """
    conn.execute("VACUUM ANALYZE jobs")
    loaded = store.now(conn)
    if loaded >= t0:
        raise RuntimeError(f"loading took past T ({loaded} >= {t0}): raise --lead-s")
    deadline = _epoch(last) + cfg.bound_s
    _sleep_until(_epoch(t0))
    _wait_done(lambda: not still_due(), deadline)
    return deadline


def _exit_note(codes: dict[str, int | None]) -> str | None:
    """A note naming processes that did not exit cleanly on SIGTERM (they died mid-run)."""
    bad = {name: code for name, code in codes.items() if code != 0}
    if not bad:
        return None
    return "exited abnormally (see logs): " + ", ".join(f"{n} ({c})" for n, c in sorted(bad.items()))


# ---------------------------------------------------------------- ours


def run_ours(cfg: Config, work: Work, nodes: int, workers: int = 0) -> Fires:
    """Fire ``work`` with ``nodes`` node processes; with ``workers`` > 0 (``ours-e2e``: one
    node), that many workers (:func:`bench.consumers.start_workers`, every
    tenant's ``default`` queue) claim and ack the runs, and the records are
    the runs' ``first_claimed_at`` instead of ``fired_at``."""
    conn = reset_store(cfg.dsn)
    try:
        ensure_tenants(conn, tenants())
        created = store.now(conn)
        procs = [start_node(cfg.dsn, f"cmp-{i}", cfg.log_dir) for i in range(nodes)]
        # Workers start with the nodes: idle, polling empty queues, by T.
        consumer_procs = consumers.start_workers(
            cfg.dsn, tenants(), workers, cfg.log_dir, impl=cfg.worker_impl, batch=cfg.worker_batch
        )
        codes: dict[str, int | None] = {}
        try:
            share = math.ceil(PARTITIONS / nodes)

            def balanced() -> bool:
                owned = [r["owned"] for r in conn.execute(OURS_OWNERS).fetchall()]
                return sum(owned) == PARTITIONS and len(owned) == nodes and max(owned) <= share

            wait_until(balanced, 90, what=f"{nodes} node(s) to own {PARTITIONS} partitions")
            now = store.now(conn)
            t0 = first_instant(now, work, work.jobs / 40_000, cfg.lead_s)
            last = t0 + timedelta(seconds=work.seconds - 1)
            cfg.echo(f"  {work.jobs:,} timers first due at {t0:%H:%M:%S}Z")

            work_timers = list(timers(work, t0))
            specs = {(e, d, z): cron_spec(e, z, d) for _, e, d, z in work_timers}
            values = dict(zip(specs, register_specs(conn, specs.values()), strict=True))
            copy_jobs(conn, (job_row(tenant, values[e, d, z], t0, created) for tenant, e, d, z in work_timers))
            claims = {"since": t0, "until": last + timedelta(seconds=1)}

            def still_due() -> bool:
                if queries.execute(conn, "any_due_at", {"nominal": last})[0]["due"]:
                    return True
                return bool(workers) and queries.execute(conn, "any_unclaimed", claims)[0]["unclaimed"]

            deadline = _fire_loaded(conn, cfg, t0, last, still_due)
        finally:
            codes.update({worker.worker_id: worker.stop() for worker in consumer_procs})
            codes.update({proc.node_id: proc.stop() for proc in procs})
        records = [
            (r["key"], r["nominal_s"], r["fired_s"])
            for r in conn.execute(OURS_CLAIMS if workers else OURS_FIRES, {"first": t0, "last": last}).fetchall()
        ]
        return Fires(work.occurrences, _epoch(t0), deadline, records, _exit_note(codes))
    finally:
        conn.execute(TRUNCATE)
        conn.close()


# ---------------------------------------------------------------- naive


def run_naive(cfg: Config, work: Work, processes: int) -> Fires:
    conn = naive.reset_schema(cfg.dsn)
    try:
        procs = [
            naive.NaiveProcess(cfg.dsn, f"naive-{i}", cfg.log_dir, cfg.naive_batch, cfg.naive_poll_s)
            for i in range(processes)
        ]
        try:
            now = store.now(conn)
            t0 = first_instant(now, work, work.jobs / 40_000, cfg.lead_s)
            last = t0 + timedelta(seconds=work.seconds - 1)
            cfg.echo(f"  {work.jobs:,} timers first due at {t0:%H:%M:%S}Z")
            naive.copy_jobs(
                conn,
                ((uuid.uuid4(), tenant, expr, dialect, zone, t0) for tenant, expr, dialect, zone in timers(work, t0)),
            )
            deadline = _fire_loaded(
                conn, cfg, t0, last, lambda: conn.execute(NAIVE_DUE, {"last": last}).fetchone()["due"]
            )
        finally:
            codes = {proc.worker: proc.stop() for proc in procs}
        records = [
            (r["key"], r["nominal_s"], r["fired_s"])
            for r in conn.execute(NAIVE_FIRES, {"first": t0, "last": last}).fetchall()
        ]
        return Fires(work.occurrences, _epoch(t0), deadline, records, _exit_note(codes))
    finally:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(naive.SCHEMA)))
        conn.close()


# ---------------------------------------------------------------- peers

LOAD_RATE = {"pgqueuer": 20_000.0, "procrastinate": 5_000.0, "apscheduler": 150.0}
"""Conservative occurrences (pgqueuer, procrastinate) / schedules (APScheduler) registered
per second, to choose T so that loading ends before it (measured here: pgqueuer
45k-60k/s, APScheduler 450-520/s; procrastinate's is a guess to be measured)."""
PEER_SCHEMAS = {
    "pgqueuer": peers.PGQUEUER_SCHEMA,
    "procrastinate": peers.PROCRASTINATE_SCHEMA,
    "apscheduler": peers.APSCHEDULER_SCHEMA,
}


def run_peer(cfg: Config, system: str, work: Work, processes: int) -> Fires:
    log = cfg.log_dir / f"{system}.log"
    dsn = cfg.dsn
    peers.run_step(system, ["setup", system, "--dsn", dsn], log, 120)
    try:
        registered = work.jobs if system == "apscheduler" else work.occurrences
        load_s = registered / LOAD_RATE[system]
        t0 = math.ceil(time.time() + cfg.lead_s + load_s + 3.0)  # + worker start-up
        last = t0 + work.seconds - 1
        deadline = last + cfg.bound_s
        cfg.echo(f"  {work.jobs:,} timers first due at {datetime.fromtimestamp(t0, UTC):%H:%M:%S}Z")
        load_args = [
            "load",
            system,
            "--dsn",
            dsn,
            "--jobs",
            str(work.jobs),
            "--t0",
            str(t0),
            "--seconds",
            str(work.seconds),
        ]
        workers: list[peers.PeerWorker] = []
        note = None
        try:
            if system != "apscheduler":  # workers wait on an installed, empty queue
                workers = _start_workers(cfg, system, processes, deadline)
                peers.run_step(system, load_args, log, max(60.0, 10 * load_s))
            else:  # APScheduler: a scheduler only learns of schedules present at start
                peers.run_step(system, load_args, log, max(60.0, 10 * load_s))
                workers = _start_workers(cfg, system, processes, deadline)
            if time.time() >= t0:
                note = f"loading ended {time.time() - t0:.1f}s after T (lateness includes it)"
            _wait_done(lambda: sum(w.count() for w in workers) >= work.occurrences, deadline)
        finally:
            records = []
            errors = []
            for w in workers:
                try:
                    records += w.stop()
                except RuntimeError as exc:
                    errors.append(str(exc))
            if errors:
                raise RuntimeError("; ".join(errors))
        return Fires(work.occurrences, float(t0), deadline, records, note)
    finally:
        conn = store.connect(dsn, application_name="bench-compare")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(PEER_SCHEMAS[system])))
        conn.close()


def _start_workers(cfg: Config, system: str, processes: int, deadline: float) -> list:
    workers = [
        peers.PeerWorker(
            system,
            cfg.dsn,
            cfg.log_dir / f"{system}-{i}.tsv",
            deadline,
            cfg.log_dir / f"{system}-{i}.log",
            cfg.procrastinate_concurrency if system == "procrastinate" else cfg.pgqueuer_batch,
        )
        for i in range(processes)
    ]
    try:
        wait_until(lambda: all(w.ready() for w in workers), 60, what=f"{system} workers to start")
    except (RuntimeError, TimeoutError):
        for w in workers:
            try:
                w.stop(5)
            except RuntimeError:
                pass
        raise
    return workers


# ---------------------------------------------------------------- the comparison


def _fmt(value: float | None) -> str:
    return "lost" if value is None else f"{value:.3f}s"


def run_one(cfg: Config, system: str, work: Work, processes: int) -> dict:
    """Run one (system, workload, processes); a failure becomes a row with everything lost."""
    label = f"{system} × {processes}, {work.name}"
    cfg.echo(f"{label}: {work.occurrences:,} occurrences")
    start = time.monotonic()
    try:
        if system == "ours":
            fires = run_ours(cfg, work, processes)
        elif system == "ours-e2e":
            fires = run_ours(cfg, work, 1, workers=processes)
        elif system == "naive":
            fires = run_naive(cfg, work, processes)
        else:
            fires = run_peer(cfg, system, work, processes)
    except Exception as exc:  # noqa: BLE001 - one system failing must not end the comparison
        with (cfg.log_dir / f"{system}-error.log").open("a") as log:
            log.write(traceback.format_exc())
        now = time.time()
        fires = Fires(
            work.occurrences,
            now,
            now + work.seconds - 1 + cfg.bound_s,
            [],
            note=f"did not run: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            if str(exc)
            else f"did not run: {type(exc).__name__}",
        )
    row = summarize(system, work, processes, fires, time.monotonic() - start)
    cfg.echo(
        f"{label}: fired {row['fired']:,}, lost {row['lost']:,}, "
        f"p99 {_fmt(row['lag_p99_s'])}, took {row['wall_s']}s" + (f" ({row['note']})" if row["note"] else "")
    )
    return row


def plan(
    systems: list[str],
    workloads: list[Work],
    processes: list[int],
    peer_processes: dict[str, list[int]],
    peer_jobs: dict[tuple[str, str], int],
) -> list[tuple[str, Work, int]]:
    """The runs in order: per workload, naive × 1 first (the baseline), then the rest.

    Several herd workloads (one per ``distinct_schedules``): the peers run the
    first only (one-shot timers: the schedules do not matter to them)."""
    runs = []
    herds = [w for w in workloads if w.name == "herd"]
    for work in workloads:
        for system in sorted(systems, key=SYSTEMS.index):
            if system not in ("ours", "ours-e2e", "naive") and work.name == "herd" and work is not herds[0]:
                continue  # peers hold no schedules: their herd is the same whatever K
            counts = processes if system in ("ours", "naive") else peer_processes[system]
            jobs = peer_jobs.get((system, work.name), work.jobs)
            for n in sorted(counts):
                runs.append((system, dataclasses.replace(work, jobs=jobs), n))
    return runs


def run_compare(cfg: Config, runs: list[tuple[str, Work, int]]) -> list[dict]:
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    rows = [run_one(cfg, system, work, n) for system, work, n in runs]
    add_ratios(rows)
    return rows


__all__ = [
    "COLUMNS",
    "Config",
    "SYSTEMS",
    "WORKLOADS",
    "Work",
    "plan",
    "run_compare",
    "table_rows",
    "percentile",
    "summarize",
]
