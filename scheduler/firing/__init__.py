"""Firing: once a second, fire what is due in this node's partitions (docs/design.md §4).

Modules, each importing only those before it (no circle):

* :mod:`~scheduler.firing.limits`: the thresholds (:class:`FiringLimits`,
  passed to the firer; :data:`DEFAULT_LIMITS`) and fixed choices.
* :mod:`~scheduler.firing.state`: a tick's state (:class:`Tick`, made once
  per tick) and outcome (:class:`TickResult`).
* :mod:`~scheduler.firing.batch`: the per-timer path's encoding: due rows
  planned (:class:`~scheduler.firing.batch.RowPlanner`) into ``fire_runs``
  column arrays (:class:`~scheduler.firing.batch.Batch`).
* :mod:`~scheduler.firing.herds`: many timers of one tenant due at one
  instant, found, planned per schedule key and fired in the store by
  ``fire_group`` (the essay "Herds" is its docstring).
* :mod:`~scheduler.firing.outcomes`: committed chunks counted (the
  pipeline's outcomes), rejected leases dropped; the rate caps' buckets.
* :mod:`~scheduler.firing.lookahead`: the schedules of the timers falling
  due in the next seconds, prepared in the waits between ticks.
* :mod:`~scheduler.firing.tick`: :class:`Firer`, the tick and its passes
  (the essay "A tick" is its docstring).

The write pipeline the chunks travel on (BEGIN; statement; COMMIT per chunk,
outcomes collected for the tick to count) is the store's
(:class:`scheduler.store.Pipeline`): firing never names a cursor.
"""

from __future__ import annotations

from scheduler.firing.limits import DEFAULT_LIMITS, FIRE_RUNS_PREPARE, TICK_PHASE_S, FiringLimits
from scheduler.firing.state import Tick, TickResult
from scheduler.firing.tick import Firer

__all__ = ["DEFAULT_LIMITS", "FIRE_RUNS_PREPARE", "TICK_PHASE_S", "Firer", "FiringLimits", "Tick", "TickResult"]
