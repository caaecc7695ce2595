"""Store failover timing: the primary of a Patroni pair killed under firing nodes, measured.

For each replication mode (``sync``: Patroni's ``synchronous_mode``;
``async``: plain streaming replication) the bench starts a throwaway etcd
(once) and a throwaway Patroni pair on loopback
(:class:`scheduler.devtools.patroni_pair.PatroniPair`: ``ttl`` 10 s,
``loop_wait`` 1 s, ``retry_timeout`` 3 s), migrates a database on the
primary, loads ``jobs`` one-second interval jobs and starts ``nodes`` node
processes on the multi-host DSN
(``postgresql://postgres@h:p1,h:p2/bench?target_session_attrs=read-write&connect_timeout=2``,
the nodes' own default timings unless ``--lease-ttl-s`` is given). Once they
fire steadily, a separate connection reads the primary's runs continuously
(every :data:`OBSERVE_INTERVAL_S`) and the primary's host is SIGKILLed (its
Patroni and its PostgreSQL with every backend). With ``async`` the standby
first lags: the primary's WAL sender is SIGSTOPped ``lag_s`` seconds before
the kill (the standby receives nothing more), so the runs committed
meanwhile exist only on the dying primary. (Pausing the standby's WAL
receiver instead leaves no lag: the WAL sent meanwhile waits in its socket
buffer and is read after the SIGCONT, primary dead or not.) Reported (seconds from the kill; store time is the
machine's clock):

* ``promotion_s``: until the standby accepts a read-write session (Patroni
  promoted it; the bench polls every 50 ms);
* ``first_write_s``: until the first write of a node is stored there (a
  heartbeat, a lease claimed or a run fired; polled every 50 ms);
* ``runs_resumed_s``: until the first run fired on the new primary;
* ``lateness_p99_s`` / ``lateness_max_s``: over every run whose slot lies
  from 1 s before the kill (async: 1 s before the standby began to lag, so
  the slots fired again count) to 5 s after the runs resumed;
* ``missing`` / ``duplicates``: ``verify`` on the new primary over the
  whole firing window (from the first steady second to 2 s before the end);
* ``vanished_runs``: runs the old primary showed just before the kill
  (committed and visible there) that the new primary does not hold as they
  were (absent, or fired again under another commit); ``refired_runs``: of
  those, the ones the new primary holds again under the same identity
  (job, slot), fired after the failover. With ``sync`` both must be 0;
* ``rewind_detected``: the sum of ``scheduler_store_rewind_detected_total``
  over the nodes' ``/metrics`` (None when the nodes do not export it).

Each mode gets a fresh pair; everything is stopped and removed at the end,
whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

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
from bench.process import NodeProcess
from scheduler import store
from scheduler.audit import verify
from scheduler.devtools.etcd_server import ThrowawayEtcd
from scheduler.devtools.patroni_pair import PatroniPair, free_port
from scheduler.partition import PARTITION_COUNT

PATRONI = {"ttl": 10, "loop_wait": 1, "retry_timeout": 3}
"""The pair's Patroni timings (seconds)."""

STEADY_S = 5.0
"""Firing steadily this long before the kill (the window's first part)."""
AFTER_S = 5.0
"""After the runs resumed, firing this long more before the window closes."""
OBSERVE_INTERVAL_S = 0.1
"""How often the observer reads the old primary's runs before the kill."""
PROBE_INTERVAL_S = 0.05
"""How often the bench polls the new primary for writability and the first write."""
REWIND_METRIC = "scheduler_store_rewind_detected_total"

COLUMNS = [
    "replication",
    "nodes",
    "jobs",
    "lag_s",
    "promotion_s",
    "first_write_s",
    "runs_resumed_s",
    "lateness_p99_s",
    "lateness_max_s",
    "missing",
    "duplicates",
    "vanished_runs",
    "refired_runs",
    "rewind_detected",
]


@dataclasses.dataclass
class StoreFailoverResult:
    """One kill of the pair's primary under ``nodes`` firing nodes (seconds from the kill)."""

    replication: str
    nodes: int
    jobs: int
    lag_s: float
    promotion_s: float
    first_write_s: float | None
    runs_resumed_s: float | None
    lateness_p99_s: float | None
    lateness_max_s: float | None
    missing: int
    duplicates: int
    vanished_runs: int
    refired_runs: int
    rewind_detected: float | None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class RunObserver:
    """Reads the runs of one store (a single host) every :data:`OBSERVE_INTERVAL_S` on a
    thread of its own until :meth:`stop` or until the connection fails (the host
    died): ``seen`` maps ``(job_id, nominal_time)`` to ``(fired_at, epoch, node_id)``."""

    def __init__(self, dsn: str, since: datetime) -> None:
        self.dsn = dsn
        self.since = since
        self.seen: dict[tuple, tuple] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-observer", daemon=True)

    def start(self) -> RunObserver:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            conn = store.connect(self.dsn, application_name="bench-observer", connect_timeout_s=2)
        except Exception as exc:  # noqa: BLE001 (reported, not raised: the bench goes on)
            self.error = str(exc)
            return
        since = self.since
        try:
            while not self._stop.is_set():
                rows = queries.execute(conn, "runs_fired_since", {"since": since})
                for row in rows:
                    self.seen[(row["job_id"], row["nominal_time"])] = (row["fired_at"], row["epoch"], row["node_id"])
                if rows:  # re-read the last second: commits land out of fired_at order
                    since = max(row["fired_at"] for row in rows) - timedelta(seconds=1)
                self._stop.wait(OBSERVE_INTERVAL_S)
        except psycopg.Error as exc:
            self.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)


def scrape_counter(port: int, name: str) -> float | None:
    """Sum of the samples of counter ``name`` on ``http://127.0.0.1:<port>/metrics``;
    None if the endpoint does not answer or has no such metric."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and (line[len(name) : len(name) + 1] in (" ", "{"))
    ]
    return sum(values) if values else None


def _wait_first(conn: psycopg.Connection, name: str, column: str, after: datetime, timeout_s: float) -> datetime | None:
    """Poll the bench query ``name`` until its ``column`` is not NULL; return it (None on timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = queries.execute(conn, name, {"after": after})[0][column]
        if value is not None:
            return value
        time.sleep(PROBE_INTERVAL_S)
    return None


def _balanced(conn: psycopg.Connection) -> bool:
    return queries.execute(conn, "count_owned_partitions")[0]["owned"] == PARTITION_COUNT


def run_storefailover(
    etcd_endpoint: str,
    replication: str,
    nodes: int,
    jobs: int,
    lag_s: float,
    out_dir: Path,
    node_args: tuple[str, ...] = (),
    echo=lambda line: None,
) -> StoreFailoverResult:
    """One trial (see the module docstring) on a fresh Patroni pair; ``replication`` is
    ``sync`` or ``async`` (``lag_s``: the primary's WAL senders paused this long
    before the kill; async only, 0 = none)."""
    pair = PatroniPair(etcd_endpoint, synchronous=replication == "sync", **PATRONI)
    procs: list[NodeProcess] = []
    conn: psycopg.Connection | None = None
    log_dir = out_dir / replication
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        echo(f"{replication}: starting the Patroni pair")
        pair.start()
        old = pair.wait_leader()
        with psycopg.connect(old.dsn(), autocommit=True, connect_timeout=5) as admin:
            admin.execute("CREATE DATABASE bench")
        dsn = pair.multi_host_dsn("bench", connect_timeout="2")
        conn = reset_store(dsn)  # migrated through both hosts: libpq finds the primary
        ensure_tenants(conn, ["storefailover"])
        now = store.now(conn)
        anchor = now.replace(microsecond=0) + timedelta(seconds=1)
        (values,) = register_specs(conn, [interval_spec(1, anchor)])
        copy_jobs(conn, (job_row("storefailover", values, anchor, now) for _ in range(jobs)))
        ports = [free_port() for _ in range(nodes)]
        for i in range(nodes):
            extra = ["--metrics-port", str(ports[i]), *node_args]
            procs.append(start_node(dsn, f"sf-{replication}-{i}", log_dir, extra))
        wait_until(lambda: _balanced(conn), 60, what="the nodes to own all 1,024 partitions")
        started = store.now(conn)
        time.sleep(STEADY_S)

        observer = RunObserver(old.dsn("bench"), started).start()
        time.sleep(1.0)
        echo(f"{replication}: killing the primary {old.name}" + (f" after {lag_s}s of standby lag" if lag_s else ""))
        pause = pair.walsenders_paused(old) if lag_s > 0 else contextlib.nullcontext()
        with pause:
            time.sleep(lag_s)
            killed_at = store.now(conn)
            t_kill = time.monotonic()
            pair.kill(old)
        observer.stop()
        conn.close()

        pair.wait_leader(exclude=old, timeout_s=PATRONI["ttl"] * 4 + 30, interval_s=PROBE_INTERVAL_S)
        promotion_s = time.monotonic() - t_kill
        conn = store.connect(dsn, application_name="bench")
        first_write = _wait_first(conn, "first_write_after", "first_write", killed_at, 120)
        resumed = _wait_first(conn, "first_run_fired_after", "fired_at", killed_at, 120)
        echo(f"{replication}: promoted after {promotion_s:.1f}s; waiting for the nodes to catch up")
        caught_up_at = store.now(conn)
        wait_until(
            lambda: queries.execute(conn, "count_unfired_before", {"until": caught_up_at})[0]["n"] == 0,
            120,
            what="every slot before the recovery to fire",
        )
        time.sleep(AFTER_S)
        ended = store.now(conn)
        rewinds = [scrape_counter(port, REWIND_METRIC) for port in ports]
        audit = verify(
            conn,
            (started + timedelta(seconds=1)).replace(microsecond=0),
            (ended - timedelta(seconds=2)).replace(microsecond=0),
        )
        around_until = (resumed or killed_at) + timedelta(seconds=5)
        lateness = [
            r["lateness_s"]
            for r in queries.execute(
                conn,
                "lateness_in_window",
                {"since": killed_at - timedelta(seconds=1 + lag_s), "until": around_until},
            )
        ]
        now_held = {
            (r["job_id"], r["nominal_time"]): (r["fired_at"], r["epoch"], r["node_id"])
            for r in queries.execute(conn, "runs_fired_since", {"since": started})
        }
        vanished = [key for key, commit in observer.seen.items() if now_held.get(key) != commit]
        refired = [key for key in vanished if key in now_held and now_held[key][0] > killed_at]
        return StoreFailoverResult(
            replication=replication,
            nodes=nodes,
            jobs=jobs,
            lag_s=lag_s,
            promotion_s=round(promotion_s, 2),
            first_write_s=round((first_write - killed_at).total_seconds(), 2) if first_write else None,
            runs_resumed_s=round((resumed - killed_at).total_seconds(), 2) if resumed else None,
            lateness_p99_s=_round(_percentile(lateness, 0.99)),
            lateness_max_s=_round(max(lateness) if lateness else None),
            missing=audit.missing,
            duplicates=audit.duplicates,
            vanished_runs=len(vanished),
            refired_runs=len(refired),
            rewind_detected=None if all(r is None for r in rewinds) else sum(r or 0.0 for r in rewinds),
        )
    finally:
        for proc in procs:
            proc.stop()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        (log_dir / "patroni.txt").write_text(pair.log_tails(200))
        pair.stop()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def run_storefailovers(
    replications: list[str],
    nodes: int,
    jobs: int,
    lag_s: float,
    trials: int,
    out_dir: Path,
    node_args: tuple[str, ...] = (),
    echo=lambda line: None,
) -> list[StoreFailoverResult]:
    """:func:`run_storefailover` ``trials`` times per replication mode, one after the other,
    on one throwaway etcd; the standby lags ``lag_s`` seconds in the async runs only."""
    results: list[StoreFailoverResult] = []
    with ThrowawayEtcd(enable_v2=True) as etcd:  # the pair's DCS (Patroni's etcd v2 client)
        for replication in replications:
            for _ in range(trials):
                lag = lag_s if replication == "async" else 0.0
                results.append(
                    run_storefailover(etcd.endpoint, replication, nodes, jobs, lag, out_dir, node_args, echo)
                )
    return results


def as_rows(results: list[StoreFailoverResult]) -> list[dict[str, Any]]:
    """The results as dicts (the table's and the JSON's rows)."""
    return [dataclasses.asdict(r) for r in results]
