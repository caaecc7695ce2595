"""``scheduler demo``: the whole engine on a private PostgreSQL, end to end.

1. start a private PostgreSQL (:mod:`scheduler.devtools.embedded`) unless a DSN is given;
2. migrate it to head;
3. import the real corpus (``scheduler/data/cron-corpus.csv``, 1,500 cron
   schedules from public repositories, malformed lines included: they are
   reported, not fatal) for tenant ``corpus``;
4. add short-interval jobs so something fires every second (tenants
   ``demo-fast`` and ``demo-slow``, interval, seconds-dialect cron and
   one-shot jobs);
5. run one node in-process for ``seconds`` with a live view (elapsed, runs
   fired, lag of the last second);
6. stop it gracefully and audit the window with :func:`scheduler.audit.verify`:
   every due (job, nominal time) must have exactly one run.

The audit window starts when the node starts and ends
:data:`SETTLE_S` before it stops, so every slot in it had a tick to fire in.
Returns the exit status: 0 when nothing is missing, duplicated or unexpected.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from datetime import timedelta
from importlib import resources
from pathlib import Path

import click

from scheduler import jobs, store
from scheduler.audit import verify
from scheduler.errors import ConfigError
from scheduler.migrate import upgrade
from scheduler.node import Node
from scheduler.schedule import format_instant
from scheduler.settings import Settings
from scheduler.spec import JobSpec

SETTLE_S = 1.5
"""The audit window ends this long before the node stops."""


def corpus_path() -> Path:
    """The project's copy of the real cron corpus."""
    return Path(str(resources.files("scheduler").joinpath("data/cron-corpus.csv")))


def _demo_specs(now) -> list[JobSpec]:
    specs = []
    for i in range(40):
        specs.append(JobSpec.build(tenant="demo-fast", interval_s=1, name=f"every-second-{i}"))
    for i in range(20):
        specs.append(JobSpec.build(tenant="demo-fast", interval_s=2 + i % 4, name=f"interval-{i}"))
    for i in range(10):
        specs.append(
            JobSpec.build(
                tenant="demo-slow",
                cron=f"*/{2 + i % 5} * * * * *",
                dialect="seconds",
                tz="Europe/Berlin",
                name=f"seconds-cron-{i}",
                jitter_s=1 if i % 2 else 0,
            )
        )
    for i in range(5):
        specs.append(JobSpec.build(tenant="demo-slow", at=now + timedelta(seconds=5 + 3 * i), name=f"one-shot-{i}"))
    return specs


def run_demo(seconds: int, dsn: str | None = None, out=None) -> int:
    """Run the demo for ``seconds`` (≥ 5); see the module doc. Returns the exit status.

    Raises :class:`~scheduler.errors.StoreError` if no PostgreSQL can be
    started or reached.
    """
    echo = (lambda text: click.echo(text, file=out)) if out is not None else click.echo
    with ExitStack() as stack:
        if dsn is None:
            from scheduler.devtools.embedded import start_private_postgres

            echo("starting a private PostgreSQL ...")
            pg = stack.enter_context(start_private_postgres(dbname="scheduler_demo"))
            dsn = pg.dsn
            echo(f"  PostgreSQL from {pg.source} binaries on 127.0.0.1:{pg.port} (removed on exit)")
        echo("migrating the schema ...")
        upgrade(dsn)
        conn = stack.enter_context(store.connect(dsn, application_name="scheduler-demo"))
        existing = store.execute(conn, "count_jobs")[0]["n"]
        if existing:
            raise ConfigError(
                f"dsn: the demo needs an empty database, and {store.redact_dsn(dsn)} already "
                f"holds {existing} jobs (they would keep firing with the demo's); "
                "use a disposable database or no --dsn"
            )

        report = jobs.import_csv(conn, corpus_path(), "corpus")
        echo(
            f"imported {len(report.imported)} cron jobs from the real corpus, "
            f"rejected {len(report.rejected)} lines, e.g.:"
        )
        for line, expr, reason in report.rejected[:5]:
            echo(f"  line {line}: {expr!r}: {reason}")
        now = store.now(conn)
        specs = _demo_specs(now)
        for spec in specs:
            jobs.add_job(conn, spec)
        echo(f"added {len(specs)} short-interval jobs (tenants demo-fast, demo-slow)")

        node = Node(Settings(dsn=dsn, node_id="demo-node"))
        since = store.now(conn)
        node.start()
        try:
            _live_view(conn, node, seconds, echo)
        finally:
            node.stop()
            node.join()
        stopped = store.now(conn)
        until = (stopped - timedelta(seconds=SETTLE_S)).replace(microsecond=0)
        result = verify(conn, since, until)
        fired = int(node.metrics.value("scheduler_firing_runs_fired_total"))
        echo("")
        echo(f"window: {format_instant(since)} .. {format_instant(until)} (audited)")
        echo(f"runs fired: {fired}")
        echo(f"runs in window: {result.runs} of {result.expected} expected")
        echo(
            "lag p50/p99/max: "
            + "/".join(
                "-" if v is None else f"{v:.3f}s"
                for v in (result.lateness_p50_s, result.lateness_p99_s, result.lateness_max_s)
            )
        )
        echo(f"missing: {result.missing}")
        echo(f"duplicates: {result.duplicates}")
        echo(f"unexpected: {result.unexpected}")
        return 0 if result.ok else 1


def _live_view(conn, node: Node, seconds: int, echo) -> None:
    """Print progress once a second (one updating line on a terminal)."""
    tty = sys.stdout.isatty()
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        time.sleep(min(1.0, seconds - elapsed))
        row = store.execute(conn, "recent_lag", {"window_s": 1.0})[0]
        fired = int(node.metrics.value("scheduler_firing_runs_fired_total"))
        owned = int(node.metrics.value("scheduler_lease_partitions_owned"))
        p99 = "-" if row["p99_s"] is None else f"{row['p99_s']:.3f}s"
        line = (
            f"[{min(seconds, int(time.monotonic() - started)):>4}/{seconds}s] partitions {owned}  "
            f"runs fired {fired:>7}  last second: {row['runs']:>4} runs, lag p99 {p99}"
        )
        if tty:
            click.echo("\r" + line, nl=False)
        elif int(time.monotonic() - started) % 5 == 0 or time.monotonic() - started >= seconds:
            echo(line)
    if tty:
        click.echo("")
