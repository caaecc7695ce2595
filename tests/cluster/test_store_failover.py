"""The store fails over: a Patroni pair under two nodes, its primary's host killed or frozen.

One Patroni pair (PostgreSQL 15; a throwaway etcd of its own, v2 API on, as
the DCS; ``ttl`` 10 s, ``loop_wait`` 1 s, ``retry_timeout`` 3 s,
``synchronous_mode`` on) serves the module (:class:`scheduler.devtools.patroni_pair.PatroniPair`);
each test gets a fresh database on it, migrated by ``scheduler db upgrade``
through the multi-host DSN, and
two nodes (the harness' scaled-down timings: lease TTL 2 s) pointed at the
multi-host DSN ``postgresql://postgres@h:p1,h:p2/db?target_session_attrs=read-write``
with :data:`JOBS` one-second interval jobs. Before each test both members
run again (a member a previous test killed is restarted and rejoins as a
synchronous standby).

* the primary's host killed (its Patroni and its PostgreSQL, every process
  SIGKILLed): the standby is promoted, the nodes fire on it; over the whole
  window, read from the new primary, every (job, slot) ran exactly once
  (``verify`` in process and ``scheduler verify``), the fencing invariants
  hold, and the lateness of every run is at most Patroni's ttl + the lease
  TTL + :data:`FAILOVER_MARGIN_S`;
* the primary's host frozen (SIGSTOP: its sockets stay open, the kernel
  keeps acknowledging, so only the nodes' watchdog and connect timeout get
  them off it): the nodes fire on the new primary within
  :data:`RESUME_BOUND_S`; once thawed, the old primary is demoted by its
  Patroni (it accepts no write) and rejoins as a standby; the window is
  exact as above.

Without a ``patroni`` or ``etcd`` binary the tests FAIL when ``CI=true``
(``.ci/run`` installs Debian's ``patroni`` and ``etcd-server``) and are
skipped only outside CI.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from harness import (
    MARGIN_S,
    TIMINGS,
    Cluster,
    add_interval_jobs,
    max_lateness_s,
    run_cli,
    runs_by,
    sleep_until_wall_fraction,
)

from scheduler import store
from scheduler.devtools.etcd_server import EtcdUnavailable, ThrowawayEtcd, find_etcd
from scheduler.devtools.patroni_pair import Member, PatroniPair, PatroniUnavailable, find_patroni, find_pg_bin
from scheduler.partition import PARTITION_COUNT

pytestmark = pytest.mark.cluster

JOBS = 100
"""Interval jobs firing every second."""

NODES = ["n1", "n2"]

PATRONI = {"ttl": 10, "loop_wait": 1, "retry_timeout": 3}
"""Patroni's timings (seconds): a dead primary's leader key expires within ``ttl``."""

FAILOVER_MARGIN_S = MARGIN_S + 2.0
"""Slack on the kill's lateness bound (ttl + lease TTL): Patroni's loop_wait and
the promotion itself (~0.5 s here), the nodes' reconnection and a tick, on two
shared cores."""

RESUME_BOUND_S = PATRONI["ttl"] + TIMINGS.lease_ttl_s + 2 * 2.0 + 10.0
"""The nodes fire on the new primary within this of the freeze: the leader key's
ttl, the lease TTL, two connect timeouts (2 s each) spent on the frozen host's
listening socket, and a generous 10 s for the watchdog breaking the calls stuck
on it, Patroni's loop and the shared cores."""

REJOIN_TIMEOUT_S = 90.0
"""A restarted or thawed member rejoins as a standby within this (pg_rewind or a new base backup)."""

_databases = itertools.count(1)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def pair() -> Iterator[PatroniPair]:
    """The module's Patroni pair and its own etcd (see the module docstring); stopped and removed at the end."""
    if find_patroni() is None or find_pg_bin() is None or find_etcd() is None:
        message = (
            "no patroni, etcd or PostgreSQL server binaries: the store failover tests need them; "
            "apt-get install patroni etcd-server postgresql-15, or set SCHEDULER_PATRONI_BIN"
        )
        if _in_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(f"{message} (skipped outside CI only)")
    etcd = ThrowawayEtcd(enable_v2=True)  # Patroni's etcd (v2) client: see PatroniPair
    try:
        etcd.start()
    except EtcdUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    server = PatroniPair(etcd.endpoint, synchronous=True, **PATRONI)
    try:
        server.start()
    except PatroniUnavailable as exc:
        etcd.stop()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        print(server.log_tails(40))
        server.stop()
        etcd.stop()


def _healthy(pair: PatroniPair) -> Member:
    """Both members running again (a killed one restarted, a frozen one thawed), one
    leading and the other its synchronous standby; return the leader."""
    for member in pair.members:
        if member.frozen:
            pair.thaw(member)
        if member.proc is None or member.proc.poll() is not None:
            pair.spawn(member)
    leader = pair.wait_leader(timeout_s=REJOIN_TIMEOUT_S)
    for member in pair.members:
        if member is not leader:
            pair.wait_streaming(member, timeout_s=REJOIN_TIMEOUT_S)
    return leader


@pytest.fixture
def ha_cluster(pair: PatroniPair, tmp_path: Path) -> Iterator[Cluster]:
    """Nodes of one test on a fresh database of the pair, through its multi-host DSN."""
    leader = _healthy(pair)
    dbname = f"failover_{next(_databases)}"
    with psycopg.connect(leader.dsn(), autocommit=True, connect_timeout=5) as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
        isolation = os.environ.get("SCHEDULER_TEST_ISOLATION")
        if isolation:  # on this database only: a standby refuses serializable (Patroni's own queries)
            admin.execute(f"ALTER DATABASE {dbname} SET default_transaction_isolation = '{isolation}'")
    dsn = pair.multi_host_dsn(dbname, connect_timeout="2")
    migrated = run_cli("db", "upgrade", "--dsn", dsn)  # through both hosts: libpq finds the primary
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    group = Cluster(dsn, store.connect(dsn), tmp_path)
    try:
        yield group
    finally:
        group.teardown()
        with contextlib.suppress(Exception):
            group.conn.close()


def _reconnect(cluster: Cluster) -> None:
    """A new store connection for the test's probes (the old one went with the primary)."""
    with contextlib.suppress(Exception):
        cluster.conn.close()
    cluster.conn = store.connect(cluster.dsn)


def _start(cluster: Cluster) -> datetime:
    """Add the jobs, start both nodes, wait until balanced and both firing; return the window start."""
    add_interval_jobs(cluster.conn, JOBS)
    since = cluster.now()
    for node_id in NODES:
        cluster.spawn(node_id)
    cluster.wait_balanced(NODES, timeout_s=30)
    balanced_at = cluster.now()
    for node_id in NODES:
        cluster.wait_fired(node_id, balanced_at)
    return since


def _wait_all_firing(cluster: Cluster, after: datetime, timeout_s: float) -> datetime:
    """Wait until every node has committed runs fired after ``after``; return the store time then."""
    cluster.wait_for(
        f"{NODES} to fire on the new primary after {after}",
        lambda: [bool(runs_by(cluster.conn, node_id, fired_after=after)) for node_id in NODES],
        all,
        timeout_s=timeout_s,
        interval_s=0.2,
    )
    return cluster.now()


def _verify_cli(cluster: Cluster, since: datetime, until: datetime) -> dict:
    """``scheduler verify --json`` over the window through the multi-host DSN: must pass."""
    result = run_cli(
        "verify", "--dsn", cluster.dsn, "--since", since.isoformat(), "--until", until.isoformat(), "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["expected"] > 0 and report["runs"] == report["expected"], report
    assert (report["missing"], report["duplicates"], report["unexpected"], report["early"]) == (0, 0, 0, 0), report
    return report


def _stop_nodes(cluster: Cluster) -> None:
    """SIGTERM every node: each must exit 0 (its last leases released on the new primary)."""
    for node_id, node in cluster.nodes.items():
        assert node.terminate() == 0, f"{node_id} exited with {node.returncode()}:\n{node.tail()}"


def test_primary_host_killed_nodes_fire_on_the_promoted_standby_exactly_once(
    pair: PatroniPair, ha_cluster: Cluster
) -> None:
    cluster = ha_cluster
    since = _start(cluster)
    old = pair.leader()
    assert old is not None

    sleep_until_wall_fraction(0.9)  # just before a tick: the worst case for lateness
    killed_at = cluster.now()
    started = time.monotonic()
    pair.kill(old)
    new = pair.wait_leader(exclude=old, timeout_s=PATRONI["ttl"] + PATRONI["loop_wait"] + 20)
    promoted_s = time.monotonic() - started
    _reconnect(cluster)
    resumed_at = _wait_all_firing(cluster, killed_at, timeout_s=PATRONI["ttl"] + TIMINGS.lease_ttl_s + 30)
    cluster.wait_balanced(NODES, timeout_s=30)

    history = cluster.finish(since, covering=resumed_at)
    assert (history.report.missing, history.report.duplicates) == (0, 0)
    assert history.report.runs == history.report.expected
    late_s = max_lateness_s(cluster.conn, list(range(PARTITION_COUNT)), killed_at - timedelta(seconds=1))
    bound_s = PATRONI["ttl"] + TIMINGS.lease_ttl_s + FAILOVER_MARGIN_S
    print(
        f"\nprimary {old.name} killed: {new.name} writable after {promoted_s:.1f}s, both nodes firing "
        f"{(resumed_at - killed_at).total_seconds():.1f}s after the kill; max lateness {late_s:.2f}s "
        f"(bound ttl {PATRONI['ttl']} + TTL {TIMINGS.lease_ttl_s} + {FAILOVER_MARGIN_S}); window {history.report}"
    )
    assert late_s <= bound_s
    _verify_cli(cluster, history.since, history.until)
    _stop_nodes(cluster)


def test_primary_host_frozen_nodes_resume_on_the_new_primary_and_the_old_one_is_demoted(
    pair: PatroniPair, ha_cluster: Cluster
) -> None:
    cluster = ha_cluster
    since = _start(cluster)
    old = pair.leader()
    assert old is not None
    dbname = cluster.dsn.rsplit("/", 1)[1].split("?", 1)[0]

    sleep_until_wall_fraction(0.9)
    frozen_at = cluster.now()
    started = time.monotonic()
    pair.freeze(old)
    try:
        new = pair.wait_leader(exclude=old, timeout_s=PATRONI["ttl"] + PATRONI["loop_wait"] + 20)
        promoted_s = time.monotonic() - started
        _reconnect(cluster)  # the probes' connection to the frozen host would hang
        resumed_at = _wait_all_firing(cluster, frozen_at + timedelta(seconds=1), timeout_s=RESUME_BOUND_S)
        resumed_s = (resumed_at - frozen_at).total_seconds()
    finally:
        pair.thaw(old)

    # Thawed, the old primary finds its leader key gone: its Patroni demotes it and it rejoins.
    pair.wait_streaming(old, timeout_s=REJOIN_TIMEOUT_S)
    assert not pair.writable(old)
    # (read committed: a standby refuses the serializable isolation the database may default to)
    with psycopg.connect(
        old.dsn(dbname), autocommit=True, connect_timeout=5, options=r"-c default_transaction_isolation=read\ committed"
    ) as direct:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            direct.execute("CREATE TABLE written_on_the_old_primary (x int)")
    cluster.wait_balanced(NODES, timeout_s=30)

    history = cluster.finish(since, covering=cluster.now())
    assert (history.report.missing, history.report.duplicates) == (0, 0)
    assert history.report.runs == history.report.expected
    late_s = max_lateness_s(cluster.conn, list(range(PARTITION_COUNT)), frozen_at - timedelta(seconds=1))
    print(
        f"\nprimary {old.name} frozen: {new.name} writable after {promoted_s:.1f}s, both nodes firing "
        f"{resumed_s:.1f}s after the freeze; max lateness {late_s:.2f}s; window {history.report}"
    )
    assert resumed_s <= RESUME_BOUND_S
    _verify_cli(cluster, history.since, history.until)
    _stop_nodes(cluster)
