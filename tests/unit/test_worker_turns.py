"""TenantTurns (scheduler/delivery/worker.py): the order a worker serving several tenants asks
them in, and each tenant's idle backoff, on an injected clock."""

from __future__ import annotations

import pytest

from scheduler.delivery.worker import TenantTurns


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def turns(clock: Clock, tenants=("big", "a", "b", "c")) -> TenantTurns:
    return TenantTurns(tenants, poll_min_s=0.05, poll_max_s=1.0, clock=clock)


def test_the_first_round_asks_every_tenant_in_order(clock) -> None:
    assert turns(clock).due() == [0, 1, 2, 3]


def test_after_a_tenant_fills_a_round_the_next_starts_after_it(clock) -> None:
    t = turns(clock)
    t.record(0, 1000)  # big filled the round
    assert t.due() == [1, 2, 3, 0]
    t.record(1, 3)
    t.record(2, 997)  # a had 3, b filled the rest
    assert t.due() == [3, 0, 1, 2]


def test_an_empty_tenant_backs_off_doubling_to_the_cap(clock) -> None:
    t = turns(clock, tenants=("a",))
    waits = []
    for _ in range(7):
        t.record(0, 0)
        assert t.due() == []
        waits.append(round(t.wait_s(), 6))
        clock.now += waits[-1]
        assert t.due() == [0]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_tenant_backing_off_is_skipped_while_the_others_are_asked(clock) -> None:
    t = turns(clock)
    t.record(1, 0)
    assert t.due() == [0, 2, 3]
    t.record(0, 1000)
    assert t.due() == [2, 3, 0]  # after big, without a
    clock.now += 0.05
    assert t.due() == [1, 2, 3, 0]


def test_runs_reset_the_backoff(clock) -> None:
    t = turns(clock)
    for _ in range(4):
        t.record(2, 0)
        clock.now += 1.0
    t.record(2, 5)
    assert 2 in t.due()
    t.record(2, 0)
    clock.now += 0.049
    assert 2 not in t.due()
    clock.now += 0.002
    assert 2 in t.due()


def test_wait_s_is_until_the_first_tenant_may_be_asked(clock) -> None:
    t = turns(clock, tenants=("a", "b"))
    assert t.wait_s() == 0.0
    t.record(0, 0)  # 50 ms
    t.record(1, 0)
    t.record(1, 0)  # 100 ms
    assert t.due() == []
    assert t.wait_s() == pytest.approx(0.05)
    clock.now += 0.05
    assert t.due() == [0]
    assert t.wait_s() == 0.0


def test_an_empty_round_leaves_the_start_where_it_was(clock) -> None:
    t = turns(clock)
    t.record(2, 10)  # next round starts at c
    for i in (3, 0, 1, 2):
        t.record(i, 0)
    clock.now += 0.05
    assert t.due() == [3, 0, 1, 2]


def test_with_a_probe_the_ready_tenants_are_asked_whatever_their_backoff(clock) -> None:
    t = turns(clock)
    t.record(2, 0)  # b backing off
    t.record(0, 1000)  # big filled a round: the next starts at a
    assert t.due(ready={"b", "big"}) == [2, 0]
    assert t.due() == [0]  # a and c, found empty by the probe, now back off (b too, after its empty claim)
    assert t.wait_s() == 0.0


def test_a_probe_that_finds_nothing_backs_every_tenant_off_doubling(clock) -> None:
    t = turns(clock, tenants=("a", "b"))
    waits = []
    for _ in range(3):
        assert t.due(ready=set()) == []
        waits.append(round(t.wait_s(), 6))
        clock.now += waits[-1]
    assert waits == [0.05, 0.1, 0.2]
