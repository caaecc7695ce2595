"""Leases of a live, healthy node are never lost to its own firing (scheduler/coordination/loop.py).

In process, against a real store, with scaled-down timings (``TIMINGS``) and
generous margins:

* a long firing tick while a second node joins (the first is over its share
  and must hand half over): the lease loop keeps renewing and heartbeating
  while the tick runs, the draining partitions stay leased (renewed) until
  the tick has ended, and are released afterwards;
* two connections taking turns holding ``FOR SHARE`` on the node's partition
  rows, exactly as the firing fence does (``fire_runs``): the renewal and the
  heartbeat are not starved by them;
* the heartbeat is its own transaction: a renewal that fails does not take
  the heartbeat down with it.

The tests read the lease rows from the table ``renew_leases`` writes, so the
same assertions hold whatever table keeps the leases.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from helpers import wait_for

from scheduler import store
from scheduler.clock import SystemClock
from scheduler.coordination import LeaseLoop, LeaseTable, SqlCoordinator
from scheduler.firing import Firer, TickResult
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings

TIMINGS = dict(lease_ttl_s=6.0, renew_interval_s=2.0, poll_interval_s=1.0, safety_margin_s=0.5)
"""Node timings of these tests: responsive bound 4 s, statement timeout 2.4 s."""

LEASE_TABLE = re.search(r"UPDATE\s+(\w+)", store.QUERIES["renew_leases"]).group(1)
"""The table whose rows carry the lease expiry (the one the renewal updates)."""


class Member:
    """One node's lease half, in process: coordinator, lease table and lease loop."""

    def __init__(self, dsn: str, node_id: str) -> None:
        self.settings = Settings(dsn=dsn, node_id=node_id, **TIMINGS).validated()
        self.metrics = Metrics()
        self.table = LeaseTable(SystemClock(), self.settings.safety_margin_s)
        self.coord = SqlCoordinator(self.settings, self.metrics)
        self.loop = LeaseLoop(self.settings, self.coord, self.table, SystemClock(), self.metrics)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the lease loop on a thread."""
        self._thread = threading.Thread(target=self.loop.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def lease_events(self, kind: str) -> float:
        return self.metrics.value("scheduler_lease_events_total", {"kind": kind})

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.coord.close()


@pytest.fixture
def members(pg_dsn: str) -> Iterator[dict[str, Member]]:
    made: dict[str, Member] = {}

    class Factory(dict):
        def __missing__(self, node_id: str) -> Member:
            made[node_id] = self[node_id] = Member(pg_dsn, node_id)
            return made[node_id]

    yield Factory()
    for member in made.values():
        member.close()


class HeldTickFirer(Firer):
    """A firer whose tick, once it has its firable partitions, blocks until released."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.entered = threading.Event()
        self.release = threading.Event()

    def _tick(self, firable: dict[int, int], result: TickResult) -> None:
        self.entered.set()
        assert self.release.wait(120), "the test never released the tick"


def lease_view(conn: psycopg.Connection, node_id: str) -> dict:
    """The store's view of ``node_id``'s leases: how many, how many unexpired, least time left (s)."""
    return conn.execute(
        f"SELECT count(*) AS held, count(*) FILTER (WHERE lease_expires_at > now()) AS unexpired,"
        f"       extract(epoch FROM (min(lease_expires_at) - now()))::float8 AS least_left_s,"
        f"       min(renewed_at) AS oldest_renewal"
        f" FROM {LEASE_TABLE} WHERE owner_node = %s",
        (node_id,),
    ).fetchone()


def heartbeat_age_s(conn: psycopg.Connection, node_id: str) -> float:
    return conn.execute(
        "SELECT extract(epoch FROM (now() - heartbeat_at))::float8 AS age FROM nodes WHERE node_id = %s", (node_id,)
    ).fetchone()["age"]


def owners(conn: psycopg.Connection) -> dict[int, str | None]:
    rows = conn.execute(f"SELECT partition_id, owner_node FROM {LEASE_TABLE} ORDER BY partition_id")
    return {row["partition_id"]: row["owner_node"] for row in rows}


# ---------------------------------------------------------------- a long tick and a join


def test_a_long_tick_during_a_join_loses_no_lease_of_the_live_node(
    members: dict[str, Member], conn: psycopg.Connection
) -> None:
    a = members["a"]
    a.loop.run_once()  # joins alone: its share is all 1,024
    assert len(a.table) == PARTITION_COUNT
    firer = HeldTickFirer(a.settings, a.table, SystemClock(), a.metrics)
    ticking = threading.Thread(target=firer.tick, daemon=True)
    ticking.start()
    assert firer.entered.wait(10)
    a.start()
    b = members["b"]
    b.start()  # the join: a's share drops to 512 on its next poll

    # Hold the tick past one TTL and then some: a must stay live and keep all its leases.
    ttl_s = a.settings.lease_ttl_s
    samples = []
    held_until = time.monotonic() + ttl_s + 2.0
    while time.monotonic() < held_until:
        samples.append((lease_view(conn, "a"), heartbeat_age_s(conn, "a")))
        time.sleep(0.1)
    # No lease of a expired, and a's heartbeat stayed fresh (peers kept counting it) ...
    assert [view["unexpired"] for view, _ in samples] == [PARTITION_COUNT] * len(samples)
    assert min(view["least_left_s"] for view, _ in samples) > 0
    assert max(age for _, age in samples) < a.settings.responsive_s
    # ... and none was released while the tick that may fire them ran; but a did
    # notice the join: half of its partitions are draining (not fired any more).
    assert [view["held"] for view, _ in samples] == [PARTITION_COUNT] * len(samples)
    assert len(a.table.firable()) == PARTITION_COUNT // 2
    assert b.table.held() == {}

    firer.release.set()
    ticking.join(10)
    # Now the draining half is released, and b claims it.
    wait_for(
        "a to hand over half of its partitions to b",
        lambda: len(a.table) == len(b.table) == PARTITION_COUNT // 2,
        timeout_s=5 * a.settings.poll_interval_s + 5,
    )
    assert sorted(a.table.held()) == list(range(PARTITION_COUNT // 2))
    assert sorted(b.table.held()) == list(range(PARTITION_COUNT // 2, PARTITION_COUNT))
    stored = owners(conn)
    assert [stored[pid] for pid in range(PARTITION_COUNT)] == ["a"] * 512 + ["b"] * 512
    assert a.lease_events("lost") == 0
    assert a.lease_events("released") == PARTITION_COUNT // 2


# ---------------------------------------------------------------- share locks in turns


FENCE_LOCK = """
SELECT p.partition_id
FROM partitions AS p
JOIN unnest(%(pids)s::int4[], %(epochs)s::int8[]) AS l (pid, epoch)
  ON p.partition_id = l.pid AND p.owner_epoch = l.epoch
WHERE p.owner_node = %(node_id)s
FOR SHARE OF p
"""
"""The firing fence's lock (``fire_runs``/``fire_group``): the node's partition rows, FOR SHARE."""


class ShareLocksInTurns:
    """Two sessions holding FOR SHARE on the same rows in turns, never both letting go.

    Each takes the lock while the other still holds it, then lets the other
    commit; so at every instant at least one share lock is held, and a writer
    queued on those rows is never let in (PostgreSQL admits a new share locker
    past a waiting writer). ``locked`` counts the rows each acquisition locked;
    ``held`` records each hold as ``[locked at, commit sent at]`` (monotonic).
    """

    def __init__(self, dsn: str, params: dict) -> None:
        self._params = params
        self._conns = [store.connect(dsn, application_name="share-locker") for _ in range(2)]
        self._turn = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.locked: list[int] = []
        self.held: list[list[float]] = []
        self._threads = [threading.Thread(target=self._hold, args=(i,), daemon=True) for i in range(2)]

    def _hold(self, i: int) -> None:
        conn = self._conns[i]
        while not self._stop.is_set():
            conn.execute("BEGIN")
            self.locked.append(len(conn.execute(FENCE_LOCK, self._params).fetchall()))
            hold = [time.monotonic(), float("inf")]
            self.held.append(hold)
            with self._cond:
                self._turn = 1 - i  # the other may let go now: this one holds
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._turn == i or self._stop.is_set(), timeout=10)
            time.sleep(0.05)
            hold[1] = time.monotonic()
            conn.execute("COMMIT")

    def covered(self, start: float, end: float) -> bool:
        """Whether some share lock was held at every instant of [start, end]."""
        reached = start
        for begin, until in sorted(self.held):
            if begin > reached:
                return False
            reached = max(reached, until)
            if reached >= end:
                return True
        return False

    def __enter__(self) -> ShareLocksInTurns:
        self._threads[0].start()
        wait_for("the first share lock", lambda: self.locked, timeout_s=5)
        self._threads[1].start()
        wait_for("the share locks to change hands", lambda: len(self.locked) >= 4, timeout_s=5)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(10)
        for conn in self._conns:
            conn.close()


def test_share_locks_taken_in_turns_starve_neither_renewal_nor_heartbeat(
    members: dict[str, Member], conn: psycopg.Connection, pg_dsn: str
) -> None:
    a = members["a"]
    a.loop.run_once()
    held = a.table.held()
    assert len(held) == PARTITION_COUNT
    params = {"pids": sorted(held), "epochs": [held[pid].epoch for pid in sorted(held)], "node_id": "a"}
    before = lease_view(conn, "a")
    time.sleep(a.settings.renew_interval_s)  # the next renewal is due

    with ShareLocksInTurns(pg_dsn, params) as locks:
        started = time.monotonic()
        a.loop.run_once()
        took_s = time.monotonic() - started
        age_s = heartbeat_age_s(conn, "a")
        after = lease_view(conn, "a")

    assert set(locks.locked) == {PARTITION_COUNT}  # every turn locked every partition row ...
    assert locks.covered(started, started + took_s)  # ... and the rows stayed locked throughout
    assert took_s < a.settings.renew_interval_s
    assert (after["held"], after["unexpired"]) == (PARTITION_COUNT, PARTITION_COUNT)
    assert after["oldest_renewal"] > before["oldest_renewal"]  # every lease renewed
    assert age_s < took_s + 1.0
    assert a.lease_events("renewed") == PARTITION_COUNT
    assert a.loop.last_heartbeat_mono >= started


# ---------------------------------------------------------------- heartbeat apart from renewal


def test_a_failing_renewal_does_not_lose_the_heartbeat(members: dict[str, Member], conn: psycopg.Connection) -> None:
    a = members["a"]
    a.loop.run_once()
    assert len(a.table) == PARTITION_COUNT
    conn.execute("""
        CREATE FUNCTION refuse_renewal() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'renewal refused by the test' USING ERRCODE = '55000'; END $$""")
    conn.execute(
        f"CREATE TRIGGER refuse_renewal BEFORE UPDATE ON {LEASE_TABLE}"
        " FOR EACH STATEMENT EXECUTE FUNCTION refuse_renewal()"
    )
    time.sleep(1.0)
    before_s = heartbeat_age_s(conn, "a")
    assert before_s >= 1.0
    time.sleep(a.settings.renew_interval_s)  # the next renewal is due

    started = time.monotonic()
    a.loop.run_once()

    assert heartbeat_age_s(conn, "a") < 1.0  # the heartbeat committed ...
    assert a.loop.last_heartbeat_mono >= started
    assert a.lease_events("renewed") == 0  # ... though the renewal failed
    assert a.metrics.value("scheduler_store_errors_total", {"sqlstate_class": "55"}) == 1
