"""``python -m bench``: workloads that measure the engine on a real store."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import click

from bench import consumers, report

HERD_COLUMNS = [
    "jobs",
    "background_jobs",
    "nodes",
    "drain_s",
    "throughput_runs_per_s",
    "lag_p50_s",
    "lag_p99_s",
    "lag_max_s",
    "small_tenants_lag_p99_s",
    "big_tenant_lag_p99_s",
    "missing",
    "duplicates",
    "node_rss_mb_max",
]


def _progress():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return lambda **kw: tqdm(unit="jobs", unit_scale=True, leave=False, **kw)


class AsciiIntRange(click.IntRange):
    """``click.IntRange`` for whole numbers written in ASCII digits (``int()`` would
    also read ``٦`` as 6), at most ``max`` (default 10⁹: past it counts overflow
    the store's and the loaders' integers)."""

    def __init__(self, min: int | None = None, max: int | None = None, **kwargs) -> None:  # noqa: A002 (click's names)
        super().__init__(min=min, max=10**9 if max is None else max, **kwargs)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            self.fail(f"{value!r}: a whole number in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r}: a finite number", param, ctx)
        return number


def _int_list(text: str) -> list[int]:
    items = text.split(",")
    if not all(re.fullmatch(r"[0-9]+", item.strip()) for item in items):
        raise click.BadParameter(f"{text!r}: a comma-separated list of whole numbers in ASCII digits, none empty")
    values = [int(item) for item in items]
    if min(values) < 1:
        raise click.BadParameter(f"{text!r}: each count must be >= 1")
    return values


def _distinct_schedules(ctx, param, text: str | None) -> list[int] | None:
    return None if text is None else _int_list(text)


def _check_distinct_schedules(ks: list[int], jobs: int, jobs_option: str) -> None:
    """Each K must leave every pair a timer and be one the pair generator can make."""
    from bench.pairs import MAX_DISTINCT

    for k in ks:
        if k > min(jobs, MAX_DISTINCT):
            raise click.BadParameter(
                f"{k}: each K must be at most {jobs_option} ({jobs:,}) and {MAX_DISTINCT:,}",
                param_hint="--distinct-schedules",
            )


DISTINCT_SCHEDULES_HELP = (
    "K distinct (expression, zone) pairs due at the herd instant, skewed popularity; "
    "a comma-separated list fires one herd per K in one run (26: the bench's own herd) "
    "[default: the bench's own herd]."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Measure the trigger engine. Point --dsn / SCHEDULER_DSN at a DEDICATED database:
    every workload empties jobs, runs, skips, tenants and nodes first."""


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option(
    "--jobs",
    default=300_000,
    show_default=True,
    type=AsciiIntRange(1, 50_000_000),
    help="Jobs due at the herd instant.",
)
@click.option(
    "--background-jobs",
    default=0,
    show_default=True,
    type=AsciiIntRange(0, 100_000_000),
    help="Jobs not due (months away).",
)
@click.option(
    "--tenants", default=51, show_default=True, type=AsciiIntRange(min=1), help="One big tenant plus small ones."
)
@click.option(
    "--big-tenant-share",
    default=0.9,
    show_default=True,
    type=FiniteFloatRange(0, 1),
    help="Big tenant's share of the herd.",
)
@click.option("--nodes", default=1, show_default=True, type=AsciiIntRange(1, 64), help="Node processes.")
@click.option(
    "--max-rate", type=FiniteFloatRange(min=0, min_open=True), default=None, help="Per-node --max-rate-per-s (pacing)."
)
@click.option(
    "--distinct-schedules",
    "distinct_schedules",
    default=None,
    callback=_distinct_schedules,
    help=DISTINCT_SCHEDULES_HELP,
)
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the summary here (a list of per-herd results with --distinct-schedules).",
)
def herd(
    dsn, jobs, background_jobs, tenants, big_tenant_share, nodes, max_rate, distinct_schedules, out_dir, json_path
) -> None:
    """The midnight herd: JOBS due at one minute boundary; reports drain time, lag, RSS.

    With --distinct-schedules K1,K2,...: one herd per K, one after the other in
    one run (background loaded and nodes started once), side by side, each
    herd's drain also as a ratio to the first's."""
    from bench.herd import run_herd, run_herds

    if distinct_schedules is not None:
        _check_distinct_schedules(distinct_schedules, jobs, "--jobs")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = (dsn, jobs, background_jobs, tenants, big_tenant_share, nodes, out_dir)
    if distinct_schedules is None:
        results = [run_herd(*args, max_rate=max_rate, progress=_progress())]
        value = dataclasses.asdict(results[0])
        columns = HERD_COLUMNS
    else:
        results = run_herds(*args, distinct_schedules, max_rate=max_rate, progress=_progress())
        value = [dataclasses.asdict(r) for r in results]
        columns = ["distinct_schedules", *HERD_COLUMNS]
        columns.insert(columns.index("drain_s") + 1, "drain_vs_first")
    click.echo(report.markdown_table([dataclasses.asdict(r) for r in results], columns))
    if json_path:
        json_path.write_text(json.dumps(value, indent=2) + "\n")
    if any(r.missing or r.duplicates for r in results):
        sys.exit(1)


STEADY_COLUMNS = [
    "rate",
    "jobs",
    "nodes",
    "seconds",
    "runs",
    "throughput_runs_per_s",
    "lag_p50_s",
    "lag_p99_s",
    "lag_max_s",
    "missing",
    "duplicates",
    "node_rss_mb_max",
]


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option("--rate", default=12_000, show_default=True, type=AsciiIntRange(min=1), help="Runs due per second.")
@click.option(
    "--seconds",
    default=60,
    show_default=True,
    type=AsciiIntRange(min=11),
    help="How long the nodes fire (the first and last 5 s are left out).",
)
@click.option(
    "--period-s",
    default=10,
    show_default=True,
    type=AsciiIntRange(min=1),
    help="Interval of each job (jobs = rate × period).",
)
@click.option("--nodes", default=1, show_default=True, type=AsciiIntRange(1, 64))
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def steady(dsn, rate, seconds, period_s, nodes, out_dir, json_path) -> None:
    """Sustained RATE runs/s for SECONDS; reports lateness percentiles and the audit."""
    from bench.steady import run_steady

    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_steady(dsn, rate, seconds, nodes, out_dir, period_s=period_s, progress=_progress())
    row = dataclasses.asdict(result)
    click.echo(report.markdown_table([row], STEADY_COLUMNS))
    if json_path:
        json_path.write_text(json.dumps(row, indent=2) + "\n")
    if result.missing or result.duplicates:
        sys.exit(1)


FAILOVER_COLUMNS = [
    "coordinator",
    "kind",
    "trials",
    "affected_runs",
    "lateness_p50_s",
    "lateness_p99_s",
    "lateness_max_s",
    "reown_s",
    "detect_s",
    "missing",
    "duplicates",
    "coordination_writes_per_s",
    "store_transactions_per_s",
    "etcd_requests_per_s",
]


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option(
    "--coordinator",
    type=click.Choice(["sql", "etcd", "both"]),
    default="sql",
    show_default=True,
    help="Coordinator(s) to measure; 'both' runs sql, then etcd.",
)
@click.option(
    "--etcd-endpoints",
    default=None,
    envvar="SCHEDULER_ETCD_ENDPOINTS",
    show_envvar=True,
    help="etcd host:port[,host:port] for the etcd runs [default: start a throwaway etcd].",
)
@click.option("--kind", type=click.Choice(["crash", "graceful", "both"]), default="both", show_default=True)
@click.option(
    "--nodes",
    default=3,
    show_default=True,
    type=AsciiIntRange(2, 64),
    help="Node processes (one is killed or stopped, so at least 2).",
)
@click.option(
    "--jobs", default=600, show_default=True, type=AsciiIntRange(min=1), help="Interval jobs firing every second."
)
@click.option("--trials", default=1, show_default=True, type=AsciiIntRange(min=1))
@click.option(
    "--poll-interval-s",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Nodes' --poll-interval-s [default: the node default, 1 s].",
)
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help='Write {"sql": {"crash": {...}, "graceful": {...}}, "etcd": {...}} here.',
)
def failover(dsn, coordinator, etcd_endpoints, kind, nodes, jobs, trials, poll_interval_s, out_dir, json_path) -> None:
    """Kill (crash) or stop (graceful) one of NODES nodes while jobs fire every second, per coordinator."""
    from bench.failover import run_comparison

    out_dir.mkdir(parents=True, exist_ok=True)
    coordinators = ["sql", "etcd"] if coordinator == "both" else [coordinator]
    kinds = ["crash", "graceful"] if kind == "both" else [kind]
    node_args = ("--poll-interval-s", str(poll_interval_s)) if poll_interval_s is not None else ()
    results = run_comparison(
        dsn, coordinators, kinds, nodes, jobs, trials, out_dir, etcd_endpoints=etcd_endpoints, node_args=node_args
    )
    summary = {c: {k: dataclasses.asdict(r) for k, r in by_kind.items()} for c, by_kind in results.items()}
    rows = [{"coordinator": c, **r} for c, by_kind in summary.items() for r in by_kind.values()]
    click.echo(report.markdown_table(rows, FAILOVER_COLUMNS))
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    if any(r["missing"] or r["duplicates"] for r in rows):
        sys.exit(1)


@cli.command()
@click.option(
    "--replication",
    type=click.Choice(["sync", "async", "both"]),
    default="both",
    show_default=True,
    help="The pair's replication; 'both' runs sync, then async.",
)
@click.option("--nodes", default=2, show_default=True, type=AsciiIntRange(1, 16), help="Node processes.")
@click.option(
    "--jobs", default=200, show_default=True, type=AsciiIntRange(min=1), help="Interval jobs firing every second."
)
@click.option(
    "--lag-s",
    default=3.0,
    show_default=True,
    type=FiniteFloatRange(0, 60),
    help="Async: the primary's WAL sender is paused this long before the kill: the standby lags (0: no lag).",
)
@click.option("--trials", default=1, show_default=True, type=AsciiIntRange(1, 20), help="Kills per replication mode.")
@click.option(
    "--lease-ttl-s",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Nodes' --lease-ttl-s, above their 3 s renew interval [default: the node default, 10 s].",
)
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the rows here.")
def storefailover(replication, nodes, jobs, lag_s, trials, lease_ttl_s, out_dir, json_path) -> None:
    """Kill the primary of a throwaway Patroni pair (etcd DCS, PostgreSQL on loopback) under
    firing nodes: promotion, first write, runs resumed, lateness, missing/duplicate, and
    (async, the standby lagging) runs that vanished with the old primary and fired again.
    Needs no --dsn: it starts its own etcd and Patroni pair (patroni, PostgreSQL server
    binaries; as root, a 'postgres' user)."""
    from bench.storefailover import COLUMNS, as_rows, run_storefailovers

    out_dir.mkdir(parents=True, exist_ok=True)
    modes = ["sync", "async"] if replication == "both" else [replication]
    node_args = ("--lease-ttl-s", str(lease_ttl_s)) if lease_ttl_s is not None else ()
    results = run_storefailovers(
        modes,
        nodes,
        jobs,
        lag_s,
        trials,
        out_dir / "storefailover",
        node_args,
        echo=lambda line: click.echo(line, err=True),
    )
    rows = as_rows(results)
    click.echo(report.markdown_table(rows, COLUMNS))
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2) + "\n")
    if any(r["missing"] or r["duplicates"] for r in rows):
        sys.exit(1)


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option("--mode", type=click.Choice(["pull", "push"]), default="pull", show_default=True)
@click.option("--workload", type=click.Choice(["herd", "steady"]), default="herd", show_default=True)
@click.option("--jobs", default=300_000, show_default=True, type=AsciiIntRange(1, 50_000_000), help="Herd: jobs due.")
@click.option(
    "--background-jobs", default=0, show_default=True, type=AsciiIntRange(0, 100_000_000), help="Herd: jobs not due."
)
@click.option("--tenants", default=51, show_default=True, type=AsciiIntRange(min=1), help="Herd: big + small ones.")
@click.option("--big-tenant-share", default=0.9, show_default=True, type=FiniteFloatRange(0, 1))
@click.option("--rate", default=12_000, show_default=True, type=AsciiIntRange(min=1), help="Steady: runs due per s.")
@click.option(
    "--seconds",
    default=60,
    show_default=True,
    type=AsciiIntRange(min=11),
    help="Steady: how long the nodes fire (the first and last 5 s are left out).",
)
@click.option("--period-s", default=10, show_default=True, type=AsciiIntRange(min=1), help="Steady: job interval.")
@click.option("--nodes", default=1, show_default=True, type=AsciiIntRange(1, 64), help="Node processes.")
@click.option(
    "--workers",
    default=None,
    type=AsciiIntRange(0, 256),
    help="Pull: worker processes; 0 = firing only (no worker) [default: 4 for pull, 0 for push].",
)
@click.option(
    "--worker-impl",
    type=click.Choice(["scheduler", "bench"]),
    default="scheduler",
    show_default=True,
    help="Pull: --workers processes over every tenant, each a `scheduler worker` or the bench's own loop "
    "(the store's share without the worker's machinery).",
)
@click.option(
    "--via-api",
    is_flag=True,
    help="Pull: the workers claim and ack over the tenant HTTP API (`scheduler worker --api-url`, a worker key "
    "per tenant) of a `scheduler api` process the bench starts; each serves one tenant, so --workers must be at "
    "least the tenants.",
)
@click.option(
    "--steady-tenants",
    default=10,
    show_default=True,
    type=AsciiIntRange(1, 1000),
    help="Steady: tenants the jobs are spread over.",
)
@click.option(
    "--batch", default=1000, show_default=True, type=AsciiIntRange(1, 1000), help="Pull: runs per claim and ack."
)
@click.option(
    "--lead-s", default=15.0, show_default=True, type=FiniteFloatRange(min=0), help="Herd: slack between load and T."
)
@click.option(
    "--deliver-timeout-s",
    default=300.0,
    show_default=True,
    type=FiniteFloatRange(min=0),
    help="After firing: wait this long for delivery; runs still on their way then count as lost.",
)
@click.option(
    "--put-rate",
    default=0.0,
    show_default=True,
    type=FiniteFloatRange(min=0, max=1000),
    help="Herd: also PUT this many new schedules a second through the tenant API (an API process of its own, "
    "a small tenant's key) from the herd's instant until it is fired, and report the PUT latency "
    "(the API target: p99 <= 50 ms while a herd fires). 0: off.",
)
@click.option(
    "--push-concurrency",
    default=consumers.PUSH_CONCURRENCY,
    show_default=True,
    type=AsciiIntRange(1, 10_000),
    help="Push: each node's push_concurrency (attempts in flight; the engine's default is 64).",
)
@click.option(
    "--push-per-host",
    default=consumers.PUSH_PER_HOST,
    show_default=True,
    type=AsciiIntRange(1, 10_000),
    help="Push: each node's push_per_host (attempts in flight to the one receiver; the engine's default is 8).",
)
@click.option(
    "--receiver",
    type=click.Choice(consumers.RECEIVERS),
    default="raw",
    show_default=True,
    help="Push: the local receiver, a minimal HTTP/1.1 server (raw, ~70 µs of CPU per request) or "
    "aiohttp's (~160 µs): on a shared machine its CPU is taken from the node's.",
)
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def deliver(
    dsn,
    mode,
    workload,
    jobs,
    background_jobs,
    tenants,
    big_tenant_share,
    rate,
    seconds,
    period_s,
    nodes,
    workers,
    worker_impl,
    via_api,
    steady_tenants,
    batch,
    lead_s,
    deliver_timeout_s,
    put_rate,
    push_concurrency,
    push_per_host,
    receiver,
    out_dir,
    json_path,
) -> None:
    """The herd or steady workload fired by real nodes AND delivered: pulled by WORKERS
    processes that ack at once, or pushed to a local HTTP receiver. Reports dispatch
    and ack lag, throughput, attempts, duplicates and lost runs from the runs table;
    --workers 0 checks firing alone leaves every run pending."""
    from bench.deliver import COLUMNS, FIRING_ONLY_COLUMNS, Options, run_deliver

    if workers is None:
        workers = 4 if mode == "pull" else 0
    if mode == "push" and workers:
        raise click.BadParameter("push mode delivers from the nodes: no workers", param_hint="--workers")
    if mode == "pull":
        context = click.get_current_context()
        for name in ("receiver", "push_concurrency", "push_per_host"):
            if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                flag = "--" + name.replace("_", "-")
                raise click.BadParameter("a push option: give it with --mode push", param_hint=f"'{flag}'")
    opts = Options(
        mode=mode,
        workload=workload,
        jobs=jobs,
        background_jobs=background_jobs,
        tenants=tenants,
        big_share=big_tenant_share,
        rate=rate,
        seconds=seconds,
        period_s=period_s,
        nodes=nodes,
        workers=workers,
        worker_impl=worker_impl,
        via_api=via_api,
        steady_tenants=steady_tenants,
        batch=batch,
        lead_s=lead_s,
        deliver_timeout_s=deliver_timeout_s,
        put_rate=put_rate,
        push_concurrency=push_concurrency,
        push_per_host=push_per_host,
        receiver=receiver,
    )
    try:
        opts.check()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_deliver(dsn, opts, out_dir, progress=_progress())
    row = dataclasses.asdict(result)
    firing_only = mode == "pull" and not workers
    click.echo(report.markdown_table([row], FIRING_ONLY_COLUMNS if firing_only else COLUMNS))
    click.echo(f"attempts: {row['attempts']}  states: {row['states']}")
    if result.cpu_s is not None and result.cpu_window_s is not None:
        from bench.cpu import describe

        click.echo(describe(result.cpu_s, result.cpu_window_s, result.runs))
    if result.machine is not None:
        from bench.calibrate import Calibration
        from bench.calibrate import describe as describe_machine

        click.echo(describe_machine(Calibration(**result.machine)))
    if row["put"] is not None:
        click.echo(f"PUT /v1/schedules while the herd fired (ms): {row['put']}")
    if json_path:
        json_path.write_text(json.dumps(row, indent=2) + "\n")
    failed = result.missing or result.duplicates or result.without_delivery_state
    if firing_only:
        failed = failed or result.pending != result.runs
    else:
        failed = failed or result.lost
    if failed:
        sys.exit(1)


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option("--times", default=1, show_default=True, type=AsciiIntRange(1, 100), help="Calibrations, one line each.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (milliseconds).")
def calibrate(dsn, times, as_json) -> None:
    """Time fixed work on this machine and its store (bench/calibrate.py): a pure-Python
    loop, a store scan, store inserts; the best of 3 each, milliseconds, lower is faster.
    `bench deliver` takes the same before each run: compare two days' figures only
    alongside theirs. Leaves nothing in the store."""
    from bench.calibrate import calibrate as measure
    from bench.calibrate import describe as describe_machine

    for _ in range(times):
        machine = measure(dsn)
        click.echo(json.dumps(dataclasses.asdict(machine)) if as_json else describe_machine(machine))


def _name_list(choices):
    def parse(ctx, param, text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        unknown = sorted(set(names) - set(choices))
        if unknown or not names:
            raise click.BadParameter(f"{', '.join(unknown) or text!r}: choose from {', '.join(choices)}")
        return names

    return parse


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option(
    "--systems",
    default="naive,ours,ours-e2e,pgqueuer,procrastinate,apscheduler",
    show_default=True,
    callback=_name_list(("naive", "ours", "ours-e2e", "pgqueuer", "procrastinate", "apscheduler")),
    help="Systems to run (naive × 1 is the baseline of the ratios).",
)
@click.option("--workloads", default="herd,steady", show_default=True, callback=_name_list(("herd", "steady")))
@click.option("--processes", default="1,4", show_default=True, help="Node / worker processes of ours and naive.")
@click.option("--e2e-workers", default="1,4", show_default=True, help="Worker processes of ours-e2e (one node).")
@click.option(
    "--e2e-worker-impl",
    type=click.Choice(["scheduler", "bench"]),
    default="scheduler",
    show_default=True,
    help="ours-e2e's workers: as `deliver --worker-impl`.",
)
@click.option("--pgqueuer-processes", default="1", show_default=True, help="pgqueuer worker processes.")
@click.option("--procrastinate-processes", default="1", show_default=True, help="procrastinate worker processes.")
@click.option(
    "--herd-jobs", default=100_000, show_default=True, type=AsciiIntRange(min=1), help="Herd size of ours and naive."
)
@click.option("--herd-jobs-pgqueuer", default=100_000, show_default=True, type=AsciiIntRange(min=1))
@click.option("--herd-jobs-procrastinate", default=20_000, show_default=True, type=AsciiIntRange(min=1))
@click.option("--herd-jobs-apscheduler", default=2_000, show_default=True, type=AsciiIntRange(min=1))
@click.option(
    "--steady-rate", default=1_000, show_default=True, type=AsciiIntRange(min=1), help="Timers each due every second."
)
@click.option("--steady-rate-apscheduler", type=AsciiIntRange(min=1), default=None, help="[default: --steady-rate]")
@click.option(
    "--steady-seconds", default=30, show_default=True, type=AsciiIntRange(min=1), help="Seconds of the steady window."
)
@click.option(
    "--bound-s",
    default=60.0,
    show_default=True,
    type=FiniteFloatRange(min=0, min_open=True),
    help="Not fired this long after the last nominal instant = lost.",
)
@click.option(
    "--lead-s", default=5.0, show_default=True, type=FiniteFloatRange(min=0), help="Slack between loading and T."
)
@click.option(
    "--naive-batch",
    default=1_000,
    show_default=True,
    type=AsciiIntRange(min=1),
    help="Due rows per naive transaction.",
)
@click.option(
    "--pgqueuer-batch", default=100, show_default=True, type=AsciiIntRange(min=1), help="pgqueuer dequeue batch size."
)
@click.option(
    "--procrastinate-concurrency",
    default=100,
    show_default=True,
    type=AsciiIntRange(min=1),
    help="procrastinate worker concurrency.",
)
@click.option(
    "--distinct-schedules",
    "distinct_schedules",
    default=None,
    callback=_distinct_schedules,
    help="Herd of ours and naive: " + DISTINCT_SCHEDULES_HELP + " Peers run the first K's herd only.",
)
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the rows here.")
def compare(
    dsn,
    systems,
    workloads,
    processes,
    e2e_workers,
    e2e_worker_impl,
    pgqueuer_processes,
    procrastinate_processes,
    herd_jobs,
    herd_jobs_pgqueuer,
    herd_jobs_procrastinate,
    herd_jobs_apscheduler,
    steady_rate,
    steady_rate_apscheduler,
    steady_seconds,
    bound_s,
    lead_s,
    naive_batch,
    pgqueuer_batch,
    procrastinate_concurrency,
    distinct_schedules,
    out_dir,
    json_path,
) -> None:
    """The same herd and steady work against ours, the naive SKIP LOCKED loop, pgqueuer,
    procrastinate and APScheduler 4, one after the other; each as a ratio to the naive
    loop (1 process). ours-e2e adds workers to ours: timer due -> handed to a worker,
    beside the peers' handlers (ratios to ours-e2e)."""
    import time

    from bench.compare import COLUMNS, Config, Work, plan, run_compare, table_rows

    if distinct_schedules:
        _check_distinct_schedules(distinct_schedules, herd_jobs, "--herd-jobs")
    out_dir.mkdir(parents=True, exist_ok=True)
    herds = [Work("herd", herd_jobs, distinct_schedules=k) for k in distinct_schedules or [None]]
    works = {"herd": herds, "steady": [Work("steady", steady_rate, steady_seconds)]}
    runs = plan(
        systems,
        [work for w in workloads for work in works[w]],
        _int_list(processes),
        {
            "ours-e2e": _int_list(e2e_workers),
            "pgqueuer": _int_list(pgqueuer_processes),
            "procrastinate": _int_list(procrastinate_processes),
            "apscheduler": [1],
        },
        {
            ("pgqueuer", "herd"): herd_jobs_pgqueuer,
            ("procrastinate", "herd"): herd_jobs_procrastinate,
            ("apscheduler", "herd"): herd_jobs_apscheduler,
            ("apscheduler", "steady"): steady_rate_apscheduler or steady_rate,
        },
    )
    cfg = Config(
        dsn,
        out_dir,
        bound_s=bound_s,
        lead_s=lead_s,
        naive_batch=naive_batch,
        pgqueuer_batch=pgqueuer_batch,
        procrastinate_concurrency=procrastinate_concurrency,
        worker_impl=e2e_worker_impl,
        echo=lambda line: click.echo(line, err=True),
    )
    start = time.monotonic()
    rows = run_compare(cfg, runs)
    columns = COLUMNS
    if distinct_schedules:
        columns = [*COLUMNS[:2], "distinct_schedules", *COLUMNS[2:]]
    click.echo(report.markdown_table(table_rows(rows), columns))
    click.echo(f"\n{len(rows)} runs in {time.monotonic() - start:.0f}s", err=True)
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2) + "\n")


def main() -> None:
    """Run the CLI. SIGTERM stops like Ctrl-C (node processes are stopped on
    the way out); the engine's own errors and timeouts print as one line."""
    import signal

    import psycopg

    from scheduler import log as logmod
    from scheduler.errors import SchedulerError

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (SchedulerError, TimeoutError) as exc:
        click.echo(f"bench: error: {exc}", err=True)
        sys.exit(1)
    except psycopg.OperationalError as exc:  # the store unreachable, gone or cancelling: one line
        first = " ".join(str(exc).split())
        click.echo(logmod.redact(f"bench: error: store: {first}"), err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
