"""The store goes away for everyone for longer than the lease TTL, then comes back.

Three nodes reach the store through one :class:`relay.FreezingRelay`; the
test :meth:`~relay.FreezingRelay.cut`\\ s it (every connection closed, new
ones refused) for longer than the TTL, so every heartbeat and every lease
in the store is older than the TTL when it is
:meth:`~relay.FreezingRelay.restore`\\ d. The nodes reconnect within about
one renewal interval of each other. Each must rebuild membership before it
claims (heartbeat, then one responsiveness interval for the peers'
heartbeats to land; its own leases renewed meanwhile), so:

* no node ever holds more than its fair share of the lease rows (the store,
  sampled from the restore on): nobody claims the others' expired leases;
* no lease is lost (``lease_lost``) and no firing is fenced off;
* ``verify`` over the whole window: every (job, slot) exactly once.

With the etcd coordinator (the second parameter) membership and leases
live in etcd, which the cut does not reach: keep-alives go on, nobody's
membership lapses, so no node logs ``store_rejoined`` and the same
assertions hold without the wait (claims fail while the store is away,
since the epoch is written there).

Timings: TTL 4 s, renew 1 s, poll 0.5 s, so the responsiveness interval is
2 s, twice the renewal interval after which a node retries the store: the
nodes' reconnections (≤ ~1 s apart) fall well inside one another's wait.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from harness import MARGIN_S, Cluster, Timings, add_interval_jobs, partitions

from scheduler.coordination import fair_share

pytestmark = pytest.mark.cluster

TIMINGS = Timings(lease_ttl_s=4.0, renew_interval_s=1.0, poll_interval_s=0.5)

NODES = ["n1", "n2", "n3"]

JOBS = 150
"""Interval jobs firing every second."""

OUTAGE_S = TIMINGS.lease_ttl_s + 2.0
"""How long the store stays away: longer than the TTL, so every lease and heartbeat has expired."""

WATCH_S = 3 * TIMINGS.responsive_s + MARGIN_S
"""How long after the restore the lease rows are sampled."""


def _owners(cluster: Cluster) -> Counter:
    """Lease rows per owning node (live or expired), from the store."""
    return Counter(row.owner_node for row in partitions(cluster.conn).values() if row.owner_node is not None)


@pytest.mark.parametrize("coordinator", ["sql", "etcd"])
def test_nodes_rebuild_membership_before_claiming_after_an_outage_longer_than_the_ttl(
    request, tmp_path, pg_dsn, conn, relay, coordinator: str
) -> None:
    if coordinator == "etcd":
        cluster = Cluster(
            pg_dsn,
            conn,
            tmp_path,
            timings=TIMINGS,
            coordinator="etcd",
            etcd_endpoint=request.getfixturevalue("etcd_server").endpoint,
            etcd_prefix=request.getfixturevalue("etcd_prefix"),
        )
    else:
        cluster = Cluster(pg_dsn, conn, tmp_path, timings=TIMINGS)
    try:
        add_interval_jobs(conn, JOBS)
        since = cluster.now()
        for node_id in NODES:
            cluster.spawn(node_id, dsn=relay.dsn(pg_dsn))
        cluster.wait_balanced(NODES, timeout_s=30)
        for node_id in NODES:
            cluster.wait_fired(node_id, cluster.now())
        share = fair_share(len(NODES))
        before = _owners(cluster)
        assert max(before.values()) <= share, before

        cut_mono = time.monotonic()
        assert relay.cut() >= len(NODES)
        time.sleep(OUTAGE_S)
        expired = cluster.wait_for(
            "every lease to have expired in the store",
            lambda: partitions(conn),
            lambda rows: not any(row.lease_live for row in rows.values()),
            timeout_s=MARGIN_S,
        )
        assert len(expired) == 1024
        relay.restore()
        restored = cluster.now()

        peaks: Counter = Counter()
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            cluster.check_alive()
            for node_id, count in _owners(cluster).items():
                peaks[node_id] = max(peaks[node_id], count)
            time.sleep(0.05)
        assert max(peaks.values()) <= share, (peaks, share)
        cluster.wait_balanced(NODES, timeout_s=15)

        lost = {
            node_id: sum(e["partitions"] for e in node.events_named("lease_lost", cut_mono))
            for node_id, node in cluster.nodes.items()
        }
        assert lost == dict.fromkeys(NODES, 0)
        fenced = {node_id: len(node.events_named("fence_rejected")) for node_id, node in cluster.nodes.items()}
        assert fenced == dict.fromkeys(NODES, 0)
        rewound = {node_id: len(node.events_named("store_rewound")) for node_id, node in cluster.nodes.items()}
        assert rewound == dict.fromkeys(NODES, 0)  # an outage is not a rewind: the store kept every commit
        for node_id in NODES:
            rejoined = cluster.nodes[node_id].events_named("store_rejoined", cut_mono)
            assert len(rejoined) == (0 if cluster.etcd else 1), cluster.nodes[node_id].tail()
            assert all(e["wait_s"] == TIMINGS.responsive_s for e in rejoined)

        history = cluster.finish(since, covering=restored, timeout_s=30)
        assert (history.report.missing, history.report.duplicates) == (0, 0)
        # Not cluster.stop_all(): a firing COMMIT cut off by the relay may have committed
        # unanswered, so a node's own count of runs fired can be below the store's.
        for node_id in NODES:
            assert cluster.nodes[node_id].terminate() == 0
    finally:
        cluster.teardown()
