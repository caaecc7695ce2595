"""LeaseTable (scheduler/coordination/table.py): numbered ticks instead of a lock between firing and releasing.

A draining lease is left out of every tick that begins after it was marked,
and is releasable only once every tick that had begun by then has ended;
nothing here ever blocks.
"""

from __future__ import annotations

from scheduler.clock import ManualClock
from scheduler.coordination import Lease, LeaseTable

TTL_S = 10.0


def table_with(pids: list[int], epoch: int = 3) -> tuple[LeaseTable, ManualClock]:
    clock = ManualClock()
    table = LeaseTable(clock, safety_margin_s=1.0)
    table.grant([(pid, epoch) for pid in pids], clock.monotonic(), TTL_S)
    return table, clock


def test_a_lease_drained_during_a_tick_is_releasable_only_after_that_tick_ends() -> None:
    table, clock = table_with([1, 2, 3])
    number, firable = table.begin_tick()
    assert (number, firable) == (1, {1: 3, 2: 3, 3: 3})

    table.start_draining([2, 3])
    assert table.releasable() == []  # tick 1 may be firing them
    assert table.firable() == {1: 3}
    assert table.draining() == {2, 3}

    table.end_tick(number)
    deadline = clock.monotonic() + TTL_S
    assert table.releasable() == [Lease(2, 3, deadline), Lease(3, 3, deadline)]


def test_a_tick_that_begins_after_the_drain_never_holds_up_the_release() -> None:
    table, _ = table_with([1, 2])
    first, _ = table.begin_tick()
    table.end_tick(first)
    table.start_draining([2])
    second, firable = table.begin_tick()  # still running: but it never had partition 2
    assert (second, firable) == (2, {1: 3})
    assert [lease.partition_id for lease in table.releasable()] == [2]


def test_with_no_tick_running_a_drained_lease_is_releasable_at_once() -> None:
    table, _ = table_with([5, 6])
    table.start_draining([6, 7])  # 7 is not held: ignored
    assert [lease.partition_id for lease in table.releasable()] == [6]
    table.drop([6])
    assert (table.releasable(), table.draining(), sorted(table.held())) == ([], set(), [5])


def test_draining_keeps_its_place_and_set_draining_undrains_the_rest() -> None:
    table, _ = table_with([1, 2, 3])
    table.start_draining([3])
    number, _ = table.begin_tick()
    table.start_draining([3])  # idempotent: still releasable after ticks up to 0, i.e. now
    assert [lease.partition_id for lease in table.releasable()] == [3]
    table.set_draining([2])  # 3 is fired again; 2 drains from tick 1 on
    assert table.draining() == {2}
    assert table.releasable() == []
    assert table.firable() == {1: 3, 3: 3}
    table.end_tick(number)
    assert [lease.partition_id for lease in table.releasable()] == [2]


def test_renewing_a_draining_lease_keeps_it_draining() -> None:
    table, clock = table_with([4])
    table.start_draining([4])
    clock.advance(3.0)
    table.grant([(4, 3)], clock.monotonic(), TTL_S)
    assert table.draining() == {4}
    assert table.held()[4].deadline_mono == clock.monotonic() + TTL_S
    assert table.firable() == {}
