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


def test_an_empty_tenant_waits_a_tenth_of_its_idle_time_within_the_bounds(clock) -> None:
    t = turns(clock, tenants=("a",))
    t.record(0, 5)  # runs at 100.0: idle from here
    waits = []
    for idle in (0.0, 0.7, 1.0, 3.0, 9.0, 10.0, 40.0):
        clock.now = 100.0 + idle
        t.record(0, 0)
        assert t.due() == []
        waits.append(round(t.wait_s(), 6))
        clock.now += t.wait_s()
        assert t.due() == [0]
    assert waits == [0.05, 0.07, 0.1, 0.3, 0.9, 1.0, 1.0]


def test_a_tenant_that_never_had_runs_is_idle_since_the_turns_were_made(clock) -> None:
    t = turns(clock, tenants=("a",))
    clock.now += 5.0
    t.record(0, 0)
    assert t.wait_s() == pytest.approx(0.5)


def test_a_queue_fed_every_second_is_asked_at_least_every_100_ms(clock) -> None:
    """The steady load: runs every second (a tick's), the worker drains them within 0.3 s;
    before the next second's runs come it polls at most 100 ms apart, so they wait at most
    that long (doubling 50 → 800 ms used to sleep through most of the next second)."""
    t = turns(clock, tenants=("a",))
    for second in range(5):
        clock.now = 200.0 + second + 0.3
        t.record(0, 1000)  # drained
        gaps = []
        while clock.now < 200.0 + second + 1.0:
            t.record(0, 0)
            gaps.append(t.wait_s())
            clock.now += t.wait_s()
        assert max(gaps) <= 0.1 + 1e-9
        assert len(gaps) >= 7


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
        clock.now += 10.0
    t.record(2, 0)
    clock.now += 0.99
    assert 2 not in t.due()  # idle 40 s: 1 s
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
    t.record(1, 7)
    clock.now += 1.0
    t.record(0, 0)  # idle 1 s since the start... 100 ms
    clock.now += 0.05
    t.record(1, 0)  # idle 1.05 s: 105 ms
    assert t.due() == []
    assert t.wait_s() == pytest.approx(0.05)
    clock.now += 0.05
    assert t.due() == [0]
    assert t.wait_s() == 0.0
    assert t.due() == [0]  # b: 0.105 s after its empty claim
    clock.now += 0.055
    assert t.due() == [0, 1]


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


def test_a_probe_that_finds_nothing_backs_every_tenant_off_by_its_idle_time(clock) -> None:
    t = turns(clock, tenants=("a", "b"))
    t.record(0, 3)  # a got runs at 100.0; b never did
    clock.now += 2.0
    assert t.due(ready=set()) == []
    assert t.wait_s() == pytest.approx(0.2)
    clock.now += 0.2
    assert t.due(ready=set()) == []
    assert t.wait_s() == pytest.approx(0.22)


def test_a_timer_due_sooner_than_the_backoff_wakes_every_tenant_at_its_instant(clock) -> None:
    t = turns(clock, tenants=("a", "b"))
    clock.now += 60.0  # idle for a minute: 1 s backoffs
    t.record(0, 0)
    t.record(1, 0)
    assert t.wait_s() == pytest.approx(1.0)
    t.expect(0.25)
    assert t.wait_s() == pytest.approx(0.25)
    clock.now += 0.25
    assert t.due() == [0, 1]


def test_a_timer_due_later_than_the_backoff_changes_nothing(clock) -> None:
    t = turns(clock, tenants=("a",))
    clock.now += 60.0
    t.record(0, 0)
    t.expect(30.0)
    assert t.wait_s() == pytest.approx(1.0)
    clock.now += 1.0
    t.record(0, 0)  # not in the window yet: the idle backoff
    assert t.wait_s() == pytest.approx(1.0)


def test_after_a_due_instant_an_empty_claim_waits_poll_min_for_the_window_then_backs_off(clock) -> None:
    t = turns(clock, tenants=("a",))
    clock.now += 60.0
    t.record(0, 0)
    t.expect(0.5, window_s=1.0)  # due at 160.5; fast polls until 161.5
    waits = []
    for at in (160.5, 160.55, 161.0, 161.45, 161.5, 163.0):
        clock.now = at
        t.record(0, 0)
        waits.append(round(t.wait_s(), 6))
    assert waits == [0.05, 0.05, 0.05, 0.05, 1.0, 1.0]


def test_an_overdue_timer_wakes_now(clock) -> None:
    t = turns(clock, tenants=("a",))
    clock.now += 60.0
    t.record(0, 0)
    t.expect(-1.5)
    assert t.wait_s() == 0.0
    assert t.due() == [0]
