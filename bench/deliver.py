"""``bench deliver``: the herd and steady workloads fired *and delivered*.

The jobs are loaded and fired exactly as ``bench herd`` / ``bench steady`` do
(:class:`bench.herd.Herd`, :func:`bench.steady.load_steady`, real ``scheduler
node`` processes); then each run is handed over:

* ``pull``: workers claim the runs of every tenant's ``default`` queue and
  ack them with no work in between (:func:`bench.consumers.start_workers`):
  ``workers`` processes, each over every tenant: the engine's own
  ``scheduler worker`` or the bench's loop
  (``worker_impl``, see :mod:`bench.consumers`). ``workers = 0`` is the
  *firing only* variant: no worker runs, and the report checks that every
  fired run has its delivery state (``pending``);
* ``pull`` with ``via_api``: the same ``scheduler worker`` processes, but
  over the tenant HTTP API (``--api-url``, a worker key per tenant, no DSN
  in their environment) of one ``scheduler api`` process the bench starts
  (:class:`ApiProcess`); an HTTP worker serves its key's tenant only, so
  ``workers`` must be at least the tenants (round robin over them);
* ``push``: the jobs are given an HTTP target (``queue`` NULL, a
  ``job_delivery`` row with ``http://127.0.0.1:PORT/run``) and the nodes,
  started with ``SCHEDULER_PUSH_ALLOW=127.0.0.1/32``, POST each run to a local
  receiver process (:class:`bench.consumers.ReceiverProcess`) that records
  each request's ``Idempotency-Key`` and answers 204.

The runs measured: herd, those of its instant T; steady, those of the
nominal times of the window :func:`bench.steady.steady_window` keeps. After
firing, the bench waits (at most ``deliver_timeout_s``) until none of them is
``pending``, ``leased`` or ``failed`` any more, then stops workers, nodes and
receiver and reads the **runs table** (:func:`summarize`): every figure of
the delivery side comes from the store, never from a worker's memory, so a
worker that crashed cannot hide a loss. The firing side is audited by
:func:`scheduler.audit.verify` (``missing``, ``duplicates``) as in the other
workloads.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import socket
import time
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench import queries
from bench.calibrate import calibrate
from bench.consumers import (
    BATCH,
    PUSH_CONCURRENCY,
    PUSH_PER_HOST,
    RECEIVERS,
    ReceiverProcess,
    WorkerProcess,
    check_impl,
    receiver_duplicates,
    start_api_workers,
    start_workers,
)
from bench.cpu import CpuMeter, store_backends
from bench.herd import Herd, load_background
from bench.load import reset_store, start_node, wait_until
from bench.pairs import DEFAULT_SEED
from bench.process import NodeProcess
from bench.putprobe import PutProbe
from bench.report import percentile
from bench.steady import load_steady, steady_window, tenant_names
from scheduler import store
from scheduler.audit import verify
from scheduler.delivery import lifecycle

MODES = ("pull", "push")
CPU_SAMPLE_S = 1.0
"""How often the CPU meter reads every process during the window (a session closed
inside it keeps its CPU up to the last reading; one ``pg_stat_activity`` read each)."""
WORKLOADS = ("herd", "steady")
BIG_TENANT = "big"
PUSH_ALLOW = "127.0.0.1/32"
"""The nodes' ``push_allow``: the receiver listens on loopback, refused by default."""
QUEUE = "default"
PUT_TENANT = "bench-put"
"""The tenant of ``--put-rate``'s schedules: a tenant of its own, with the default quota."""

COLUMNS = [
    "mode",
    "workload",
    "workers",
    "runs",
    "succeeded",
    "lost",
    "missing",
    "duplicates",
    "redelivered",
    "receiver_duplicates",
    "throughput_runs_per_s",
    "dispatch_p50_s",
    "dispatch_p99_s",
    "dispatch_max_s",
    "small_tenants_dispatch_p99_s",
    "ack_p50_s",
    "ack_p99_s",
    "ack_max_s",
    "last_ack_s",
    "fire_lag_p99_s",
]
FIRING_ONLY_COLUMNS = ["workload", "runs", "pending", "without_delivery_state", "missing", "duplicates", "drain_s"]


@dataclasses.dataclass
class DeliverResult:
    """One ``bench deliver`` run (seconds; lags from ``scheduled_at``, see :func:`summarize`).

    Firing side: ``missing``/``duplicates``/``unexpected`` from
    :func:`scheduler.audit.verify`, ``fire_lag_p99_s`` (``fired_at`` −
    scheduled) and, for a herd, ``drain_s`` (T to the last ``fired_at``).
    Delivery side (the runs table after the run): ``runs`` fired, ``states``
    (state → runs; ``"none"`` for a run without delivery state),
    ``succeeded``, ``lost`` (fired, not succeeded when the bench gave up
    waiting), ``attempts`` (attempts started → runs), ``redelivered`` (runs
    with more than one attempt), dispatch and ack lag percentiles,
    ``last_ack_s`` (herd: T to the last ack), ``throughput_runs_per_s``
    (succeeded per second: herd, over T to the last ack; steady, over the
    window). Push: ``receiver_requests`` and ``receiver_duplicates``
    (requests beyond the first per ``Idempotency-Key``). Firing only
    (``workers`` 0): ``pending`` and ``without_delivery_state``. ``put``
    (``--put-rate``): the :class:`bench.putprobe.PutFigures` of the schedule
    writes sent through the API while the herd fired, else None. ``cpu_s``:
    CPU seconds per part (:mod:`bench.cpu`) over ``cpu_window_s``, from the
    herd's instant (steady: the window's start) until every run was
    delivered (firing only: fired), as the bench noticed it (it polls
    every 0.25 s for delivery, every 2 s for a herd's drain). ``machine``:
    the :class:`bench.calibrate.Calibration` taken before the run (fixed
    work, ms): how fast the machine was, to compare runs of different days.
    """

    mode: str
    workload: str
    jobs: int
    background_jobs: int
    rate: int | None
    seconds: int | None
    nodes: int
    workers: int
    worker_impl: str | None
    worker_processes: int
    since: str
    until: str
    delivered_wait_s: float
    runs: int
    states: dict[str, int]
    succeeded: int
    lost: int
    pending: int
    without_delivery_state: int
    attempts: dict[str, int]
    redelivered: int
    missing: int
    duplicates: int
    unexpected: int
    throughput_runs_per_s: float | None
    dispatch_p50_s: float | None
    dispatch_p99_s: float | None
    dispatch_max_s: float | None
    small_tenants_dispatch_p50_s: float | None
    small_tenants_dispatch_p99_s: float | None
    ack_p50_s: float | None
    ack_p99_s: float | None
    ack_max_s: float | None
    last_ack_s: float | None
    fire_lag_p99_s: float | None
    drain_s: float | None
    receiver: str | None
    receiver_requests: int | None
    receiver_duplicates: int | None
    node_rss_mb_max: float | None
    put: dict[str, Any] | None = None
    cpu_s: dict[str, float] | None = None
    cpu_window_s: float | None = None
    machine: dict[str, float] | None = None


# ---------------------------------------------------------------- report math


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def _lags(values: Sequence[float | None]) -> list[float]:
    """Sorted lags, ``inf`` for each run that never got there (so a percentile never
    improves by losing a run; one that falls on it is reported as None)."""
    return sorted(math.inf if v is None else v for v in values)


def _figures(lags: list[float], prefix: str) -> dict[str, float | None]:
    return {
        f"{prefix}_p50_s": _finite(percentile(lags, 0.50)),
        f"{prefix}_p99_s": _finite(percentile(lags, 0.99)),
        f"{prefix}_max_s": _finite(lags[-1]) if lags else None,
    }


def summarize(
    rows: Sequence[dict[str, Any]], *, instant_s: float | None = None, window_s: float | None = None
) -> dict[str, Any]:
    """The delivery figures of the measured runs (rows of the ``delivery_rows`` bench query:
    ``tenant``, ``state``, ``attempt``, ``dispatch_s``, ``ack_s``, ``finished_s``).

    ``dispatch`` lag is ``first_claimed_at − scheduled_at`` (``inf`` if never
    claimed), ``ack`` lag ``finished_at − scheduled_at`` of a succeeded run
    (``inf`` otherwise: a dead or unfinished run is never acked); percentiles
    are ``percentile_cont``'s, None when they fall on an ``inf``. Herd
    (``instant_s``, T in epoch s): ``small_tenants_*`` over the tenants but
    ``big``, ``last_ack_s`` = last ``finished_at`` of a succeeded run − T,
    throughput = succeeded / ``last_ack_s``. Steady (``window_s``): throughput
    = succeeded / ``window_s``; no small-tenant or last-ack figure. Returns a
    dict of the :class:`DeliverResult` fields of the delivery side.
    """
    states = collections.Counter("none" if r["state"] is None else r["state"] for r in rows)
    succeeded = [r for r in rows if r["state"] == "succeeded"]
    attempts = collections.Counter(r["attempt"] or 0 for r in rows)
    out: dict[str, Any] = {
        "runs": len(rows),
        "states": dict(sorted(states.items())),
        "succeeded": len(succeeded),
        "lost": len(rows) - len(succeeded),
        "pending": states.get("pending", 0),
        "without_delivery_state": states.get("none", 0),
        "attempts": {str(k): attempts[k] for k in sorted(attempts)},
        "redelivered": sum(n for k, n in attempts.items() if k > 1),
    }
    out.update(_figures(_lags([r["dispatch_s"] for r in rows]), "dispatch"))
    out.update(_figures(_lags([r["ack_s"] if r["state"] == "succeeded" else None for r in rows]), "ack"))
    out["small_tenants_dispatch_p50_s"] = out["small_tenants_dispatch_p99_s"] = None
    out["last_ack_s"] = None
    out["throughput_runs_per_s"] = None
    if instant_s is not None:
        small = _lags([r["dispatch_s"] for r in rows if r["tenant"] != BIG_TENANT])
        out["small_tenants_dispatch_p50_s"] = _finite(percentile(small, 0.50))
        out["small_tenants_dispatch_p99_s"] = _finite(percentile(small, 0.99))
        if succeeded:
            out["last_ack_s"] = max(r["finished_s"] for r in succeeded) - instant_s
            if out["last_ack_s"] > 0:
                out["throughput_runs_per_s"] = len(succeeded) / out["last_ack_s"]
    elif window_s:
        out["throughput_runs_per_s"] = len(succeeded) / window_s
    return out


# ---------------------------------------------------------------- the run


@dataclasses.dataclass
class Options:
    """What to run (see ``python -m bench deliver --help``); seconds unless named.

    ``herd_on_second`` (no command-line flag): the herd's instant is the next
    whole second after loading, its crons in the ``seconds`` dialect, instead
    of the next minute boundary; for the tests, which must not wait up to a
    minute for it (:func:`bench.pairs.seconds_pairs`).
    """

    mode: str = "pull"
    workload: str = "herd"
    jobs: int = 300_000
    background_jobs: int = 0
    tenants: int = 51
    big_share: float = 0.9
    rate: int = 12_000
    seconds: int = 60
    period_s: int = 10
    steady_tenants: int = 10
    nodes: int = 1
    workers: int = 4
    worker_impl: str = "scheduler"
    via_api: bool = False
    batch: int = BATCH
    lead_s: float = 15.0
    deliver_timeout_s: float = 300.0
    put_rate: float = 0.0
    push_concurrency: int = PUSH_CONCURRENCY
    push_per_host: int = PUSH_PER_HOST
    receiver: str = "raw"
    fire_timeout_s: float = 600.0
    seed: int = DEFAULT_SEED
    herd_on_second: bool = False

    def check(self) -> None:
        """Raise ValueError naming the option for a combination that cannot run."""
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r}: choose from {', '.join(MODES)}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"--workload {self.workload!r}: choose from {', '.join(WORKLOADS)}")
        check_impl(self.worker_impl)
        if self.receiver not in RECEIVERS:
            raise ValueError(f"--receiver {self.receiver!r}: choose from {', '.join(RECEIVERS)}")
        if self.mode == "push" and self.workers:
            raise ValueError("--workers: push mode delivers from the nodes; give --workers 0")
        if self.via_api and (self.mode != "pull" or not self.workers or self.worker_impl != "scheduler"):
            raise ValueError("--via-api: pull mode with --workers >= 1 of --worker-impl scheduler")
        if self.put_rate and self.workload != "herd":
            raise ValueError("--put-rate: the herd workload (schedule writes while a herd fires)")
        if self.workload == "steady" and self.seconds <= 2 * 5:
            raise ValueError("--seconds must exceed 10 (the first and last 5 s are left out)")


API_RATE_PER_S = 1_000_000
"""The bench's API process admits any request rate per key (the bench measures throughput, not the limiter)."""


class ApiProcess:
    """``scheduler api`` on a free loopback port against ``dsn`` (the bench's ``via_api`` workers'
    endpoint), its store pool sized for ``workers`` HTTP workers (3 requests in flight each)."""

    def __init__(self, dsn: str, log_dir: Path, workers: int, name: str = "api") -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "SCHEDULER_DSN": dsn,
            "SCHEDULER_LOG_FORMAT": "json",
            "SCHEDULER_API_RATE_PER_S": str(API_RATE_PER_S),
            "SCHEDULER_API_BURST": str(API_RATE_PER_S),
            "SCHEDULER_API_POOL_SIZE": str(min(200, 3 * workers + 2)),
        }
        args = ["api", "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = NodeProcess(name, log_dir / f"{name}.log", args, env).start()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until it answers ``/openapi.json``; raises TimeoutError."""

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/openapi.json", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        wait_until(up, timeout_s, interval_s=0.2, what="the API process to listen")

    def stop(self) -> None:
        self.proc.stop()


def worker_keys(conn, tenants: list[str]) -> dict[str, str]:
    """A new ``worker`` key per tenant: tenant → token."""
    from scheduler.api import keys

    return {tenant: keys.create(conn, tenant, "worker", "bench")[0] for tenant in tenants}


class _Consumers:
    """The receiver (push) or the workers (pull) of one run, started and stopped together."""

    def __init__(self, opts: Options, log_dir: Path) -> None:
        self.opts = opts
        self.log_dir = log_dir
        self.receiver: ReceiverProcess | None = None
        self.workers: list[WorkerProcess] = []
        self.records: list[tuple[str, float]] | None = None
        self.api: ApiProcess | None = None
        self.put_api: ApiProcess | None = None
        self.put_probe: PutProbe | None = None

    def start_put_probe(self, dsn: str, conn, start_at: float) -> PutProbe | None:
        """With ``--put-rate``: an API process of its own (not the workers': their load is
        not what this measures) and a key of tenant :data:`PUT_TENANT` (created here, so the
        PUTs count against a quota of their own); PUTs from ``start_at``."""
        if not self.opts.put_rate:
            return None
        from scheduler import jobs
        from scheduler.api import keys

        self.put_api = ApiProcess(dsn, self.log_dir, workers=1, name="api-put")
        self.put_api.wait_ready()
        jobs.add_tenant(conn, PUT_TENANT)
        token = keys.create(conn, PUT_TENANT, "tenant", "bench-put")[0]
        self.put_probe = PutProbe(self.put_api.url, token, self.opts.put_rate, start_at).start()
        return self.put_probe

    def stop_put_probe(self) -> dict[str, Any] | None:
        probe, self.put_probe = self.put_probe, None
        figures = dataclasses.asdict(probe.stop()) if probe is not None else None
        api, self.put_api = self.put_api, None
        if api is not None:
            api.stop()
        return figures

    def start_receiver(self) -> str:
        """Start the receiver; return the URL the jobs target."""
        self.receiver = ReceiverProcess(
            self.log_dir / "receiver.tsv", self.log_dir / "receiver.log", self.opts.receiver
        )
        return f"http://127.0.0.1:{self.receiver.wait_ready()}/run"

    def start_workers(self, dsn: str, tenants: list[str], conn=None) -> None:
        if self.opts.via_api and self.opts.workers:
            self.api = ApiProcess(dsn, self.log_dir, self.opts.workers)
            self.api.wait_ready()
            self.workers = start_api_workers(
                dsn,
                self.api.url,
                worker_keys(conn, tenants),
                self.opts.workers,
                self.log_dir,
                queue=QUEUE,
                batch=self.opts.batch,
            )
            return
        self.workers = start_workers(
            dsn,
            tenants,
            self.opts.workers,
            self.log_dir,
            impl=self.opts.worker_impl,
            queue=QUEUE,
            batch=self.opts.batch,
        )

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []
        api, self.api = self.api, None
        if api is not None:
            api.stop()

    def meter(self, nodes: list[NodeProcess], conn) -> CpuMeter:
        """A :class:`bench.cpu.CpuMeter` over the nodes, the workers (and their API), the
        receiver and the store's backends."""
        processes = {
            "node": [p.pid for p in nodes],
            "workers": [w.proc.pid for w in self.workers],
            "api": [self.api.proc.pid] if self.api is not None else [],
            "receiver": [self.receiver.proc.pid] if self.receiver is not None else [],
        }
        return CpuMeter(processes, store_backends(conn), sample_every_s=CPU_SAMPLE_S)

    def stop_receiver(self) -> None:
        self.stop_put_probe()
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            self.records = receiver.stop()


def push_targets(url: str) -> Callable[[Any, datetime], None]:
    """A loader's ``prepare`` hook: the jobs created at ``created`` POST to ``url``
    (``queue`` NULL, a ``job_delivery`` row with the engine's default retry policy)."""

    def prepare(conn, created: datetime) -> None:
        params = {
            "created": created,
            "url": url,
            "max_attempts": lifecycle.DEFAULT_MAX_ATTEMPTS,
            "backoff_base_s": lifecycle.DEFAULT_BACKOFF_BASE_S,
            "backoff_cap_s": lifecycle.DEFAULT_BACKOFF_CAP_S,
        }

        def write(c) -> None:
            queries.execute(c, "insert_push_targets", params)
            queries.execute(c, "set_jobs_pushed", params)

        store.run_transaction(conn, write)

    return prepare


def run_deliver(dsn: str, opts: Options, out_dir: Path, progress=None) -> DeliverResult:
    """Load, fire and deliver ``opts``'s workload, then measure it from the store (see the
    module doc). Raises ValueError for bad options (before touching the store),
    TimeoutError if the nodes never own the partitions or the herd never drains."""
    opts.check()
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    consumers = _Consumers(opts, log_dir)
    machine = calibrate(dsn)  # before anything loads or runs: the machine at rest
    conn = reset_store(dsn)
    procs = []
    put = None
    try:
        prepare = None
        env = {}
        if opts.mode == "push":
            prepare = push_targets(consumers.start_receiver())
            env["SCHEDULER_PUSH_ALLOW"] = PUSH_ALLOW
            env["SCHEDULER_PUSH_CONCURRENCY"] = str(opts.push_concurrency)
            env["SCHEDULER_PUSH_PER_HOST"] = str(opts.push_per_host)
        if opts.workload == "herd":
            small = load_background(conn, opts.tenants, opts.background_jobs, progress)
            tenants = [BIG_TENANT, *small]
            herd = Herd(
                opts.jobs,
                opts.background_jobs,
                opts.tenants,
                opts.nodes,
                small,
                opts.big_share,
                None,
                None,
                opts.seed,
                on_second=opts.herd_on_second,
            )
        else:
            base, jobs = load_steady(conn, opts.rate, opts.period_s, opts.steady_tenants, progress, prepare)
            tenants = tenant_names(opts.steady_tenants)
        procs = [start_node(dsn, f"deliver-{i}", log_dir, env=env) for i in range(opts.nodes)]
        wait_until(
            lambda: queries.execute(conn, "count_owned_partitions")[0]["owned"] == 1024,
            60,
            what="nodes to own all 1,024 partitions",
        )
        # Workers start before the herd is loaded: dozens of processes starting
        # must be idle, polling empty queues, by T.
        consumers.start_workers(dsn, tenants, conn)
        meter = consumers.meter(procs, conn)
        if opts.workload == "herd":
            herd.load(conn, opts.lead_s, progress, prepare)
            consumers.start_put_probe(dsn, conn, herd.t.timestamp())
            time.sleep(max(0.0, (herd.t - store.now(conn)).total_seconds()))
            meter.start()
            metered = time.monotonic()
            herd.drain(conn, progress, opts.fire_timeout_s)
            put = consumers.stop_put_probe()
            since = herd.t
            until = since + timedelta(seconds=1)
            window_s = None
        else:
            # The window is measured from the first due second on: a node that
            # owned its partitions before then must not shorten it.
            time.sleep(max(0.0, (base - store.now(conn)).total_seconds()))
            meter.start()
            metered = time.monotonic()
            started = store.now(conn)
            time.sleep(opts.seconds)
            ended = store.now(conn)
            since, until = steady_window(started, ended, base)
            window_s = (until - since).total_seconds()
            # Every run of the window is fired before its delivery is awaited
            # (a run not yet fired is not yet on its way, and would be missed).
            wait_until(
                lambda: not queries.execute(conn, "any_due_at", {"nominal": until})[0]["due"],
                opts.fire_timeout_s,
                interval_s=0.25,
                what="the window's runs to be fired",
            )
        span = {"since": since, "until": until}
        waited = 0.0
        if opts.mode == "push" or opts.workers:
            waited = _wait_delivered(conn, span, opts.deliver_timeout_s)
        cpu, cpu_window_s = meter.stop(), time.monotonic() - metered
        firing = None
        if opts.workload == "herd":  # audited once delivered: the audit must not slow delivery
            fired = herd.measure(conn, procs, out_dir)
            firing = {
                "missing": fired.missing,
                "duplicates": fired.duplicates,
                "unexpected": fired.unexpected,
                "fire_lag_p99_s": fired.lag_p99_s,
                "drain_s": fired.drain_s,
            }
        rss = [p.peak_rss_mb() for p in procs]
        worker_processes = len(consumers.workers)
        consumers.stop_workers()
        for proc in procs:
            proc.stop()
        procs = []
        consumers.stop_receiver()
        if firing is None:
            audit = verify(conn, since, until)
            firing = {
                "missing": audit.missing,
                "duplicates": audit.duplicates,
                "unexpected": audit.unexpected,
                "fire_lag_p99_s": audit.lateness_p99_s,
                "drain_s": None,
            }
        rows = queries.execute(conn, "delivery_rows", span)
        figures = summarize(rows, instant_s=since.timestamp() if window_s is None else None, window_s=window_s)
    finally:
        consumers.stop_workers()
        for proc in procs:
            proc.stop()
        consumers.stop_receiver()
        conn.close()
    records = consumers.records
    return DeliverResult(
        mode=opts.mode,
        workload=opts.workload,
        jobs=opts.jobs if opts.workload == "herd" else jobs,
        background_jobs=opts.background_jobs if opts.workload == "herd" else 0,
        rate=opts.rate if opts.workload == "steady" else None,
        seconds=opts.seconds if opts.workload == "steady" else None,
        nodes=opts.nodes,
        workers=opts.workers,
        worker_impl=(("scheduler-api" if opts.via_api else opts.worker_impl) if opts.workers else None),
        worker_processes=worker_processes,
        since=since.isoformat(),
        until=until.isoformat(),
        delivered_wait_s=round(waited, 3),
        receiver=opts.receiver if records is not None else None,
        receiver_requests=None if records is None else len(records),
        receiver_duplicates=None if records is None else receiver_duplicates(records),
        node_rss_mb_max=max((r for r in rss if r is not None), default=None),
        cpu_s=cpu,
        cpu_window_s=cpu_window_s,
        machine=dataclasses.asdict(machine),
        put=put,
        **firing,
        **figures,
    )


def _wait_delivered(conn, span: dict[str, datetime], timeout_s: float) -> float:
    """Wait until no run of ``span`` is pending, leased or failed, or ``timeout_s`` passes
    (then the rest counts as lost); return the seconds waited."""
    start = time.monotonic()
    while queries.execute(conn, "any_unsettled", span)[0]["unsettled"]:
        if time.monotonic() - start > timeout_s:
            break
        time.sleep(0.25)
    return time.monotonic() - start


__all__ = ["COLUMNS", "FIRING_ONLY_COLUMNS", "DeliverResult", "Options", "push_targets", "run_deliver", "summarize"]
