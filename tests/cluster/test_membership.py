"""Membership and claiming on one PostgreSQL (docs/design.md §2).

Real node processes: three converge on the 1,024 partitions, a fourth
joins and every node ends within its share, one leaves gracefully
(SIGTERM) and the rest absorb its partitions within about one poll.

The process test runs against both coordinators (``@both_coordinators``).
Racing claimers, increasing epochs and the other rules every coordinator
keeps are checked in process, against both, in ``test_coordinator_contract.py``.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from harness import (
    MARGIN_S,
    TIMINGS,
    Cluster,
    add_interval_jobs,
    both_coordinators,
    max_lateness_s,
    owned_by,
    partitions,
    run_cli,
)

from scheduler.coordination import fair_share

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
            node_id: (True, 256) for node_id in ("n1", "n2", "n3", "n4")
        }
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
    absorbed_s = (max(rows[pid].acquired_at for pid in handed_over) - _parse_ts(released[0]["ts"])).total_seconds()
    print(
        f"graceful leave: 256 partitions absorbed {absorbed_s:.3f}s after the release (poll {TIMINGS.poll_interval_s}s)"
    )
    assert absorbed_s <= TIMINGS.poll_interval_s + 1.0

    absorbed = cluster.now()
    for node_id in ("n1", "n3", "n4"):
        cluster.wait_fired(node_id, absorbed)

    history = cluster.finish(since, covering=absorbed)
    late_s = max_lateness_s(conn, handed_over, left_from)
    print(f"graceful leave: max lateness of its partitions {late_s:.3f}s; window {history.report}")
    assert late_s <= 2.0 + MARGIN_S  # docs/design.md §6: graceful stop costs ≤ 2 s
    # `scheduler verify --json` over the same window agrees.
    verify_cli = run_cli(
        "verify",
        "--dsn",
        cluster.dsn,
        "--since",
        history.since.isoformat(),
        "--until",
        history.until.isoformat(),
        "--json",
    )
    assert verify_cli.returncode == 0, verify_cli.stdout + verify_cli.stderr
    assert json.loads(verify_cli.stdout) == history.report.as_dict()
    cluster.stop_all()
