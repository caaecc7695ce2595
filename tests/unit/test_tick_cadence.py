"""Firer.run's cadence (scheduler/firing/tick.py): when the next tick starts, on a ManualClock.

Ticks are phased onto wall-clock seconds (``TICK_PHASE_S`` after each one), when
second-aligned timers have just become due. A tick that overruns its second must
not then wait for the *next* phase point: the timers of the phase point it ran
over are already due. Found in a steady 12,000 runs/s bench: an autovacuum made a
few ticks end just past the phase point, each following tick waited ~1 s and fired
two seconds of timers, ran over again, and the node stayed in that pattern (first
runs of every other second fired 1.06 s late) after the vacuum had ended.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from scheduler.clock import ManualClock
from scheduler.firing.limits import TICK_PHASE_S
from scheduler.firing.state import TickResult
from scheduler.firing.tick import Firer

WALL_SECOND = 1_700_000_000.0


def cadence(durations: list[float], exhausted: bool = False, start_offset: float = TICK_PHASE_S) -> list[float]:
    """Run Firer.run over ticks lasting ``durations`` seconds (ManualClock); return each
    tick's start as an offset from the wall-clock second the first one started in."""
    clock = ManualClock(start_s=1_000.0, wall_s=WALL_SECOND + start_offset)
    stop, starts = threading.Event(), []
    durations = list(durations)

    def tick() -> TickResult:
        starts.append(round(clock.wall() - WALL_SECOND, 6))
        clock.advance(durations.pop(0))
        if not durations:
            stop.set()
        return TickResult(budget_exhausted=exhausted)

    firer = SimpleNamespace(
        _s=SimpleNamespace(tick_interval_s=1.0),
        _clock=clock,
        _wake=threading.Event(),
        tick=tick,
        look_ahead=lambda deadline: None,
    )
    Firer.run(firer, stop)  # type: ignore[arg-type]
    return starts


def test_short_ticks_start_at_the_phase_point_of_each_second() -> None:
    assert cadence([0.3, 0.1, 0.5]) == [TICK_PHASE_S, 1 + TICK_PHASE_S, 2 + TICK_PHASE_S]


def test_a_tick_that_ran_over_the_next_phase_point_is_followed_at_once() -> None:
    # Starts at .28 (late), ends at 1.05: the phase point 1.02 passed while it ran.
    starts = cadence([0.77, 0.3, 0.2], start_offset=0.28)
    assert starts == [0.28, 1.05, 2 + TICK_PHASE_S]


def test_a_tick_longer_than_a_second_is_followed_at_once_then_the_phase_resumes() -> None:
    starts = cadence([1.5, 0.4, 0.1])
    assert starts == [TICK_PHASE_S, 1.52, 2 + TICK_PHASE_S]


def test_a_tick_ending_before_its_seconds_phase_point_waits_for_it() -> None:
    # Started at .5 (e.g. woken after a lease claim), ends at .9: next at 1.02.
    assert cadence([0.4, 0.1], start_offset=0.5) == [0.5, 1 + TICK_PHASE_S]


def test_a_paced_tick_left_due_work_so_the_next_starts_one_interval_after_it() -> None:
    assert cadence([0.25, 0.25, 0.1], exhausted=True, start_offset=0.3) == [0.3, 1.3, 2.3]


def test_a_paced_tick_longer_than_the_interval_is_followed_at_once() -> None:
    assert cadence([1.2, 0.1], exhausted=True) == [TICK_PHASE_S, pytest.approx(1.22)]
