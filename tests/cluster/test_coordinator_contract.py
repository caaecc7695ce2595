"""The contract every coordinator keeps (scheduler/coordination/protocol.py ``Coordinator``), run against each.

Parametrised over ``sql`` (:class:`~scheduler.coordination.sql.SqlCoordinator`) and
``etcd`` (:class:`~scheduler.coordination.etcd.EtcdCoordinator` on the
session's throwaway etcd, a prefix per test; without etcd the etcd half
FAILS under ``CI=true`` and is skipped only outside CI: see ``conftest.py``).
Coordinators are built in process by :func:`~scheduler.coordination.make_coordinator`
on one fresh database, with a scaled-down TTL (3 s) and generous margins:

* **claim races**: several coordinators claim at once (threads released by a
  barrier); every partition is claimed by exactly one, shares are kept, and
  released partitions go to exactly one of the racers;
* **epochs strictly increase** across the claims of a partition (handed back
  and forth by release and claim, and taken over after its lease expired),
  and the fence row (``partitions``) carries the last claim's owner and epoch;
* **renew and release are keyed on (node, epoch)**: with a stale epoch, or by
  a node that does not hold the lease, they do nothing (nothing returned, the
  holder keeps renewing it, nobody else can claim it);
* **a restarted node never inherits**: a new coordinator with the same node
  id claims nothing its predecessor still holds, and once those leases
  expire claims them afresh with new epochs; the predecessor's renewals and
  releases then do nothing;
* **membership**: a joined node counts in ``live_nodes``; after ``leave`` it
  does not.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import psycopg
import pytest
from harness import MARGIN_S, fences, wait_for

from scheduler.coordination import Coordinator, Lease, fair_share, make_coordinator
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings

pytestmark = pytest.mark.cluster

TIMINGS = dict(lease_ttl_s=3.0, renew_interval_s=1.0, poll_interval_s=0.5, safety_margin_s=0.5)
"""Coordinator timings of this suite (etcd grants whole seconds, ≥ 2)."""

EXPIRY_WAIT_S = TIMINGS["lease_ttl_s"] + 2 * MARGIN_S
"""Bound on waiting for a silent holder's leases to expire and be claimed."""

RACERS = 4

Make = Callable[[str], Coordinator]


@pytest.fixture(params=["sql", "etcd"])
def make(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Make]:
    """``make(node_id)``: a coordinator of the parameter's kind on this test's
    database (and, for etcd, its own key prefix); all closed after the test."""
    extra: dict[str, str] = {}
    if request.param == "etcd":
        server = request.getfixturevalue("etcd_server")
        extra = dict(
            coordinator="etcd", etcd_endpoints=server.endpoint, etcd_prefix=request.getfixturevalue("etcd_prefix")
        )
    made: list[Coordinator] = []

    def factory(node_id: str) -> Coordinator:
        settings = Settings(dsn=pg_dsn, node_id=node_id, **TIMINGS, **extra).validated()
        coordinator = make_coordinator(settings, Metrics())
        made.append(coordinator)
        return coordinator

    yield factory
    for coordinator in made:
        coordinator.close()


def race_claims(coordinators: list[Coordinator], limits: list[int]) -> list[list[tuple[int, int]]]:
    """Each coordinator calls ``claim(limits[i])`` at once (a barrier); return
    each one's grants. An exception in a claimer is re-raised here."""
    barrier = threading.Barrier(len(coordinators))
    results: list = [[] for _ in coordinators]

    def claim(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = coordinators[i].claim(limits[i])
        except BaseException as exc:  # re-raised in the test thread
            results[i] = exc

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(coordinators))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


class Ledger:
    """What the test's coordinators hold, and every epoch each partition was claimed at.

    :meth:`record` checks each claim against the contract: no partition is
    granted while another coordinator (or the same one) holds it, and a
    partition's epochs strictly increase in claim order.
    """

    def __init__(self, coordinators: list[Coordinator]) -> None:
        self.held: dict[str, dict[int, int]] = {c.node_id: {} for c in coordinators}
        self.epochs: dict[int, list[int]] = defaultdict(list)

    def record(self, coordinator: Coordinator, grants: list[tuple[int, int]]) -> None:
        holders = {pid: node for node, held in self.held.items() for pid in held}
        for pid, epoch in grants:
            assert pid not in holders, (
                f"partition {pid} granted to {coordinator.node_id} while {holders.get(pid)} holds it"
            )
            assert not self.epochs[pid] or epoch > self.epochs[pid][-1], (pid, self.epochs[pid], epoch)
            self.epochs[pid].append(epoch)
            holders[pid] = coordinator.node_id
            self.held[coordinator.node_id][pid] = epoch

    def release(self, coordinator: Coordinator, pids: list[int]) -> list[int]:
        """``coordinator.release`` of those it holds; asserts exactly those were released."""
        held = self.held[coordinator.node_id]
        released = coordinator.release(leases({pid: held[pid] for pid in pids}))
        assert sorted(released) == sorted(pids)
        for pid in pids:
            del held[pid]
        return released

    def renew(self, coordinators: list[Coordinator]) -> None:
        """Each of ``coordinators`` renews all it holds; asserts every lease was renewed."""
        for coordinator in coordinators:
            mine = self.held[coordinator.node_id]
            assert sorted(coordinator.renew(leases(mine))) == sorted(mine.items()), coordinator.node_id

    def claim_until(
        self, coordinator: Coordinator, want: int, *, alive: tuple[Coordinator, ...] = (), timeout_s: float = MARGIN_S
    ) -> None:
        """Claim (recording each grant) until ``coordinator`` holds ``want`` partitions;
        meanwhile it and the ``alive`` ones keep renewing what they hold."""
        held = self.held[coordinator.node_id]

        def step() -> int:
            self.renew([coordinator, *alive])
            if len(held) < want:
                self.record(coordinator, coordinator.claim(want - len(held)))
            return len(held)

        wait_for(
            f"{coordinator.node_id} to hold {want} partitions",
            step,
            lambda n: n == want,
            timeout_s=timeout_s,
            interval_s=0.1,
        )


def leases(held: dict[int, int]) -> list[Lease]:
    """``{partition: epoch}`` as the lease loop would pass it (deadline irrelevant here)."""
    return [Lease(pid, epoch, 0.0) for pid, epoch in sorted(held.items())]


def assert_fences(conn: psycopg.Connection, ledger: Ledger) -> None:
    """The fence rows name each held partition's holder and its claim's epoch."""
    rows = fences(conn)
    for node, held in ledger.held.items():
        for pid, epoch in held.items():
            assert rows[pid] == (node, epoch), (pid, node, epoch, rows[pid])


def test_racing_claimers_claim_every_partition_exactly_once(make: Make, conn: psycopg.Connection) -> None:
    coordinators = [make(f"racer-{i}") for i in range(RACERS)]
    for coordinator in coordinators:
        coordinator.join()
    assert sorted(coordinators[0].live_nodes()) == [f"racer-{i}" for i in range(RACERS)]
    ledger = Ledger(coordinators)
    share = fair_share(RACERS)

    # All free; each asks for what its share lacks, racing, until every share is full
    # (the SQL coordinator fills them in one race; etcd claimers may collide, and try again).
    def race_to_shares() -> int:
        ledger.renew(coordinators)
        limits = [share - len(ledger.held[c.node_id]) for c in coordinators]
        for coordinator, grants in zip(coordinators, race_claims(coordinators, limits), strict=False):
            ledger.record(coordinator, grants)
        return sum(len(held) for held in ledger.held.values())

    wait_for(
        "the racers to fill their shares",
        race_to_shares,
        lambda n: n == PARTITION_COUNT,
        timeout_s=MARGIN_S,
        interval_s=0.1,
    )
    assert [len(ledger.held[c.node_id]) for c in coordinators] == [share] * RACERS
    assert_fences(conn, ledger)

    # Rounds: racer-0 releases 8; the others race greedily for everything. Each of
    # the 8 goes to exactly one of them (at a higher epoch), nothing else is granted.
    for round_no in range(3):
        give_back = sorted(ledger.held["racer-0"])[round_no * 8 : round_no * 8 + 8]
        ledger.release(coordinators[0], give_back)

        def race_for_all() -> list[int]:
            ledger.renew(coordinators)
            claims = race_claims(coordinators[1:], [PARTITION_COUNT] * 3)
            for coordinator, grants in zip(coordinators[1:], claims, strict=True):
                assert {pid for pid, _ in grants} <= set(give_back), grants
                ledger.record(coordinator, grants)
            return sorted(pid for c in coordinators[1:] for pid in ledger.held[c.node_id] if pid in give_back)

        wait_for(
            f"round {round_no}: the released partitions to be claimed",
            race_for_all,
            lambda won: won == give_back,
            timeout_s=MARGIN_S,
            interval_s=0.1,
        )
        assert all(len(ledger.epochs[pid]) == 2 for pid in give_back)
        assert_fences(conn, ledger)


def test_epochs_strictly_increase_across_claims_of_a_partition(make: Make, conn: psycopg.Connection) -> None:
    a, b = make("a"), make("b")
    a.join()
    b.join()
    ledger = Ledger([a, b])
    ledger.claim_until(a, PARTITION_COUNT)
    assert_fences(conn, ledger)

    # Handed back and forth: released by its holder, claimed by the other.
    moving = sorted(ledger.held["a"])[100:108]
    holder, other = a, b
    for _ in range(4):
        ledger.release(holder, moving)
        ledger.claim_until(other, len(ledger.held[other.node_id]) + len(moving), alive=(holder,))
        assert sorted(pid for pid in ledger.held[other.node_id] if pid in moving) == moving
        assert_fences(conn, ledger)
        holder, other = other, holder
    assert all(len(ledger.epochs[pid]) == 5 for pid in moving)  # strictly increasing: checked by record()

    # Taken over: a falls silent (no renewals); once its leases expire b claims them.
    assert holder is a
    silent = dict(ledger.held["a"])
    ledger.held["a"] = {}  # a no longer counts as holding them for the ledger's checks
    ledger.claim_until(b, PARTITION_COUNT, timeout_s=EXPIRY_WAIT_S)
    assert all(ledger.held["b"][pid] > epoch for pid, epoch in silent.items())
    assert_fences(conn, ledger)
    assert a.renew(leases(silent)) == []


def test_renew_and_release_are_keyed_on_node_and_epoch(make: Make, conn: psycopg.Connection) -> None:
    a, b = make("a"), make("b")
    a.join()
    b.join()
    ledger = Ledger([a, b])
    ledger.claim_until(a, 8)
    mine = dict(ledger.held["a"])
    stale = {pid: epoch - 1 for pid, epoch in mine.items()}

    assert a.renew(leases(stale)) == []  # a stale epoch renews nothing
    assert a.release(leases(stale)) == []  # nor releases anything
    assert b.renew(leases(mine)) == []  # another node cannot renew a's leases
    assert b.release(leases(mine)) == []  # nor release them
    assert_fences(conn, ledger)
    assert sorted(a.renew(leases(mine))) == sorted(mine.items())  # still a's, renewable

    # Nobody else can claim them: b gets only the others.
    ledger.claim_until(b, PARTITION_COUNT - 8, alive=(a,))
    assert set(ledger.held["b"]).isdisjoint(mine)

    # Released with the right (node, epoch): b claims them, at higher epochs.
    ledger.release(a, sorted(mine))
    ledger.claim_until(b, PARTITION_COUNT)
    assert all(ledger.held["b"][pid] > epoch for pid, epoch in mine.items())
    assert_fences(conn, ledger)
    assert a.renew(leases(mine)) == []  # released: a renews nothing any more
    assert a.release(leases(mine)) == []


def test_a_restarted_node_never_inherits_its_predecessors_leases(make: Make, conn: psycopg.Connection) -> None:
    old = make("n1")
    old.join()
    ledger = Ledger([old])
    ledger.claim_until(old, PARTITION_COUNT)
    before = dict(ledger.held["n1"])

    new = make("n1")  # the same node id, a new process: it knows no epochs
    assert sorted(old.renew(leases(before))) == sorted(before.items())  # fresh: a full TTL to go
    new.join()
    assert new.renew([]) == []
    assert new.claim(PARTITION_COUNT) == []  # its predecessor's leases are live: nothing free
    assert_fences(conn, ledger)

    # The predecessor falls silent: once its leases expire, the new process claims
    # them afresh, each at a higher epoch (record() checks every grant against them).
    ledger.held["n1"] = {}
    started = time.monotonic()
    ledger.claim_until(new, PARTITION_COUNT, timeout_s=EXPIRY_WAIT_S)
    after = dict(ledger.held["n1"])
    assert all(after[pid] > epoch for pid, epoch in before.items())
    print(
        f"restart: predecessor's leases claimed afresh after {time.monotonic() - started:.2f}s "
        f"(TTL {TIMINGS['lease_ttl_s']}s)"
    )
    assert_fences(conn, ledger)

    assert old.renew(leases(before)) == []  # the predecessor's epochs are dead
    assert old.release(leases(before)) == []
    assert sorted(new.renew(leases(after))) == sorted(after.items())
    assert_fences(conn, ledger)


def test_membership_joined_nodes_count_and_left_ones_do_not(make: Make) -> None:
    stayer, leaver = make("stayer"), make("leaver")
    stayer.join()
    leaver.join()
    wait_for("both members", stayer.live_nodes, lambda nodes: nodes == ["leaver", "stayer"], timeout_s=MARGIN_S)
    leaver.leave()
    wait_for("the leaver gone", stayer.live_nodes, lambda nodes: nodes == ["stayer"], timeout_s=MARGIN_S)
