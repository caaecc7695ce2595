"""Failover with real node processes and real signals (docs/design.md §2, §6, §8).

Every test runs :data:`JOBS` interval jobs firing every second under the
scaled-down timings of ``harness.TIMINGS`` (TTL 2 s, renew 0.5 s, poll
0.25 s, tick 0.5 s), injects one named failure, asserts the mechanism with
generous bounds, and ends with ``check_history`` over its whole window
(every (job, nominal time) exactly once; epochs never go backwards).

* ``kill -9``: the dead node's partitions are claimed once its leases
  expire (never before), the overdue jobs fire, lateness ≤ TTL + poll + tick
  (+ margin);
* kill and restart at once under the same ``--node-id``: the new process
  claims with new epochs and never fires under its predecessor's;
* ``SIGSTOP`` past the TTL *between reading due jobs and committing them*,
  takeover, ``SIGCONT``: the resumed tick's commit is fenced out
  (``fence_rejected``), nothing is stored under the stale epochs, the node
  rejoins;
* ``SIGSTOP`` with the fenced firing statement in flight: the frozen node
  holds no transaction open (the store ends it), the takeover is not
  delayed, nothing is committed under the stale epochs;
* the store connections of a node cut (``pg_terminate_backend``), the
  firing one while its fenced statement is in flight: the node recovers
  without crashing and without losing a run.

Mid-tick failures are placed deterministically with
:meth:`harness.Cluster.at_mid_tick` (a lock the node's tick waits for).

The kill, restart and pause scenarios run against both coordinators
(``@both_coordinators``: SQL lease rows, and etcd leases with a watch); the
connection-cut and 40001 ones are about the store session and run with SQL.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from harness import (
    MARGIN_S,
    TIMINGS,
    Cluster,
    PartitionRow,
    add_interval_jobs,
    backend_pids,
    both_coordinators,
    firing_sessions,
    in_transaction,
    install_firing_fault,
    lagging_jobs,
    max_lateness_s,
    owned_by,
    partitions,
    runs_by,
    sleep_until_wall_fraction,
    terminate_backends,
)

pytestmark = pytest.mark.cluster

JOBS = 200
"""Interval jobs firing every second (2 cores are shared with PostgreSQL)."""

NODES = ["n1", "n2", "n3"]
VICTIM = "n2"

TAKEOVER_TIMEOUT_S = TIMINGS.lease_ttl_s + TIMINGS.poll_interval_s + MARGIN_S
"""A dead or frozen node's partitions are claimed within TTL + poll (+ margin)."""

VICTIM_TICK_S = 1.0
MID_TICK_FLAGS = [
    "--tick-interval-s",
    str(VICTIM_TICK_S),
    "--lock-timeout-s",
    "1.5",
    "--statement-timeout-s",
    "1.5",
    "--max-rate-per-s",
    "500",
]
"""For a node frozen or cut mid-tick: one tick a second, so every tick has due
work (the 1 s jobs) and fires it; lock and statement timeouts (still below the
TTL) that outlast the milliseconds between "waiting on the test's lock" and
the injected failure; a budget (500 runs a tick, ~7x the load) below
``scheduler.firing.FiringLimits.herd_min_jobs``, so no tenant is probed for a herd and the
tick's first read of ``jobs`` is the due read these tests hold up."""

LOCK_JOBS_TABLE = "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"
"""Holds up the firing loop's read of due jobs (it waits for an AccessShareLock)."""
DUE_SCAN = "d.next_due_at <= coalesce("
"""A fragment of ``select_due_jobs`` (the tick's read of due jobs), in no other statement of a tick."""
LOCK_JOB_ROWS = "SELECT 1 FROM jobs WHERE partition_id = ANY(%s) FOR UPDATE"
"""Holds up the fenced firing statement of these partitions' jobs (reads pass)."""


def _start(cluster: Cluster, node_ids: list[str], victim_flags: list[str] | None = None) -> datetime:
    """Add the jobs, start the nodes, wait until balanced and all firing; return the window start."""
    add_interval_jobs(cluster.conn, JOBS)
    since = cluster.now()
    for node_id in node_ids:
        cluster.spawn(node_id, victim_flags if node_id == VICTIM else None)
    cluster.wait_balanced(node_ids)
    balanced_at = cluster.now()
    for node_id in node_ids:
        cluster.wait_fired(node_id, balanced_at)
    return since


def _taken_over(
    cluster: Cluster, old: dict[int, PartitionRow], by: tuple[str, ...], failed_at: datetime
) -> dict[int, PartitionRow]:
    """Wait until every partition of ``old`` is leased live by one of ``by`` under a newer epoch;
    check each was claimed only once its old lease had expired.

    SQL: after the old row's ``lease_expires_at`` (store time). etcd: the
    store's lease columns are not renewed, so the bound is the etcd lease's:
    at least TTL − renew interval after the failure at ``failed_at`` (the
    victim's last keep-alive was at most one renew interval before it)."""

    def done(rows: dict[int, PartitionRow]) -> bool:
        return all(
            rows[pid].owner_node in by and rows[pid].lease_live and rows[pid].owner_epoch > row.owner_epoch
            for pid, row in old.items()
        )

    rows = cluster.wait_for(
        f"the {len(old)} partitions to be claimed by {by} under new epochs",
        cluster.partitions,
        done,
        timeout_s=TAKEOVER_TIMEOUT_S,
    )
    new = {pid: rows[pid] for pid in old}
    if cluster.etcd:
        not_before = failed_at + timedelta(seconds=TIMINGS.lease_ttl_s - TIMINGS.renew_interval_s - 0.2)
        early = [(pid, row.acquired_at, not_before) for pid, row in new.items() if row.acquired_at < not_before]
    else:
        early = [
            (pid, row.acquired_at, old[pid].lease_expires_at)
            for pid, row in new.items()
            if row.acquired_at < old[pid].lease_expires_at
        ]
    assert early == [], f"claimed before the old lease expired: {early[:5]}"
    return new


def _stale_runs(
    cluster: Cluster, node_id: str, old: dict[int, PartitionRow], new: dict[int, PartitionRow]
) -> list[dict]:
    """Runs by ``node_id`` under an ``old`` epoch fired after that partition's
    takeover (``new`` acquired_at): commits of a stale owner. Must be empty."""
    runs = runs_by(cluster.conn, node_id, pids=sorted(old), fired_after=min(r.acquired_at for r in new.values()))
    return [
        run
        for run in runs
        if run["epoch"] <= old[run["partition_id"]].owner_epoch
        and run["fired_at"] >= new[run["partition_id"]].acquired_at
    ]


def _wait_caught_up(cluster: Cluster) -> None:
    now = cluster.now()
    cluster.wait_for(
        f"every slot before {now} to fire",
        lambda: lagging_jobs(cluster.conn, now),
        lambda n: n == 0,
        timeout_s=MARGIN_S,
    )


@both_coordinators
def test_kill_9_partitions_claimed_after_lease_expiry_overdue_jobs_fire(cluster: Cluster) -> None:
    since = _start(cluster, NODES)

    sleep_until_wall_fraction(0.9)  # just before a tick: the worst case for lateness
    cluster.nodes[VICTIM].kill()
    killed_at = cluster.now()
    old = owned_by(cluster.conn, VICTIM)  # final: nobody renews them any more
    assert len(old) >= 340

    new = _taken_over(cluster, old, ("n1", "n3"), killed_at)
    taken_over_at = max(row.acquired_at for row in new.values())
    cluster.wait_balanced(["n1", "n3"])
    _wait_caught_up(cluster)

    history = cluster.finish(since, covering=taken_over_at)
    late_s = max_lateness_s(cluster.conn, sorted(old), killed_at - timedelta(seconds=1))
    print(
        f"\nkill -9: {len(old)} partitions taken over {(taken_over_at - killed_at).total_seconds():.3f}s "
        f"after the kill; max lateness of their jobs {late_s:.3f}s (bound TTL+poll+tick "
        f"{TIMINGS.crash_lateness_bound_s}s + {MARGIN_S}s); window {history.report}"
    )
    assert late_s <= TIMINGS.crash_lateness_bound_s + MARGIN_S
    assert history.runs_by_node[VICTIM] > 0
    cluster.stop_all()


@both_coordinators
def test_restart_under_same_node_id_claims_new_epochs(cluster: Cluster) -> None:
    since = _start(cluster, NODES)

    sleep_until_wall_fraction(0.9)
    cluster.nodes[VICTIM].kill()
    killed_at = cluster.now()
    old = owned_by(cluster.conn, VICTIM)
    successor = cluster.spawn(VICTIM)  # at once, same node id

    # Its predecessor's leases are never renewed (they expire: each partition is
    # claimed afresh after its old lease's expiry, checked in _taken_over), and
    # are claimed under new epochs, normally by the successor (under its share).
    new = _taken_over(cluster, old, tuple(NODES), killed_at)
    taken_over_at = max(row.acquired_at for row in new.values())
    successor.wait_event("lease_claimed", timeout_s=MARGIN_S)
    cluster.wait_balanced(NODES)

    # The successor fires only under epochs it claimed: above its predecessor's.
    first_claim = min(row.acquired_at for row in new.values())
    cluster.wait_fired(VICTIM, first_claim)
    _wait_caught_up(cluster)
    runs = runs_by(cluster.conn, VICTIM, fired_after=first_claim)
    assert all(run["epoch"] > old[run["partition_id"]].owner_epoch for run in runs if run["partition_id"] in old)
    assert _stale_runs(cluster, VICTIM, old, new) == []
    reclaimed = sum(1 for row in new.values() if row.owner_node == VICTIM)

    history = cluster.finish(since, covering=taken_over_at)
    late_s = max_lateness_s(cluster.conn, sorted(old), killed_at - timedelta(seconds=1))
    print(
        f"\nrestart: predecessor's {len(old)} partitions reclaimed ({reclaimed} by its successor) "
        f"{(taken_over_at - killed_at).total_seconds():.3f}s after the kill; max lateness of their jobs "
        f"{late_s:.3f}s; window {history.report}"
    )
    assert late_s <= TIMINGS.crash_lateness_bound_s + MARGIN_S
    assert _stale_runs(cluster, VICTIM, old, new) == []
    cluster.stop_all()


@both_coordinators
def test_paused_between_read_and_commit_is_fenced_out_then_rejoins(cluster: Cluster) -> None:
    since = _start(cluster, NODES, MID_TICK_FLAGS)
    victim = cluster.nodes[VICTIM]

    # Freeze n2 inside a tick: it has chosen its partitions and epochs and sent
    # its read of due jobs (held up by the table lock); it resumes with them.
    paused_at = cluster.at_mid_tick(
        VICTIM,
        LOCK_JOBS_TABLE,
        None,
        lambda _pids: victim.pause(),
        waiting_mode="AccessShareLock",
        statement=DUE_SCAN,
    )
    old = owned_by(cluster.conn, VICTIM)

    new = _taken_over(cluster, old, ("n1", "n3"), paused_at)
    taken_over_at = max(row.acquired_at for row in new.values())
    _wait_caught_up(cluster)  # the new owners fired the overdue jobs
    assert victim.state() in ("T", "t"), "n2 must still be stopped after the takeover"

    resumed_at = cluster.now()
    resumed_mono = time.monotonic()
    victim.resume()
    # The stale tick reaches the fence and commits nothing (the counter and the log say so) ...
    rejected = victim.wait_event("fence_rejected", since_mono=resumed_mono, timeout_s=MARGIN_S)
    assert 1 <= rejected["partitions"] <= len(old), rejected
    assert set(rejected["sample"]) <= set(old), rejected
    # ... and every stale lease is dropped, by the fence or by the failed renewal.
    victim.wait_event("lease_lost", since_mono=resumed_mono, timeout_s=MARGIN_S)
    dropped = sum(
        e["partitions"]
        for name in ("fence_rejected", "lease_lost")
        for e in victim.events_named(name, since_mono=resumed_mono)
    )
    assert dropped >= len(old), (dropped, len(old))
    # ... and the store holds nothing under the stale epochs.
    assert _stale_runs(cluster, VICTIM, old, new) == []

    # It rejoins: back within its share, firing again under new epochs only.
    cluster.wait_balanced(NODES)
    cluster.wait_fired(VICTIM, resumed_at)
    rejoined_at = cluster.now()
    _wait_caught_up(cluster)

    history = cluster.finish(since, covering=rejoined_at)
    assert _stale_runs(cluster, VICTIM, old, new) == []
    print(
        f"\nSIGSTOP mid-read: {len(old)} partitions taken over "
        f"{(taken_over_at - paused_at).total_seconds():.3f}s after the pause; the resumed tick was fenced "
        f"out on {rejected['partitions']} partitions; window {history.report}"
    )
    cluster.stop_all()


@both_coordinators
def test_paused_mid_commit_holds_nothing_takeover_not_delayed(cluster: Cluster) -> None:
    since = _start(cluster, NODES, MID_TICK_FLAGS)
    victim = cluster.nodes[VICTIM]
    old = owned_by(cluster.conn, VICTIM)

    # Freeze n2 with its fenced statement in flight (held up by row locks the
    # test then releases). Whatever its transaction holds then (the partition
    # rows FOR SHARE), the store must not let a frozen node keep it: its
    # transaction ends (committed if COMMIT was already sent, else aborted by
    # idle_in_transaction_session_timeout) and the takeover proceeds on time.
    paused_at = cluster.at_mid_tick(VICTIM, LOCK_JOB_ROWS, (sorted(old),), lambda _pids: victim.pause())
    cluster.wait_for(
        "the frozen node to hold no open transaction",
        lambda: in_transaction(cluster.conn, firing_sessions(VICTIM)),
        lambda pids: not pids,
        timeout_s=TIMINGS.lease_ttl_s * 0.4 + 1.0,
    )
    new = _taken_over(cluster, old, ("n1", "n3"), paused_at)
    taken_over_at = max(row.acquired_at for row in new.values())
    _wait_caught_up(cluster)
    assert victim.state() in ("T", "t"), "n2 must still be stopped after the takeover"

    resumed_mono = time.monotonic()
    victim.resume()
    victim.wait_event("lease_lost", since_mono=resumed_mono, timeout_s=MARGIN_S)
    cluster.wait_balanced(NODES)
    rejoined_at = cluster.now()
    cluster.wait_fired(VICTIM, rejoined_at)
    assert _stale_runs(cluster, VICTIM, old, new) == []

    history = cluster.finish(since, covering=rejoined_at)
    assert _stale_runs(cluster, VICTIM, old, new) == []
    print(
        f"\nSIGSTOP mid-commit: {len(old)} partitions taken over "
        f"{(taken_over_at - paused_at).total_seconds():.3f}s after the pause; window {history.report}"
    )
    assert victim.problems() == []
    cluster.stop_all()


def test_cut_store_connections_node_recovers_without_losing_runs(cluster: Cluster) -> None:
    since = _start(cluster, ["n1", VICTIM], MID_TICK_FLAGS)
    victim = cluster.nodes[VICTIM]
    old = owned_by(cluster.conn, VICTIM)

    # 1. The firing connection, while its fenced statement is in flight.
    cut: dict = {}

    def cut_firing(pids: list[int]) -> None:
        cut.update(pids=pids, mono=time.monotonic(), at=cluster.now())
        assert terminate_backends(cluster.conn, pids) == 1

    cluster.at_mid_tick(VICTIM, LOCK_JOB_ROWS, (sorted(old),), cut_firing)
    victim.wait_event("tick_failed", since_mono=cut["mono"], timeout_s=MARGIN_S)
    cluster.wait_fired(VICTIM, cut["at"], pids=sorted(old))  # on a new connection
    reconnected = backend_pids(cluster.conn, firing_sessions(VICTIM))
    assert reconnected and not set(reconnected) & set(cut["pids"])

    # 2. The lease connection.
    lease_backends = backend_pids(cluster.conn, f"scheduler-lease:{VICTIM}")
    assert len(lease_backends) == 1
    cut2_mono = time.monotonic()
    cut2_at = cluster.now()
    assert terminate_backends(cluster.conn, lease_backends) == 1
    victim.wait_event("store_unavailable", since_mono=cut2_mono, timeout_s=MARGIN_S)
    renewed_after = cut2_at + timedelta(seconds=TIMINGS.lease_ttl_s)
    cluster.wait_for(
        "n2 to renew all its leases on a new connection",
        lambda: partitions(cluster.conn),
        lambda rows: all(rows[pid].lease_expires_at > renewed_after for pid in old),
        timeout_s=MARGIN_S,
    )

    # The leases never moved (same owner, same epochs): n2 itself recovered.
    rows = partitions(cluster.conn)
    assert all((rows[pid].owner_node, rows[pid].owner_epoch) == (VICTIM, row.owner_epoch) for pid, row in old.items())
    history = cluster.finish(since, covering=cut2_at)
    late_s = max_lateness_s(cluster.conn, sorted(old), cut["at"] - timedelta(seconds=1))
    print(f"\nconnection cut: max lateness of n2's jobs {late_s:.3f}s; window {history.report}")
    assert late_s <= VICTIM_TICK_S + MARGIN_S
    assert history.runs_by_node[VICTIM] > 0
    assert victim.problems() == []  # no traceback, no error-level record
    cluster.stop_all()  # and it still stops gracefully, exit 0


def test_serialization_failure_in_firing_statement_is_retried_node_keeps_firing(cluster: Cluster) -> None:
    arm = install_firing_fault(cluster.conn, VICTIM, "40001")
    since = _start(cluster, ["n1", VICTIM])
    victim = cluster.nodes[VICTIM]
    old = owned_by(cluster.conn, VICTIM)

    arm()  # n2's next firing statement fails with SQLSTATE 40001, once
    cluster.wait_for(
        "the injected 40001 to hit n2's firing statement",
        lambda: cluster.conn.execute("SELECT last_value FROM firing_fault").fetchone()["last_value"],
        lambda value: value >= 1,
        timeout_s=MARGIN_S,
    )
    hit_at = cluster.now()

    # docs/design.md §7: the transaction is retried; n2 keeps firing its own partitions.
    cluster.wait_fired(VICTIM, hit_at, pids=sorted(old), timeout_s=MARGIN_S)
    _wait_caught_up(cluster)
    rows = partitions(cluster.conn)
    assert all((rows[pid].owner_node, rows[pid].owner_epoch) == (VICTIM, row.owner_epoch) for pid, row in old.items())
    history = cluster.finish(since, covering=hit_at)
    late_s = max_lateness_s(cluster.conn, sorted(old), hit_at - timedelta(seconds=1))
    print(f"\n40001 in a firing statement: max lateness of n2's jobs {late_s:.3f}s; window {history.report}")
    assert late_s <= TIMINGS.tick_interval_s + MARGIN_S
    assert victim.problems() == []
    cluster.stop_all()


def test_overlapping_failures_kill_one_freeze_another(cluster: Cluster) -> None:
    """kill -9 one node, then freeze another past the TTL before the first's leases expire.

    The survivor must not wait for the frozen node's heartbeat to reach the
    TTL before taking the dead node's partitions: shares are computed over
    nodes that heartbeat on time (Settings.responsive_s), so the dead node's
    partitions are claimed on the poll after their leases expire, and the
    frozen node's on the poll after its own expire.
    """
    since = _start(cluster, NODES)
    dead, frozen, survivor = cluster.nodes["n1"], cluster.nodes[VICTIM], "n3"
    sleep_until_wall_fraction(0.9)
    dead.kill()
    killed_at = cluster.now()
    old_dead = owned_by(cluster.conn, "n1")
    time.sleep(TIMINGS.lease_ttl_s / 2)  # the freeze lands while the dead node's leases are still live
    frozen.pause()
    paused_at = cluster.now()
    old_frozen = owned_by(cluster.conn, VICTIM)
    try:
        _taken_over(cluster, old_dead, (survivor,), killed_at)
        _taken_over(cluster, old_frozen, (survivor,), paused_at)
    finally:
        frozen.resume()
    cluster.wait_balanced([VICTIM, survivor])
    _wait_caught_up(cluster)
    history = cluster.finish(since, covering=cluster.now())
    late_dead = max_lateness_s(cluster.conn, sorted(old_dead), killed_at - timedelta(seconds=1))
    late_frozen = max_lateness_s(cluster.conn, sorted(old_frozen), paused_at - timedelta(seconds=1))
    print(
        f"\noverlapping failures: max lateness dead {late_dead:.3f}s, frozen {late_frozen:.3f}s "
        f"(bound {TIMINGS.crash_lateness_bound_s}s + {MARGIN_S}s); window {history.report}"
    )
    assert late_dead <= TIMINGS.crash_lateness_bound_s + MARGIN_S
    assert late_frozen <= TIMINGS.crash_lateness_bound_s + MARGIN_S
    cluster.stop_all()  # the killed node is skipped (already exited)
