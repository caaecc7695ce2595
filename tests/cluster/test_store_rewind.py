"""A store that went back in time: an asynchronous failover lost its tail (or a backup was restored).

No Patroni here: the test copies what firing and the lease loop write
(:func:`harness.snapshot_store`), lets a node fire and renew past that
point, then cuts the node off (:meth:`relay.FreezingRelay.cut`, the old
primary gone), puts the store back to the copy in one transaction
(:func:`harness.rewind_store`, the replica promoted without the lost tail)
and lets the node reconnect. The node must notice, exactly once per
partition (``scheduler_store_rewind_detected_total``, the ``store_rewound``
WARNING), carry on fenced, and fire again the slots whose runs vanished,
with the same run identity; ``verify`` then finds every slot exactly once.

Three rewinds:

``renewals``
    the copy is taken while the node holds every partition: the rewind
    loses renewals (and runs) but no claim. The node's next renewal finds
    each lease row's ``renewed_at`` older than the value its last renewal
    wrote: 1,024 partitions, and the leases stay held.
``claims``
    the copy is taken before the node starts: the rewind loses its claims
    too. Its renewals miss every lease (lost); the fence rows it then reads
    show epoch 0 below the epoch 1 it held (a tick's fence may reject the
    partitions with due jobs first: dropped, they are seen when claimed
    again at an epoch not above the one held): 1,024 partitions in all; it
    claims them again (epoch 1 again, see :mod:`scheduler.coordination.rewind`
    for why that is safe) without counting any twice.
``runs only`` (its own test)
    the usual asynchronous loss: the fence and lease rows are left as they
    were, only jobs' slots and runs go back, so neither the epochs nor the
    renewals show anything. The firer's check of the last run it committed
    per partition, on its first tick after reconnecting, names exactly the
    partitions whose runs vanished.

In the first two the firer's check also sees the partitions whose runs
vanished (``seen="runs"``); one rewind seen two ways counts once.
"""

from __future__ import annotations

import re
import time
import urllib.request

import pytest
from harness import MARGIN_S, Cluster, add_interval_jobs, partitions, rewind_store, runs_present, snapshot_store

from scheduler.partition import PARTITION_COUNT

pytestmark = pytest.mark.cluster

JOBS = 100
"""Interval jobs firing every second."""

COUNTER = "scheduler_store_rewind_detected_total"


def rewinds_counted(port: int) -> float:
    """The node's ``scheduler_store_rewind_detected_total`` (from ``/metrics``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{COUNTER} (\S+)$", text, re.MULTILINE)
    assert match, f"{COUNTER} not exported"
    return float(match.group(1))


@pytest.mark.parametrize("lost", ["renewals", "claims"])
def test_a_rewound_store_is_detected_once_per_partition_and_the_lost_slots_fire_again(
    cluster: Cluster, pg_dsn, relay, lost: str
) -> None:
    conn = cluster.conn
    add_interval_jobs(conn, JOBS)
    since = cluster.now()
    if lost == "claims":
        snapshot_store(conn)
    node = cluster.spawn("n1", ["--metrics-port", "0"], dsn=relay.dsn(pg_dsn))
    port = node.wait_event("metrics_listening", timeout_s=15)["port"]
    cluster.wait_balanced(["n1"])
    cluster.wait_fired("n1", cluster.now())
    if lost == "renewals":
        snapshot_store(conn)
        snapped = cluster.now()
        cluster.wait_for(
            "every lease renewed after the copy",
            lambda: conn.execute("SELECT count(*) AS n FROM leases WHERE renewed_at > %s", (snapped,)).fetchone()["n"],
            lambda n: n == PARTITION_COUNT,
            timeout_s=5 + MARGIN_S,
        )
        cluster.wait_fired("n1", snapped)  # runs the rewind will lose
    assert rewinds_counted(port) == 0

    relay.cut()
    cut_mono = time.monotonic()
    vanished = rewind_store(conn)
    assert vanished, "the rewind lost no run"
    assert runs_present(conn, vanished) == 0
    relay.restore()
    restored = cluster.now()

    # One record per way it was seen: with "claims", a tick's fence may reject the partitions
    # with due jobs first (dropped, then claimed again: seen at the claim), the renewal the rest.
    events = cluster.wait_for(
        "store_rewound records covering every partition",
        lambda: node.events_named("store_rewound", cut_mono),
        lambda found: sum(e["partitions"] for e in found) >= PARTITION_COUNT,
        timeout_s=10 + MARGIN_S,
    )
    assert {e["level"] for e in events} == {"warning"}
    # The firer's check of its last runs (seen "runs") may name the partitions whose runs
    # vanished first: one rewind seen two ways counts once (module rewind).
    assert {e["seen"] for e in events} <= ({"renewal", "runs"} if lost == "renewals" else {"fence", "claim", "runs"})
    assert all("same run id" in e["note"] for e in events)
    cluster.wait_for("the counter", lambda: rewinds_counted(port), lambda n: n == PARTITION_COUNT, timeout_s=5)
    cluster.wait_balanced(["n1"])
    refired_and_clean(cluster, vanished, since, restored)
    assert rewinds_counted(port) == PARTITION_COUNT  # counted once, not again at each renewal or claim
    assert sum(e["partitions"] for e in node.events_named("store_rewound")) == PARTITION_COUNT
    assert {row.owner_epoch for row in partitions(conn).values()} == {1}  # claimed once, or again at 1
    assert node.terminate() == 0


def test_a_rewind_that_lost_only_runs_is_seen_from_the_runs_the_node_committed(cluster: Cluster, pg_dsn, relay) -> None:
    """The usual asynchronous loss: a lag well under the renewal interval, so the lost
    window holds runs but no claim and no renewal (the fence and lease rows are left
    as they were: the epoch watch and the renewal watermarks see nothing). The
    firer remembers the last run it committed per partition and, on its first tick
    after reconnecting, finds those runs gone: one ``store_rewound`` record
    (``seen="runs"``) naming exactly the partitions whose runs vanished."""
    conn = cluster.conn
    job_ids = add_interval_jobs(conn, JOBS)
    since = cluster.now()
    node = cluster.spawn("n1", ["--metrics-port", "0"], dsn=relay.dsn(pg_dsn))
    port = node.wait_event("metrics_listening", timeout_s=15)["port"]
    cluster.wait_balanced(["n1"])
    cluster.wait_fired("n1", cluster.now())
    snapshot_store(conn)
    snapped = cluster.now()
    cluster.wait_for(
        "every job fired after the copy",
        lambda: jobs_fired_after(conn, snapped),
        lambda n: n == JOBS,
        timeout_s=5 + MARGIN_S,
    )
    # Pause firing (not through the node: it remembers nothing of this) so every run the
    # node commits before the cut was acknowledged to it: the runs it remembers are exactly
    # the last ones of the lost window.
    conn.execute("UPDATE jobs SET next_due_at = next_due_at + interval '1 day' WHERE job_id = ANY(%s)", (job_ids,))
    # A tick that read the due rows before the pause may still commit: wait for a quiet second.
    cluster.wait_for("firing paused", lambda: runs_fired_within(conn, 1.0), lambda n: n == 0, timeout_s=5 + MARGIN_S)
    assert rewinds_counted(port) == 0

    relay.cut()
    cut_mono = time.monotonic()
    vanished = rewind_store(conn, leases=False)  # jobs' slots back, runs gone, fences and leases untouched
    assert {row["job_id"] for row in vanished} == set(job_ids)
    rewound = sorted({row["partition_id"] for row in vanished})
    relay.restore()
    restored = cluster.now()

    events = cluster.wait_for(
        "a store_rewound record",
        lambda: node.events_named("store_rewound", cut_mono),
        lambda found: len(found) >= 1,
        timeout_s=10 + MARGIN_S,
    )
    assert [(e["level"], e["seen"], e["partitions"]) for e in events] == [("warning", "runs", len(rewound))]
    assert [s["partition"] for s in events[0]["sample"]] == rewound[: len(events[0]["sample"])]
    assert "same run id" in events[0]["note"]
    cluster.wait_for("the counter", lambda: rewinds_counted(port), lambda n: n == len(rewound), timeout_s=5)
    refired_and_clean(cluster, vanished, since, restored)
    assert rewinds_counted(port) == len(rewound)  # once: the runs checked again at a later reconnect are there
    assert len(node.events_named("store_rewound")) == 1
    assert node.terminate() == 0


def jobs_fired_after(conn, after) -> int:
    """Jobs with a run fired after ``after`` (store time)."""
    return conn.execute("SELECT count(DISTINCT job_id) AS n FROM runs WHERE fired_at > %s", (after,)).fetchone()["n"]


def runs_fired_within(conn, seconds: float) -> int:
    """Runs committed in the next ``seconds`` (sleeps that long; counts rows)."""
    before = conn.execute("SELECT count(*) AS n FROM runs").fetchone()["n"]
    time.sleep(seconds)
    return conn.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] - before


def refired_and_clean(cluster: Cluster, vanished: list[dict], since, restored) -> None:
    """Wait until every run in ``vanished`` is in the store again (same identity), then
    audit ``[since, …)`` past ``restored``: 0 missing, 0 duplicate."""
    cluster.wait_for(
        "every vanished run fired again",
        lambda: runs_present(cluster.conn, vanished),
        lambda n: n == len(vanished),
        timeout_s=10 + MARGIN_S,
    )
    history = cluster.finish(since, covering=restored, timeout_s=30)
    assert (history.report.missing, history.report.duplicates) == (0, 0)
