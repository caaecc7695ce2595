"""Cluster-test harness: real ``scheduler node`` processes on one PostgreSQL.

Pieces (the ``cluster`` fixture in ``conftest.py`` wires them per test):

:class:`Timings`
    scaled-down lease timings (TTL 2 s, renew 0.5 s, poll 0.25 s, tick 0.5 s,
    safety margin 0.5 s) and the failover bounds derived from them.
:class:`ClusterNode`
    one ``python -m scheduler --log-format json node ...`` child (the bench's
    :class:`bench.process.NodeProcess`): its stderr is read on a thread and
    parsed into JSON events (``lease_claimed``, ``fence_rejected``,
    ``lease_lost``, ``node_stopped``, ...); real signals
    (:meth:`~ClusterNode.kill` = SIGKILL, :meth:`~ClusterNode.pause` = SIGSTOP,
    :meth:`~ClusterNode.resume` = SIGCONT, :meth:`~ClusterNode.terminate` =
    SIGTERM and wait). Children get ``PR_SET_PDEATHSIG`` = SIGKILL, so they die
    with the test process even if its teardown never runs.
:class:`Cluster`
    the processes of one test on one database, a store connection, and
    :meth:`~Cluster.wait_for`: polls a probe until a predicate holds, bounded,
    failing with what it last saw (and failing at once if a node that should
    be running has exited). No fixed sleeps where a condition can be polled.
:func:`check_history`
    the history validator every cluster test ends with: ``verify`` over the
    window (every (job, nominal) exactly once) plus the fencing invariants
    over the runs: per partition, epochs never go down in ``fired_at``
    order (a stale owner never commits after a newer epoch committed), one
    (partition, epoch) belongs to one node, no run carries an epoch the
    partition never reached.

Every cluster scenario that is about ownership runs against both coordinators
(the ``cluster`` fixture is parametrised ``sql`` / ``etcd``): with ``etcd``
the nodes get ``--coordinator etcd --etcd-endpoints <the session's throwaway
etcd> --etcd-prefix /t/<test>/``, and the ownership probes read etcd (the
lease and membership live there; the store keeps only the epochs):
:meth:`Cluster.ownership` counts partition keys per member, and
:meth:`Cluster.partitions` judges ``lease_live`` by the partition's key
existing for its store owner.

All SQL the cluster tests run against the store lives in this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import psycopg.sql
import pytest
from helpers import store_now, wait_for

from bench.process import NodeProcess
from scheduler import jobs, store
from scheduler.audit import VerifyReport, verify
from scheduler.coordination import fair_share
from scheduler.coordination.etcd_gateway import range_prefix
from scheduler.partition import PARTITION_COUNT
from scheduler.spec import JobSpec
from scheduler.status import cluster_status

T = TypeVar("T")


# ---------------------------------------------------------------- timings


@dataclasses.dataclass(frozen=True)
class Timings:
    """Scaled-down node timings (seconds); valid for ``Settings.validated``."""

    lease_ttl_s: float = 2.0
    renew_interval_s: float = 0.5
    poll_interval_s: float = 0.25
    tick_interval_s: float = 0.5
    safety_margin_s: float = 0.5

    def flags(self) -> list[str]:
        """The ``scheduler node`` flags for these timings."""
        return [
            "--lease-ttl-s",
            str(self.lease_ttl_s),
            "--renew-interval-s",
            str(self.renew_interval_s),
            "--poll-interval-s",
            str(self.poll_interval_s),
            "--tick-interval-s",
            str(self.tick_interval_s),
            "--safety-margin-s",
            str(self.safety_margin_s),
        ]

    @property
    def responsive_s(self) -> float:
        """``Settings.responsive_s`` for these timings: min(TTL, renew + 2 polls)."""
        return min(self.lease_ttl_s, self.renew_interval_s + 2 * self.poll_interval_s)

    @property
    def crash_lateness_bound_s(self) -> float:
        """docs/design.md §6 crash bound TTL + poll + tick, scaled down (no margin)."""
        return self.lease_ttl_s + self.poll_interval_s + self.tick_interval_s


TIMINGS = Timings()

MARGIN_S = 3.0
"""Generous slack added to every timing bound: 2 cores shared with PostgreSQL."""

AFTERMATH_S = 2.0
"""Every audited window extends at least this far past the test's last disruption."""


COORDINATORS = ["sql", "etcd"]

both_coordinators = pytest.mark.parametrize("cluster", COORDINATORS, indirect=True)
"""Run a cluster test once per coordinator (the ``cluster`` fixture's parameter)."""


# ---------------------------------------------------------------- waiting


def sleep_until_wall_fraction(fraction: float) -> None:
    """Sleep until the wall clock's fractional second is ``fraction`` (0..1).

    Nodes tick phased onto wall-clock seconds (``scheduler.firing.TICK_PHASE_S``), so
    this places an action just before a tick that has due work.
    """
    now = time.time()
    time.sleep((fraction - now % 1.0) % 1.0)


# ---------------------------------------------------------------- processes


def _child_env() -> dict[str, str]:
    """The test's environment without any SCHEDULER_* setting (flags only)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") or k.startswith("SCHEDULER_TEST_")}


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m scheduler ARGS`` to completion (flags only, no SCHEDULER_* env)."""
    return subprocess.run(
        [sys.executable, "-m", "scheduler", *args],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=timeout_s,
        check=False,
    )


class ClusterNode(NodeProcess):
    """One ``scheduler node`` child of a cluster test (:class:`bench.process.NodeProcess`).

    Started with ``--log-format json``, the store and the node settings as
    flags (``timings``, then ``extra_flags``) and no ``SCHEDULER_*``
    variable; its JSON log records are read into ``events``; it dies with
    the test process. ``expected_running`` is true from :meth:`start` until
    the test kills, stops or destroys it: a node that exits meanwhile fails
    the test (:meth:`check_alive`). Signals to a node that is not running
    fail the test too.
    """

    def __init__(
        self, dsn: str, node_id: str, log_path: Path, timings: Timings = TIMINGS, extra_flags: list[str] | None = None
    ) -> None:
        self.dsn = dsn
        self.timings = timings
        self.extra_flags = list(extra_flags or [])
        self.expected_running = False
        super().__init__(
            node_id,
            log_path,
            ["--log-format", "json", "node", "--dsn", dsn, "--node-id", node_id, *timings.flags(), *self.extra_flags],
            _child_env(),
            read_events=True,
            die_with_parent=True,
        )

    # ---- lifecycle

    def start(self) -> ClusterNode:
        """Launch the process (returns at once; see :meth:`wait_event`)."""
        super().start()
        self.expected_running = True
        return self

    def _require_running(self) -> None:
        assert self._proc is not None and self._proc.poll() is None, f"{self.node_id} is not running"

    def kill(self) -> None:
        """SIGKILL and reap (``kill -9``); the store sees its sockets close."""
        self._require_running()
        self.expected_running = False
        super().kill()

    def pause(self) -> None:
        """SIGSTOP; returns once the kernel reports the process stopped."""
        self._require_running()
        self.signal(signal.SIGSTOP)
        wait_for(f"{self.node_id} to stop", self.state, lambda s: s in ("T", "t"), timeout_s=5, interval_s=0.005)

    def resume(self) -> None:
        """SIGCONT."""
        self._require_running()
        self.signal(signal.SIGCONT)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (graceful stop) and wait; return the exit status.

        Raises AssertionError if the node has not exited after ``timeout_s``.
        """
        self._require_running()
        self.expected_running = False
        self.signal(signal.SIGTERM)
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.node_id} did not exit within {timeout_s}s of SIGTERM") from None
        finally:
            self._finish_output()

    def destroy(self) -> None:
        """Teardown: SIGKILL if still running (works on stopped processes too); never raises."""
        self.expected_running = False
        super().destroy()

    # ---- logs

    def wait_event(
        self,
        name: str,
        predicate: Callable[[dict], bool] = lambda e: True,
        *,
        timeout_s: float = 10.0,
        since_mono: float | None = None,
    ) -> dict[str, Any]:
        """Wait for the first event ``name`` satisfying ``predicate``; return it."""

        def probe() -> list[dict]:
            return [e for e in self.events_named(name, since_mono) if predicate(e)]

        return wait_for(f"event {name!r} from {self.node_id}", probe, timeout_s=timeout_s, check=self.check_alive)[0]

    def check_alive(self) -> None:
        """Raise AssertionError (with the log tail) if the node should run but has exited."""
        if self.expected_running and self.returncode() is not None:
            self.expected_running = False
            raise AssertionError(f"node {self.node_id} exited with status {self.returncode()}:\n{self.tail()}")


# ---------------------------------------------------------------- store probes


def add_interval_jobs(conn: psycopg.Connection, count: int, interval_s: int = 1, tenant: str = "cluster") -> list:
    """Register ``count`` unnamed interval jobs (one transaction); return their ids."""
    return jobs.add_jobs(conn, [JobSpec.build(tenant=tenant, interval_s=interval_s) for _ in range(count)])


@dataclasses.dataclass(frozen=True)
class PartitionRow:
    partition_id: int
    owner_node: str | None
    owner_epoch: int
    lease_expires_at: datetime | None
    acquired_at: datetime | None
    lease_live: bool


def partitions(conn: psycopg.Connection) -> dict[int, PartitionRow]:
    """Every partition by id: its lease's owner, expiry and claim time, the
    fence's epoch (``partitions.owner_epoch``), and ``lease_live`` judged by
    store time."""
    rows = conn.execute(
        "SELECT p.partition_id, l.owner_node, p.owner_epoch, l.lease_expires_at, l.acquired_at,"
        "       coalesce(l.lease_expires_at > now(), false) AS lease_live"
        " FROM partitions AS p JOIN leases AS l ON l.partition_id = p.partition_id"
        " ORDER BY p.partition_id"
    ).fetchall()
    return {row["partition_id"]: PartitionRow(**row) for row in rows}


def fences(conn: psycopg.Connection) -> dict[int, tuple[str | None, int]]:
    """Every partition's fence row: ``{partition_id: (owner_node, owner_epoch)}``
    (``partitions``: only claims write it; a release leaves it as it was)."""
    rows = conn.execute("SELECT partition_id, owner_node, owner_epoch FROM partitions").fetchall()
    return {row["partition_id"]: (row["owner_node"], row["owner_epoch"]) for row in rows}


def owned_by(conn: psycopg.Connection, node_id: str) -> dict[int, PartitionRow]:
    """Partitions whose row names ``node_id`` as owner (live or not)."""
    return {pid: row for pid, row in partitions(conn).items() if row.owner_node == node_id}


def ownership(conn: psycopg.Connection, timings: Timings = TIMINGS) -> dict[str, int]:
    """``{node_id: partitions it owns live}`` for live (or suspect) nodes (``scheduler status``'s view)."""
    status = cluster_status(conn, timings.lease_ttl_s, timings.responsive_s)
    return {node["node_id"]: node["partitions"] for node in status["nodes"] if node["live"]}


def balanced(counts: dict[str, int], nodes: list[str]) -> bool:
    """Exactly ``nodes`` are live, all 1,024 partitions are owned, none above its share."""
    share = fair_share(len(nodes))
    return (
        sorted(counts) == sorted(nodes)
        and sum(counts.values()) == PARTITION_COUNT
        and all(n <= share for n in counts.values())
    )


def install_firing_fault(conn: psycopg.Connection, node_id: str, sqlstate: str) -> Callable[[], None]:
    """Make the next firing statement of ``node_id`` fail once with ``sqlstate``.

    Installs a statement trigger on ``runs`` (in this test's database) that
    raises for the firing sessions of ``node_id`` (:func:`firing_sessions`); disarmed until the
    returned ``arm()`` is called, then fires exactly once.
    """
    conn.execute("CREATE SEQUENCE firing_fault MINVALUE 0 START 1000")
    conn.execute(f"""
        CREATE FUNCTION firing_fault() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF current_setting('application_name') LIKE {psycopg.sql.quote(firing_sessions(node_id))} THEN
            IF nextval('firing_fault') = 1 THEN
              RAISE EXCEPTION 'injected firing fault' USING ERRCODE = {psycopg.sql.quote(sqlstate)};
            END IF;
          END IF;
          RETURN NULL;
        END $$""")
    conn.execute("CREATE TRIGGER firing_fault BEFORE INSERT ON runs FOR EACH STATEMENT EXECUTE FUNCTION firing_fault()")

    def arm() -> None:
        conn.execute("SELECT setval('firing_fault', 0)")

    return arm


def lagging_jobs(conn: psycopg.Connection, until: datetime) -> int:
    """Active jobs with a slot before ``until`` still unfired (0 = caught up)."""
    return conn.execute(
        "SELECT count(*) AS n FROM jobs WHERE deleted_at IS NULL AND NOT paused AND next_nominal_at < %s", (until,)
    ).fetchone()["n"]


def runs_by(
    conn: psycopg.Connection, node_id: str, *, pids: list[int] | None = None, fired_after: datetime | None = None
) -> list[dict]:
    """``(partition_id, epoch, fired_at)`` of runs by ``node_id`` (optionally filtered)."""
    return conn.execute(
        "SELECT partition_id, epoch, fired_at FROM runs"
        " WHERE node_id = %(node)s"
        "   AND (%(pids)s::int4[] IS NULL OR partition_id = ANY(%(pids)s::int4[]))"
        "   AND (%(after)s::timestamptz IS NULL OR fired_at > %(after)s::timestamptz)",
        {"node": node_id, "pids": pids, "after": fired_after},
    ).fetchall()


def delivery_states(conn: psycopg.Connection, job_ids: list) -> list[dict]:
    """Every run of ``job_ids``: ``partition_id, job_id, nominal_time, state, attempt, worker, last_error``."""
    return conn.execute(
        "SELECT partition_id, job_id, nominal_time, state, attempt, worker, last_error FROM runs"
        " WHERE job_id = ANY(%s)"
        " ORDER BY nominal_time, job_id",
        (job_ids,),
    ).fetchall()


def max_lateness_s(conn: psycopg.Connection, pids: list[int], nominal_from: datetime) -> float:
    """Largest fired_at − scheduled_at of runs in ``pids`` with nominal ≥ ``nominal_from``."""
    row = conn.execute(
        "SELECT max(extract(epoch FROM (fired_at - scheduled_at)))::float8 AS late FROM runs"
        " WHERE partition_id = ANY(%s::int4[]) AND nominal_time >= %s",
        (pids, nominal_from),
    ).fetchone()
    assert row["late"] is not None, "no runs in the affected partitions"
    return row["late"]


def firing_sessions(node_id: str) -> str:
    """The ``application_name`` pattern (LIKE) of ``node_id``'s firing sessions: its due scan
    (``scheduler-fire-read:<node_id>``) and write lanes (``scheduler-fire-write0:<node_id>``, ...)."""
    return f"scheduler-fire-%:{node_id}"


def backend_pids(conn: psycopg.Connection, application_name: str) -> list[int]:
    """Backends of this database whose ``application_name`` is LIKE the pattern given
    (e.g. ``scheduler-lease:n2``, or :func:`firing_sessions`)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE %s",
        (application_name,),
    ).fetchall()
    return [row["pid"] for row in rows]


def blocked_backends(
    conn: psycopg.Connection, application_name: str, blocker_pid: int, waiting_mode: str | None = None
) -> list[int]:
    """Backends whose ``application_name`` is LIKE the pattern given, waiting on a lock held by ``blocker_pid``.

    ``waiting_mode`` narrows it to backends with an ungranted lock of that mode
    (e.g. ``AccessShareLock``: a plain read waiting on a table lock).
    """
    rows = conn.execute(
        "SELECT a.pid FROM pg_stat_activity AS a"
        " WHERE a.datname = current_database() AND a.application_name LIKE %(app)s"
        "   AND %(blocker)s = ANY(pg_blocking_pids(a.pid))"
        "   AND (%(mode)s::text IS NULL OR EXISTS (SELECT 1 FROM pg_locks AS l"
        "        WHERE l.pid = a.pid AND NOT l.granted AND l.mode = %(mode)s::text))",
        {"app": application_name, "blocker": blocker_pid, "mode": waiting_mode},
    ).fetchall()
    return [row["pid"] for row in rows]


def running_queries(conn: psycopg.Connection, pids: list[int]) -> list[str]:
    """The SQL text each backend of ``pids`` is running (or last ran)."""
    rows = conn.execute("SELECT query FROM pg_stat_activity WHERE pid = ANY(%s::int4[])", (pids,)).fetchall()
    return [row["query"] for row in rows]


def in_transaction(conn: psycopg.Connection, application_name: str) -> list[int]:
    """Backends whose ``application_name`` is LIKE the pattern given, inside a transaction (holding its locks)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE %s AND xact_start IS NOT NULL",
        (application_name,),
    ).fetchall()
    return [row["pid"] for row in rows]


def terminate_backends(conn: psycopg.Connection, pids: list[int]) -> int:
    """``pg_terminate_backend`` each pid; return how many were signalled."""
    rows = conn.execute("SELECT pg_terminate_backend(pid) AS ok FROM unnest(%s::int4[]) AS pid", (pids,)).fetchall()
    return sum(1 for row in rows if row["ok"])


@contextlib.contextmanager
def locked(dsn: str, statement: str, params: Any = None) -> Iterator[psycopg.Connection]:
    """Hold the locks ``statement`` takes in an open transaction for the ``with`` body."""
    with psycopg.connect(dsn, application_name="pytest-locker") as lock_conn:
        with lock_conn.transaction():
            lock_conn.execute(statement, params)
            yield lock_conn


def snapshot_store(conn: psycopg.Connection) -> None:
    """Copy what firing and the lease loop write (fences, leases, jobs' slots, runs, skips)
    into ``snap_*`` tables, in one transaction: the state a store rewound by
    :func:`rewind_store` goes back to (an asynchronous replica's, a backup's)."""

    def body(c: psycopg.Connection) -> None:
        c.execute("CREATE TABLE snap_partitions AS SELECT partition_id, owner_node, owner_epoch FROM partitions")
        c.execute("CREATE TABLE snap_leases AS SELECT * FROM leases")
        c.execute("CREATE TABLE snap_jobs AS SELECT job_id, next_nominal_at, next_due_at FROM jobs")
        c.execute("CREATE TABLE snap_runs AS SELECT partition_id, job_id, nominal_time FROM runs")
        c.execute("CREATE TABLE snap_skips AS SELECT * FROM skips")

    store.run_transaction(conn, body)


def rewind_store(conn: psycopg.Connection, *, leases: bool = True) -> list[dict]:
    """Put the store back to :func:`snapshot_store`'s copy in one transaction, as a
    failover to a lagging replica would; return the runs that vanished
    (``partition_id, job_id, nominal_time``), by nominal time then job.

    ``leases=False`` leaves the fence and lease rows as they are (a lost
    window that held runs but no claim and no renewal): only jobs' slots,
    skips and runs go back."""

    def body(c: psycopg.Connection) -> list[dict]:
        if leases:
            c.execute(
                "UPDATE partitions AS p SET owner_node = s.owner_node, owner_epoch = s.owner_epoch"
                " FROM snap_partitions AS s WHERE p.partition_id = s.partition_id"
            )
            c.execute(
                "UPDATE leases AS l SET owner_node = s.owner_node, owner_epoch = s.owner_epoch,"
                " lease_expires_at = s.lease_expires_at, acquired_at = s.acquired_at, renewed_at = s.renewed_at"
                " FROM snap_leases AS s WHERE l.partition_id = s.partition_id"
            )
        c.execute(
            "UPDATE jobs AS j SET next_nominal_at = s.next_nominal_at, next_due_at = s.next_due_at"
            " FROM snap_jobs AS s WHERE j.job_id = s.job_id"
        )
        c.execute(
            "DELETE FROM skips AS k WHERE NOT EXISTS (SELECT 1 FROM snap_skips AS s"
            " WHERE (s.partition_id, s.job_id, s.first_nominal) = (k.partition_id, k.job_id, k.first_nominal))"
        )
        return c.execute(
            "DELETE FROM runs AS r WHERE NOT EXISTS (SELECT 1 FROM snap_runs AS s"
            " WHERE (s.partition_id, s.job_id, s.nominal_time) = (r.partition_id, r.job_id, r.nominal_time))"
            " RETURNING r.partition_id, r.job_id, r.nominal_time"
        ).fetchall()

    gone = store.run_transaction(conn, body)
    return sorted(gone, key=lambda row: (row["nominal_time"], str(row["job_id"])))


def runs_present(conn: psycopg.Connection, keys: list[dict]) -> int:
    """How many of the runs ``keys`` (``partition_id, job_id, nominal_time``) the store holds."""
    return conn.execute(
        "SELECT count(*) AS n FROM runs AS r"
        " JOIN unnest(%s::int4[], %s::uuid[], %s::timestamptz[]) AS k (pid, jid, nominal)"
        "   ON (r.partition_id, r.job_id, r.nominal_time) = (k.pid, k.jid, k.nominal)",
        (
            [k["partition_id"] for k in keys],
            [k["job_id"] for k in keys],
            [k["nominal_time"] for k in keys],
        ),
    ).fetchone()["n"]


# ---------------------------------------------------------------- history


@dataclasses.dataclass
class History:
    """What :func:`check_history` found (all invariants held)."""

    since: datetime
    until: datetime
    report: VerifyReport
    runs_by_node: Counter
    epoch_regressions: int
    shared_epochs: int
    future_epochs: int


def check_history(conn: psycopg.Connection, since: datetime, until: datetime) -> History:
    """The history check every cluster test ends with; raises AssertionError on a violation.

    * ``verify`` over ``[since, until)``: something was expected, and nothing is
      missing, duplicated, unexpected or early, and every skip is valid;
    * over every run fired since ``since``: per partition in ``fired_at``
      order, no run's epoch is below an earlier run's (a stale owner never
      commits after a newer epoch committed); no (partition, epoch) was used
      by two nodes; no run's epoch is above its partition's current epoch.
    """
    report = verify(conn, since, until)
    assert report.expected > 0, f"nothing was expected in [{since}, {until}): {report}"
    assert (report.missing, report.duplicates, report.unexpected, report.early, report.skips_invalid) == (
        0,
        0,
        0,
        0,
        0,
    ), f"verify failed: {report}"

    def invariants(c: psycopg.Connection) -> tuple[int, int, int, Counter]:
        regressions = c.execute(
            "SELECT count(*) AS n FROM ("
            "  SELECT epoch, max(epoch) OVER (PARTITION BY partition_id ORDER BY fired_at, epoch"
            "                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before"
            "  FROM runs WHERE fired_at >= %s) AS r"
            " WHERE r.epoch < r.before",
            (since,),
        ).fetchone()["n"]
        shared = c.execute(
            "SELECT count(*) AS n FROM ("
            "  SELECT 1 FROM runs WHERE fired_at >= %s"
            "  GROUP BY partition_id, epoch HAVING count(DISTINCT node_id) > 1) AS s",
            (since,),
        ).fetchone()["n"]
        future = c.execute(
            "SELECT count(*) AS n FROM runs AS r JOIN partitions AS p USING (partition_id)"
            " WHERE r.fired_at >= %s AND r.epoch > p.owner_epoch",
            (since,),
        ).fetchone()["n"]
        by_node = Counter(
            {
                row["node_id"]: row["n"]
                for row in c.execute(
                    "SELECT node_id, count(*) AS n FROM runs WHERE fired_at >= %s GROUP BY node_id", (since,)
                )
            }
        )
        return regressions, shared, future, by_node

    # One snapshot, retried whole on 40001: at SERIALIZABLE a read beside firing nodes may be
    # canceled ("conflict out to pivot"), which is the store's to retry, not a broken invariant.
    regressions, shared, future, by_node = store.run_transaction(conn, invariants)
    history = History(since, until, report, by_node, regressions, shared, future)
    assert (regressions, shared, future) == (0, 0, 0), f"fencing invariant broken: {history}"
    return history


# ---------------------------------------------------------------- cluster


@dataclasses.dataclass(frozen=True)
class EtcdKeys:
    """One read of a fleet's keys in etcd: live members and partition owners."""

    revision: int
    members: frozenset[str]
    owners: dict[int, str]
    """``{partition: node id}`` of every partition key present."""


def etcd_keys(endpoint: str, prefix: str) -> EtcdKeys:
    """Read ``<prefix>members/`` and ``<prefix>partitions/`` (JSON gateway)."""
    revision, kvs = range_prefix(endpoint, prefix)
    members, owners = set(), {}
    for kv in kvs:
        rest = kv["key"][len(prefix) :]
        if rest.startswith("members/"):
            members.add(rest[len("members/") :])
        elif rest.startswith("partitions/"):
            owners[int(rest[len("partitions/") :])] = kv["value"]
    return EtcdKeys(revision, frozenset(members), owners)


class Cluster:
    """The node processes of one test on one database (see the ``cluster`` fixture).

    ``coordinator`` is ``sql`` or ``etcd`` (then ``etcd_endpoint`` and
    ``etcd_prefix`` say where this test's keys live).
    """

    def __init__(
        self,
        dsn: str,
        conn: psycopg.Connection,
        log_dir: Path,
        timings: Timings = TIMINGS,
        coordinator: str = "sql",
        etcd_endpoint: str | None = None,
        etcd_prefix: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.conn = conn
        self.log_dir = log_dir
        self.timings = timings
        self.coordinator = coordinator
        self.etcd_endpoint = etcd_endpoint
        self.etcd_prefix = etcd_prefix
        self.nodes: dict[str, ClusterNode] = {}
        self._retired: list[ClusterNode] = []
        self._generation: Counter = Counter()

    @property
    def etcd(self) -> bool:
        return self.coordinator == "etcd"

    def coordinator_flags(self) -> list[str]:
        """The ``scheduler node`` flags choosing this cluster's coordinator."""
        if not self.etcd:
            return []
        return ["--coordinator", "etcd", "--etcd-endpoints", self.etcd_endpoint, "--etcd-prefix", self.etcd_prefix]

    def spawn(self, node_id: str, extra_flags: list[str] | None = None, dsn: str | None = None) -> ClusterNode:
        """Start a node (a restart under an existing id gets a fresh ClusterNode).

        ``dsn`` overrides the store DSN the node gets (e.g. through a relay)."""
        self._generation[node_id] += 1
        log_path = self.log_dir / f"{node_id}.{self._generation[node_id]}.log"
        node = ClusterNode(
            dsn or self.dsn, node_id, log_path, self.timings, [*self.coordinator_flags(), *(extra_flags or [])]
        )
        old = self.nodes.get(node_id)
        if old is not None:
            self._retired.append(old)
        self.nodes[node_id] = node
        return node.start()

    def all_processes(self) -> list[ClusterNode]:
        """Every process spawned, including replaced ones (restarts)."""
        return [*self._retired, *self.nodes.values()]

    def check_alive(self) -> None:
        for node in self.nodes.values():
            node.check_alive()

    def wait_for(
        self,
        what: str,
        probe: Callable[[], T],
        predicate: Callable[[T], bool] = bool,
        *,
        timeout_s: float,
        interval_s: float = 0.05,
    ) -> T:
        """:func:`wait_for` that also fails as soon as a node that should run has exited."""
        return wait_for(what, probe, predicate, timeout_s=timeout_s, interval_s=interval_s, check=self.check_alive)

    def now(self) -> datetime:
        return store_now(self.conn)

    def etcd_keys(self) -> EtcdKeys:
        assert self.etcd, "not an etcd cluster"
        return etcd_keys(self.etcd_endpoint, self.etcd_prefix)

    def ownership(self) -> dict[str, int]:
        """``{node_id: partitions it owns live}`` for live nodes.

        SQL: ``scheduler status``'s view (heartbeats and lease rows, store
        time). etcd: members and partition keys in etcd, counting a partition
        only if the store's row names the same owner (its epoch was written).
        """
        if not self.etcd:
            return ownership(self.conn, self.timings)
        keys = self.etcd_keys()
        rows = partitions(self.conn)
        counts = {member: 0 for member in keys.members}
        for pid, owner in keys.owners.items():
            if owner in counts and rows[pid].owner_node == owner:
                counts[owner] += 1
        return counts

    def partitions(self) -> dict[int, PartitionRow]:
        """:func:`partitions`; with etcd, ``lease_live`` means the partition's key
        exists in etcd for the owner the store names (the store's lease columns
        are only written at claim time)."""
        rows = partitions(self.conn)
        if not self.etcd:
            return rows
        owners = self.etcd_keys().owners
        return {
            pid: dataclasses.replace(row, lease_live=row.owner_node is not None and owners.get(pid) == row.owner_node)
            for pid, row in rows.items()
        }

    def wait_balanced(self, nodes: list[str], timeout_s: float = 15.0) -> dict[str, int]:
        """Wait until exactly ``nodes`` are live, own all 1,024 partitions, none above its share."""
        return self.wait_for(
            f"{nodes} to own all partitions within their share",
            self.ownership,
            lambda counts: balanced(counts, nodes),
            timeout_s=timeout_s,
        )

    def wait_fired(
        self, node_id: str, after: datetime, pids: list[int] | None = None, timeout_s: float = 10.0
    ) -> list[dict]:
        """Wait until ``node_id`` has committed runs fired after ``after`` (in ``pids``); return them."""
        where = "" if pids is None else f" in {len(pids)} partitions"
        return self.wait_for(
            f"runs by {node_id}{where} fired after {after}",
            lambda: runs_by(self.conn, node_id, pids=pids, fired_after=after),
            timeout_s=timeout_s,
        )

    def stop_all(self) -> dict[str, int]:
        """SIGTERM every running node; each must exit 0 and report (``node_stopped``)
        as many runs fired as the store holds under its node id (for ids started
        once). Returns ``{node_id: runs_fired}``."""
        fired = {}
        for node_id, node in self.nodes.items():
            if node.returncode() is not None:
                continue
            assert node.terminate() == 0, f"{node_id} exited with {node.returncode()}:\n{node.tail()}"
            stopped = node.events_named("node_stopped")
            assert len(stopped) == 1, node.tail()
            fired[node_id] = stopped[0]["runs_fired"]
            if self._generation[node_id] == 1:
                in_store = self.conn.execute(
                    "SELECT count(*) AS n FROM runs WHERE node_id = %s", (node_id,)
                ).fetchone()["n"]
                assert fired[node_id] == in_store, (node_id, fired[node_id], in_store)
        return fired

    def at_mid_tick(
        self,
        node_id: str,
        lock_sql: str,
        params: Any,
        action: Callable[[list[int]], None],
        waiting_mode: str | None = None,
        statement: str | None = None,
        attempts: int = 5,
    ) -> datetime:
        """Run ``action(backend_pids)`` while ``node_id`` is inside a firing tick.

        Just before a tick that has due work (ticks are phased onto wall-clock
        seconds), takes the locks of ``lock_sql`` on a separate connection,
        waits until one of the node's firing sessions waits on them (with an
        ungranted lock of ``waiting_mode``, if given), calls ``action`` with
        those sessions' backend pids, then releases the locks. Returns the
        store time just before the locks were taken. The node's
        ``lock_timeout`` must outlast the few milliseconds this takes.

        ``statement``: a fragment of the SQL text the waiting session must be
        running (``pg_stat_activity.query``). Another statement of the tick may
        reach the lock first (the rewind check after a reconnect reads jobs
        before the due scan does): the locks are then released and the next
        tick tried, up to ``attempts`` ticks.
        """
        for _ in range(attempts):
            sleep_until_wall_fraction(0.85)
            before = self.now()
            with locked(self.dsn, lock_sql, params) as lock_conn:
                blocker = lock_conn.info.backend_pid
                waiting = self.wait_for(
                    f"{node_id}'s firing session to wait on the test's lock",
                    lambda: blocked_backends(self.conn, firing_sessions(node_id), blocker, waiting_mode),
                    timeout_s=3.0,
                    interval_s=0.005,
                )
                if statement is None or all(statement in query for query in running_queries(self.conn, waiting)):
                    action(waiting)
                    return before
        raise AssertionError(f"{node_id}'s tick never waited on the test's lock in a statement with {statement!r}")

    def finish(self, since: datetime, covering: datetime | None = None, timeout_s: float = 20.0) -> History:
        """Close the test's window, wait until the nodes have fired every slot
        before its end, and run :func:`check_history` over ``[since, until)``.

        ``until`` is the store's current second, or, if later, the second
        :data:`AFTERMATH_S` after ``covering`` (the last disruption), so the
        audited window always includes steady firing after the recovery.
        """
        until = self.now().replace(microsecond=0)
        if covering is not None:
            until = max(until, (covering + timedelta(seconds=AFTERMATH_S)).replace(microsecond=0))
            self.wait_for(
                f"the store clock to pass {until}", self.now, lambda now: now >= until, timeout_s=AFTERMATH_S + 1.0
            )
        self.wait_for(
            f"every job to fire its slots before {until}",
            lambda: lagging_jobs(self.conn, until),
            lambda n: n == 0,
            timeout_s=timeout_s,
        )
        return check_history(self.conn, since, until)

    def teardown(self) -> None:
        """Kill every process ever spawned; print each one's log tail (shown on failure)."""
        for node in self.all_processes():
            node.destroy()
        for node in self.all_processes():
            print(f"---- {node.log_path.name} (exit {node.returncode()}) ----")
            print(node.tail(40))
