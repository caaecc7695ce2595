"""Injected clocks (CONTRIBUTING.md rule 4; db-scheduler's one-method ``Clock``).

The store's clock is the authority for leases and due times. A node's own
clock is used only for local deadlines (when to stop trusting a lease, when
to run the next tick) and for pacing, through this interface, so tests can
step time instead of sleeping.

The pinned store clock
----------------------
Every time-dependent named query takes a nullable ``%(now)s`` and reads
``coalesce(%(now)s::timestamptz, now())`` (River's pattern; the firing
statements' ``fired_at`` likewise falls back to ``statement_timestamp()``).
What a node's components pass there comes from one place, the clock they
were given: :meth:`Clock.store_now_or_none`. :class:`SystemClock`, the
production clock, always answers ``None``, so the store's own clock judges
(``tests/integration/test_store_clock.py`` checks that a node built from
default settings sends NULL in every such query). A test pins the store's
clock with :class:`ManualClock` (``store_at=``, :meth:`ManualClock.pin_store`)
and gets one exact answer: the due scan, ``fired_at`` (so lateness), the
lease expiries and heartbeats, and retention's cutoff are all computed from
the pinned instant, and :meth:`ManualClock.advance` moves it with the local
clock.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Local time source. ``monotonic()`` in seconds; ``wall()`` in Unix seconds."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (only differences are meaningful)."""

    def wall(self) -> float:
        """Unix time in seconds; used only to phase ticks onto second boundaries."""

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block until ``event`` is set or ``timeout_s`` passes; return ``event.is_set()``."""

    def store_now_or_none(self) -> datetime | None:
        """The instant (aware) the store's clock is pinned at, or None: the store's own ``now()``.

        Sent as the ``now`` parameter of every time-dependent query (see
        "The pinned store clock" above). Always None in production.
        """


class SystemClock:
    """The real clock. The store's clock is never pinned: :meth:`store_now_or_none` is None."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(max(0.0, timeout_s))

    def store_now_or_none(self) -> None:
        return None


class ManualClock:
    """A clock tests advance by hand; ``wait`` advances time instead of sleeping.

    ``store_at`` (aware datetime; default None, the store's own clock) pins
    the store's clock for the components given this clock (see "The pinned
    store clock" above); :meth:`advance` moves it by the same amount as the
    local clock, so local lease deadlines and store expiries stay in step.
    """

    def __init__(
        self, start_s: float = 1_000.0, wall_s: float = 1_700_000_000.0, store_at: datetime | None = None
    ) -> None:
        self._now = start_s
        self._wall_offset = wall_s - start_s
        self._store_at: datetime | None = None
        self.pin_store(store_at)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (≥ 0), the pinned store instant too."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds
        if self._store_at is not None:
            self._store_at += timedelta(seconds=seconds)

    def pin_store(self, instant: datetime | None) -> None:
        """Pin the store's clock at ``instant`` (aware); None unpins it (the store's ``now()``).

        Raises ValueError for a naive datetime (the store compares timestamptz).
        """
        if instant is not None and instant.utcoffset() is None:
            raise ValueError("store_at must be an aware datetime (with a UTC offset)")
        self._store_at = instant

    def store_now_or_none(self) -> datetime | None:
        return self._store_at

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        if not event.is_set():
            self.advance(max(0.0, timeout_s))
        return event.is_set()
