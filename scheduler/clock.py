"""Injected clocks (CONTRIBUTING.md rule 4; db-scheduler's one-method ``Clock``).

The store's clock is the authority for leases and due times. A node's own
clock is used only for local deadlines (when to stop trusting a lease, when
to run the next tick) and for pacing, through this interface, so tests can
step time instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Local time source. ``monotonic()`` in seconds; ``wall()`` in Unix seconds."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (only differences are meaningful)."""

    def wall(self) -> float:
        """Unix time in seconds; used only to phase ticks onto second boundaries."""

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block until ``event`` is set or ``timeout_s`` passes; return ``event.is_set()``."""


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(max(0.0, timeout_s))


class ManualClock:
    """A clock tests advance by hand; ``wait`` advances time instead of sleeping."""

    def __init__(self, start_s: float = 1_000.0, wall_s: float = 1_700_000_000.0) -> None:
        self._now = start_s
        self._wall_offset = wall_s - start_s

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (≥ 0)."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        if not event.is_set():
            self.advance(max(0.0, timeout_s))
        return event.is_set()
