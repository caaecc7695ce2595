"""``python -m bench``: workloads that measure the engine on a real store."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from bench import report

HERD_COLUMNS = ["jobs", "background_jobs", "nodes", "drain_s", "throughput_runs_per_s", "lag_p50_s",
                "lag_p99_s", "lag_max_s", "small_tenants_lag_p99_s", "big_tenant_lag_p99_s",
                "missing", "duplicates", "node_rss_mb_max"]


def _progress():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return lambda **kw: tqdm(unit="jobs", unit_scale=True, leave=False, **kw)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Measure the trigger engine. Point --dsn / SCHEDULER_DSN at a DEDICATED database:
    every workload empties jobs, runs, skips, tenants and nodes first."""


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option("--jobs", default=300_000, show_default=True, help="Jobs due at the herd instant.")
@click.option("--background-jobs", default=0, show_default=True, help="Jobs not due (months away).")
@click.option("--tenants", default=51, show_default=True, help="One big tenant plus small ones.")
@click.option("--big-tenant-share", default=0.9, show_default=True, help="Big tenant's share of the herd.")
@click.option("--nodes", default=1, show_default=True, help="Node processes.")
@click.option("--max-rate", type=float, default=None, help="Per-node --max-rate-per-s (pacing).")
@click.option("--out-dir", type=click.Path(path_type=Path), default=Path("bench/results"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the summary here.")
def herd(dsn, jobs, background_jobs, tenants, big_tenant_share, nodes, max_rate, out_dir, json_path) -> None:
    """The midnight herd: JOBS due at one minute boundary; reports drain time, lag, RSS."""
    from bench.herd import run_herd

    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_herd(dsn, jobs, background_jobs, tenants, big_tenant_share, nodes, out_dir,
                      max_rate=max_rate, progress=_progress())
    row = dataclasses.asdict(result)
    click.echo(report.markdown_table([row], HERD_COLUMNS))
    if json_path:
        json_path.write_text(json.dumps(row, indent=2) + "\n")
    if result.missing or result.duplicates:
        sys.exit(1)


STEADY_COLUMNS = ["rate", "jobs", "nodes", "seconds", "runs", "throughput_runs_per_s", "lag_p50_s",
                  "lag_p99_s", "lag_max_s", "missing", "duplicates", "node_rss_mb_max"]


@cli.command()
@click.option("--dsn", envvar="SCHEDULER_DSN", show_envvar=True, required=True)
@click.option("--rate", default=12_000, show_default=True, help="Runs due per second.")
@click.option("--seconds", default=60, show_default=True, help="How long the nodes fire.")
@click.option("--period-s", default=10, show_default=True, help="Interval of each job (jobs = rate × period).")
@click.option("--nodes", default=1, show_default=True)
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


if __name__ == "__main__":
    cli()
