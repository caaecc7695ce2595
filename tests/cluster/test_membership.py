"""Membership and claiming on one PostgreSQL (docs/design.md §2).

* real node processes: three converge on the 1,024 partitions, a fourth
  joins and every node ends within its share, one leaves gracefully
  (SIGTERM) and the rest absorb its partitions within about one poll;
* in-process racing claimers (``SqlCoordinator.claim`` on threads released by
  a barrier): of concurrent claimers exactly one wins each free or expired
  partition, and its epoch goes up by exactly one.

The process test runs against both coordinators (``@both_coordinators``);
the etcd coordinator's own claim races and epoch checks are in
``test_etcd_coordinator.py``.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime

import psycopg
import pytest
from harness import (
    MARGIN_S,
    TIMINGS,
    Cluster,
    add_interval_jobs,
    both_coordinators,
    hold_all_but,
    max_lateness_s,
    owned_by,
    partitions,
    race_claims,
    run_cli,
)

from scheduler.lease import SqlCoordinator, fair_share
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings

pytestmark = pytest.mark.cluster

JOBS = 200
"""Interval jobs firing every second during each process test."""


def _parse_ts(value: str) -> datetime:
    """A JSON log record's ``ts`` (UTC, millisecond precision)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@both_coordinators
def test_nodes_converge_fourth_joins_one_leaves_gracefully(cluster: Cluster) -> None:
    conn = cluster.conn
    add_interval_jobs(conn, JOBS)
    since = cluster.now()

    for node_id in ("n1", "n2", "n3"):
        cluster.spawn(node_id)
    counts = cluster.wait_balanced(["n1", "n2", "n3"])
    assert max(counts.values()) <= fair_share(3) == 342, counts
    converged = cluster.now()
    for node_id in ("n1", "n2", "n3"):
        cluster.wait_fired(node_id, converged)

    cluster.spawn("n4")
    counts = cluster.wait_balanced(["n1", "n2", "n3", "n4"])
    assert sorted(counts.values()) == [256] * 4, counts  # 4 × 256 = 1,024: the share is exact
    joined = cluster.now()
    for node_id in ("n1", "n2", "n3", "n4"):
        cluster.wait_fired(node_id, joined)
    if not cluster.etcd:
        # `scheduler status --json` (judged with the nodes' TTL) sees the same.
        # (With etcd, membership and leases live in etcd: cluster.ownership() read them.)
        status_cli = run_cli("status", "--dsn", cluster.dsn, "--lease-ttl-s", str(TIMINGS.lease_ttl_s), "--json")
        assert status_cli.returncode == 0, status_cli.stderr
        status = json.loads(status_cli.stdout)
        assert {n["node_id"]: (n["live"], n["partitions"]) for n in status["nodes"]} == {
            node_id: (True, 256) for node_id in ("n1", "n2", "n3", "n4")}
        assert (status["partitions_owned_live"], status["partitions_orphaned"]) == (1024, 0)

    # Graceful leave: SIGTERM, the node finishes its tick, releases, exits 0.
    leaver = cluster.nodes["n2"]
    handed_over = sorted(owned_by(conn, "n2"))
    assert len(handed_over) == 256
    left_from = cluster.now()
    assert leaver.terminate() == 0
    released = [e for e in leaver.events_named("lease_released") if e["reason"] == "shutdown"]
    assert [e["partitions"] for e in released] == [256], released
    assert leaver.events_named("node_stopped"), leaver.tail()

    counts = cluster.wait_balanced(["n1", "n3", "n4"], timeout_s=TIMINGS.poll_interval_s + MARGIN_S)
    rows = partitions(conn)
    assert all(rows[pid].owner_node in ("n1", "n3", "n4") for pid in handed_over)
    absorbed_s = (max(rows[pid].acquired_at for pid in handed_over)
                  - _parse_ts(released[0]["ts"])).total_seconds()
    print(f"graceful leave: 256 partitions absorbed {absorbed_s:.3f}s after the release "
          f"(poll {TIMINGS.poll_interval_s}s)")
    assert absorbed_s <= TIMINGS.poll_interval_s + 1.0

    absorbed = cluster.now()
    for node_id in ("n1", "n3", "n4"):
        cluster.wait_fired(node_id, absorbed)

    history = cluster.finish(since, covering=absorbed)
    late_s = max_lateness_s(conn, handed_over, left_from)
    print(f"graceful leave: max lateness of its partitions {late_s:.3f}s; window {history.report}")
    assert late_s <= 2.0 + MARGIN_S  # docs/design.md §6: graceful stop costs ≤ 2 s
    # `scheduler verify --json` over the same window agrees.
    verify_cli = run_cli("verify", "--dsn", cluster.dsn, "--since", history.since.isoformat(),
                         "--until", history.until.isoformat(), "--json")
    assert verify_cli.returncode == 0, verify_cli.stdout + verify_cli.stderr
    assert json.loads(verify_cli.stdout) == history.report.as_dict()
    cluster.stop_all()


# ---------------------------------------------------------------- racing claimers


RACERS = 4


def _check_round(conn: psycopg.Connection, coordinators: list[SqlCoordinator],
                 results: list[list[tuple[int, int]]], free: list[int], before: dict[int, int]) -> None:
    """Each free partition won by exactly one claimer, epoch +1, and the store agrees."""
    wins = Counter(pid for result in results for pid, _ in result)
    assert sorted(wins) == sorted(free), "claimed set differs from the free set"
    assert max(wins.values()) == 1, f"partitions won twice: {[p for p, n in wins.items() if n > 1]}"
    rows = partitions(conn)
    for coordinator, result in zip(coordinators, results):
        for pid, epoch in result:
            assert epoch == before[pid] + 1, (pid, before[pid], epoch)
            assert (rows[pid].owner_node, rows[pid].owner_epoch) == (coordinator.node_id, epoch)
            assert rows[pid].lease_live


def test_racing_claimers_win_each_partition_once_with_increasing_epochs(
        pg_dsn: str, conn: psycopg.Connection) -> None:
    settings = [Settings(dsn=pg_dsn, node_id=f"racer-{i}", lease_ttl_s=TIMINGS.lease_ttl_s,
                         renew_interval_s=TIMINGS.renew_interval_s,
                         safety_margin_s=TIMINGS.safety_margin_s).validated() for i in range(RACERS)]
    coordinators = [SqlCoordinator(s, Metrics()) for s in settings]
    try:
        for coordinator in coordinators:
            coordinator.join()  # opens the connection before the race
        epochs = {pid: row.owner_epoch for pid, row in partitions(conn).items()}
        assert set(epochs.values()) == {0}

        # Round 0: all 1,024 free, every claimer asks for its fair share.
        results = race_claims(coordinators, fair_share(RACERS))
        assert all(len(result) <= fair_share(RACERS) for result in results)
        _check_round(conn, coordinators, results, list(range(PARTITION_COUNT)), epochs)
        epochs = {pid: row.owner_epoch for pid, row in partitions(conn).items()}

        # Rounds 1..: a few partitions free (released) or expired, the rest held
        # live; every claimer greedily asks for all, so they fight for the same rows.
        for round_no in range(1, 13):
            free = sorted({(round_no * 37 + k * 101) % PARTITION_COUNT for k in range(8)})
            hold_all_but(conn, free, expired=round_no % 2 == 0)
            results = race_claims(coordinators, PARTITION_COUNT)
            _check_round(conn, coordinators, results, free, epochs)
            after = {pid: row.owner_epoch for pid, row in partitions(conn).items()}
            assert all(after[pid] > epochs[pid] for pid in free)
            assert all(after[pid] == epochs[pid] for pid in after if pid not in free)
            epochs = after
    finally:
        for coordinator in coordinators:
            coordinator.close()
