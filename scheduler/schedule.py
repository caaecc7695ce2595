"""Schedules: when a timer fires next, as pure functions of an instant.

Three kinds, one shape: ``next_after(instant) -> datetime | None`` returns
the first fire strictly after ``instant`` (an aware datetime), as an aware
UTC datetime, or ``None`` when there is none. Nothing here reads a clock or
the host's time zone: ``now`` is always an argument (case C19: a schedule in
UTC must not care that the host falls back tonight).

- :class:`CronSchedule`: a cron expression evaluated on the wall clock of
  an IANA zone (docs/design.md §3).
- :class:`IntervalSchedule`: every ``interval_s`` *elapsed* seconds from
  an anchor instant (24 h is 86,400 s, across DST too).
- :class:`OnceSchedule`: one instant.

Cron across DST: the policy
----------------------------
We follow Debian/ISC cron, the behaviour most operators expect, and the
cases in ``tests/data/cron-cases.json`` pin it down. A job is
*fixed-time* when neither its minute nor its hour field starts with ``*``
(``30 2 * * *``, ``0 1-23/2 * * *``); otherwise it is a *wildcard* job
(``*/15 * * * *``, ``0 */2 * * *``, ``* 2 * * *``).

- Fall-back (a stretch of wall time happens twice): a fixed-time job fires
  once, at the first occurrence (C01, C04, C14); a wildcard job fires at
  every real instant whose wall clock matches, so in both passes (C05, C13,
  C20).
- Spring-forward (a stretch of wall time never happens): a fixed-time job
  whose wall time falls in the gap fires once, at the transition instant,
  so the day is never lost (C02, C11, C16, C17, C23, C58, C59, a 2-hour
  gap); several slots in the gap, and a slot at the first wall time after
  it, collapse into that one fire. A wildcard job simply has no fire for
  wall times that do not exist (C22).
- Day-of-week and day-of-month are read on the zone's wall clock (C61).

The algorithm
-------------
A zone's timeline is a sequence of *segments* ``[a, b)`` of constant UTC
offset ``o``, split at offset transitions (:mod:`scheduler.zones` finds
them). Inside a segment ``wall = instant + o`` is a bijection onto the
walls ``[a + o, b + o)`` and preserves order, so the first fire after
``t`` in the segment is the first cron match (a naive wall time, from
:meth:`CronExpression.next_wall`) after ``t + o``, if it lies before
``b + o``. Otherwise, at the segment's end ``b``:

- if ``b`` springs forward (offset grows to ``o2``) and the job is
  fixed-time, the gap walls are ``[b + o, b + o2)``; the match just found
  lies there iff it is ``< b + o2``, and then the fire is ``b`` itself;
- then move on to the next segment (offset ``o2``), searching instants
  ``>= b``. For a fixed-time job after a fall-back, the walls up to the
  previous segment's end wall were already seen, so the search starts
  after them: the repeated walls never fire twice.

Segments without a transition for two years are cut into two-year pieces
(:data:`scheduler.zones.TRANSITION_HORIZON_S`), and the last cron match
is reused while it is still ahead, so a rare expression (``0 0 * 2 MON#5``,
next in 2044) costs one cronsim search, not one per piece. The search
gives up (``None``) after one Gregorian cycle (400 years: a valid
expression always matches within one) or at the end of the supported
range (year 9997).

Assumptions: at most one offset change per day (the sampling step of
:mod:`scheduler.zones`), and a segment lasts longer than the fall-back it
follows (true of every real zone).

Speed (best of 5 ``timeit`` runs, CPython 3.11 on the 2-vCPU build host,
parsed expression and zone-year already cached): ``next_after`` takes
8-17 µs for everyday expressions (``* * * * *``, ``*/5``, ``0 0 * * *``,
``30 2 * * *``, ``0 9 * * 1-5``, ``0 0 1 * *``, ``L``, ``15W``) in UTC,
America/New_York, Europe/Berlin and Australia/Lord_Howe alike, about 10 µs
when iterating (``next_after`` of the previous fire); the first use of a
zone-year costs about 1 ms of sampling. Rare expressions cost what
cronsim's month scan costs: ``0 0 * 2 MON#5`` (next in 2044) about 0.3 ms.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from scheduler.cron import CYCLE_S, CronExpression
from scheduler.errors import ValidationError
from scheduler.zones import (
    DAY_S,
    MAX_EPOCH_S,
    MIN_EPOCH_S,
    TRANSITION_HORIZON_S,
    load_zone,
    next_transition,
    previous_transition,
    utc_offset,
)

__all__ = [
    "CronSchedule",
    "IntervalSchedule",
    "OnceSchedule",
    "Schedule",
    "format_instant",
    "iter_fires",
    "parse_instant",
]

UTC = UTC
NOT_AN_INSTANT = "not an ISO 8601 instant (expected e.g. 2024-01-01T00:00:00Z)"
NO_UTC_OFFSET = "instant has no UTC offset; add Z or an offset such as +01:00"
"""The rules :func:`parse_instant` gives (the HTTP API's errors say the same words)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_MICROSECOND = timedelta(microseconds=1)


class Schedule(Protocol):
    """What every schedule kind offers."""

    def next_after(self, instant: datetime) -> datetime | None:
        """The first fire strictly after aware ``instant`` (aware UTC), or ``None``."""
        ...


def _require_aware(value: object, field: str) -> datetime:
    if not isinstance(value, datetime):
        raise ValidationError(field, "must be a datetime with a UTC offset", value)
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, "naive datetime: an instant needs a UTC offset (or Z)", value)
    return value


def _epoch_s(instant: datetime) -> int:
    """Whole epoch seconds of aware ``instant``, rounded down (exact, no float)."""
    return (instant - _EPOCH) // _SECOND


def _instant(epoch_s: int) -> datetime:
    return _EPOCH + timedelta(seconds=epoch_s)


class CronSchedule:
    """A cron expression on the wall clock of an IANA zone (see the module essay).

    ``expr`` and ``dialect`` as in :meth:`CronExpression.parse`; ``tz`` an
    IANA zone name as in :func:`scheduler.zones.load_zone`. Raises
    :class:`~scheduler.errors.ValidationError` (fields ``cron``,
    ``dialect``, ``tz``) when either is invalid, including expressions that
    never fire. Immutable; safe to share between threads.
    """

    __slots__ = ("expression", "tz", "zone")

    def __init__(self, expr: str, tz: str = "UTC", dialect: str = "unix") -> None:
        self.expression = CronExpression.parse(expr, dialect)
        self.zone: ZoneInfo = load_zone(tz)
        self.tz = tz

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression.text!r}, tz={self.tz!r}, dialect={self.expression.dialect!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronSchedule):
            return NotImplemented
        return (self.expression, self.tz) == (other.expression, other.tz)

    def __hash__(self) -> int:
        return hash((self.expression, self.tz))

    def next_after(self, instant: datetime) -> datetime | None:
        """Return the first fire strictly after ``instant``, as an aware UTC datetime.

        ``instant`` must be aware (any offset); sub-second parts are
        honoured (the fire is strictly later). ``None`` when no fire exists
        before the end of the supported range (year 9997). Raises
        :class:`~scheduler.errors.ValidationError` (field ``after``) for a
        naive datetime or one outside years 2..9997.
        """
        after = _epoch_s(_require_aware(instant, "after"))
        fire = self.next_after_s(after)
        return None if fire is None else _instant(fire)

    def next_after_s(self, after_s: int) -> int | None:
        """Return the first fire (epoch seconds) strictly after ``after_s`` (epoch seconds).

        The integer core of :meth:`next_after`; same errors (field ``after``).
        """
        zone = self.zone
        expression = self.expression
        fixed = expression.is_fixed_time
        offset = utc_offset(zone, after_s)  # also checks the range (field "after")
        limit = min(after_s + CYCLE_S + 2 * DAY_S, MAX_EPOCH_S)
        # Fixed-time jobs: walls below `seen` already happened (before a fall-back).
        seen = -(2**62)
        if fixed:
            previous = previous_transition(zone, after_s, 2 * DAY_S)
            if previous is not None:
                seen = previous[0] + previous[1]
        segment_start = after_s  # search for the segment's end from here
        lower = after_s  # exclusive lower bound for fires
        cached_low, cached_match = 0, None  # cached_match = first match > cached_low
        while True:
            transition = next_transition(zone, segment_start)
            if transition is None:
                end, next_offset = min(segment_start + TRANSITION_HORIZON_S, MAX_EPOCH_S), offset
            else:
                end, _, next_offset = transition
            low = lower + offset
            if seen - 1 > low:
                low = seen - 1
            if cached_match is not None and cached_low <= low < cached_match:
                match = cached_match
            else:
                found = expression.next_wall(low, limit + offset + DAY_S)
                if found is None:
                    return None
                match = found
                cached_low, cached_match = low, match
            if match < end + offset:
                return match - offset
            if fixed and next_offset > offset and match < end + next_offset:
                return end  # a fixed-time slot in the spring-forward gap
            if end >= limit:
                return None
            if fixed:
                seen = max(seen, end + offset)
            segment_start, lower, offset = end, end - 1, next_offset

    def smallest_gap_s(self, limit_s: int, after: datetime, horizon_s: int = TRANSITION_HORIZON_S) -> int | None:
        """Return the smallest gap (seconds) of at most ``limit_s`` between consecutive fires, or ``None``.

        ``None``: no two consecutive fires were found ``limit_s`` seconds
        apart or closer. Sound, and bounded, rather than exact over all
        time; the method:

        - Away from UTC-offset changes a fire is its wall time less a
          constant offset, so consecutive fires are as far apart as their
          wall times: :meth:`CronExpression.smallest_wall_gap_s` gives the
          smallest such gap, exactly, over all time.
        - Any other pair of consecutive fires ``(p, q)`` has an offset
          change at an instant ``t`` with ``p < t <= q``, or starts at it
          (``p = t``: the fire of a fixed-time slot in a spring-forward
          gap). A spring-forward gap or a fall-back repeat can bring such
          a pair closer than the wall clock does: ``30 1,2 * * *`` in
          America/New_York fires at 01:30 EST and at the 03:00 EDT jump,
          1,800 s apart; ``0 */2 * * *`` in Europe/Berlin at 02:00 CEST and
          02:00 CET, 3,600 s apart. For every change in ``(after, after +
          horizon_s]`` (default about two years; :mod:`scheduler.zones`
          finds them), the fires from ``t - bound`` through the second
          fire at or after ``t`` are enumerated with :meth:`next_after_s`,
          ``bound`` being the smallest gap found so far less one, or
          ``limit_s``: a few calls per change, because the fires before
          ``t`` in that window are at least the wall gap apart.

        Changes beyond the horizon, or that a later tzdata release
        introduces, are not seen. Raises
        :class:`~scheduler.errors.ValidationError` (field ``after``) for a
        naive ``after``.
        """
        after_s = _epoch_s(_require_aware(after, "after"))
        wall_gap = self.expression.smallest_wall_gap_s()
        best = wall_gap if wall_gap is not None and wall_gap <= limit_s else None
        end = min(after_s + horizon_s, MAX_EPOCH_S)
        cursor = after_s
        while cursor < end:
            transition = next_transition(self.zone, cursor, end - cursor)
            if transition is None:
                break
            instant = cursor = transition[0]
            bound = limit_s if best is None else best - 1
            previous, at_or_after = None, 0
            fire = self.next_after_s(instant - bound - 1)
            while fire is not None:
                if previous is not None and fire - previous <= bound:
                    best = fire - previous
                    bound = best - 1
                if fire >= instant:
                    at_or_after += 1
                    if at_or_after == 2:
                        break
                previous, fire = fire, self.next_after_s(fire)
        return best


class IntervalSchedule:
    """Fires every ``interval_s`` elapsed seconds: at ``anchor + k * interval_s``, k = 0, 1, 2, ...

    ``interval_s`` is a positive whole number of seconds (an ``int``, or a
    float with no fractional part); elapsed time, so ``86400`` stays 24 h
    apart across DST. ``anchor`` is an aware datetime and is the first
    slot. Raises :class:`~scheduler.errors.ValidationError`: field
    ``interval`` for zero, negative, fractional or non-numeric intervals;
    field ``anchor`` for a naive anchor.
    """

    __slots__ = ("anchor", "interval_s")

    def __init__(self, interval_s: object, anchor: datetime) -> None:
        if isinstance(interval_s, float) and interval_s.is_integer():
            interval_s = int(interval_s)
        if isinstance(interval_s, bool) or not isinstance(interval_s, int):
            raise ValidationError("interval", "interval must be a whole number of seconds", interval_s)
        if interval_s <= 0:
            raise ValidationError("interval", "interval must be at least 1 second", interval_s)
        self.interval_s = interval_s
        self.anchor = _require_aware(anchor, "anchor").astimezone(UTC)

    def __repr__(self) -> str:
        return f"IntervalSchedule({self.interval_s}, anchor={format_instant(self.anchor)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSchedule):
            return NotImplemented
        return (self.interval_s, self.anchor) == (other.interval_s, other.anchor)

    def __hash__(self) -> int:
        return hash((self.interval_s, self.anchor))

    def next_after(self, instant: datetime) -> datetime | None:
        """Return the first slot strictly after aware ``instant`` (aware UTC).

        ``anchor`` itself when ``instant`` is before it. ``None`` only when
        the slot is past ``datetime.max``. Raises
        :class:`~scheduler.errors.ValidationError` (field ``after``) for a
        naive ``instant``.
        """
        elapsed_us = (_require_aware(instant, "after") - self.anchor) // _MICROSECOND
        if elapsed_us < 0:
            return self.anchor
        k = elapsed_us // (self.interval_s * 1_000_000) + 1
        try:
            return self.anchor + timedelta(seconds=k * self.interval_s)
        except OverflowError:
            return None

    def smallest_gap_s(self, limit_s: int, after: datetime | None = None) -> int | None:
        """``interval_s`` if it is at most ``limit_s``, else ``None`` (every gap is the interval)."""
        return self.interval_s if self.interval_s <= limit_s else None


class OnceSchedule:
    """Fires once, at aware ``at`` (stored in UTC).

    Raises :class:`~scheduler.errors.ValidationError` (field ``at``) for a
    naive datetime or one outside years 2..9997.
    """

    __slots__ = ("at",)

    def __init__(self, at: object) -> None:
        self.at = _require_aware(at, "at").astimezone(UTC)
        if not MIN_EPOCH_S <= _epoch_s(self.at) < MAX_EPOCH_S:
            raise ValidationError("at", "must lie in years 2 to 9997 (the supported range)", format_instant(self.at))

    def __repr__(self) -> str:
        return f"OnceSchedule({format_instant(self.at)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OnceSchedule):
            return NotImplemented
        return self.at == other.at

    def __hash__(self) -> int:
        return hash(self.at)

    def next_after(self, instant: datetime) -> datetime | None:
        """Return ``at`` if it is strictly after aware ``instant``, else ``None``.

        Raises :class:`~scheduler.errors.ValidationError` (field ``after``)
        for a naive ``instant``.
        """
        return self.at if self.at > _require_aware(instant, "after") else None

    def smallest_gap_s(self, limit_s: int, after: datetime | None = None) -> int | None:
        """Always ``None``: a single fire has no gap."""
        return None


ScheduleKind = CronSchedule | IntervalSchedule | OnceSchedule
"""Any of the three schedule classes (they also offer ``smallest_gap_s``)."""


def iter_fires(schedule: Schedule, after: datetime, until: datetime) -> Iterator[datetime]:
    """Yield the fires ``f`` of ``schedule`` with ``after < f <= until``, oldest first.

    Both bounds are aware datetimes: ``after`` exclusive, ``until``
    inclusive, so consecutive windows ``(t0, t1]``, ``(t1, t2]`` neither
    miss nor repeat a fire. Fires are aware UTC datetimes, strictly
    increasing. Lazy: the caller bounds the work (e.g.
    ``itertools.islice``) for windows holding many fires. Raises
    :class:`~scheduler.errors.ValidationError` (field ``after`` or
    ``until``) for naive bounds.
    """
    current = _require_aware(after, "after")
    end = _require_aware(until, "until")
    while True:
        fire = schedule.next_after(current)
        if fire is None or fire > end:
            return
        yield fire
        current = fire


def parse_instant(text: str, field: str) -> datetime:
    """Parse an ISO 8601 instant with an offset or ``Z``; return it as aware UTC.

    Accepts e.g. ``2024-01-01T00:00:00Z``, ``2024-01-01T01:00:00+01:00``,
    fractional seconds. Raises :class:`~scheduler.errors.ValidationError`
    on ``field`` for a non-string, a malformed text, a naive one (no
    offset: which zone was meant is unknowable), or one outside the
    supported years 2..9997 (UTC), echoing the text as typed.
    """
    if not isinstance(text, str):
        raise ValidationError(field, "must be an ISO 8601 instant string such as 2024-01-01T00:00:00Z", text)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValidationError(field, NOT_AN_INSTANT, text) from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValidationError(field, NO_UTC_OFFSET, text)
    try:
        instant = parsed.astimezone(UTC)
    except OverflowError:  # before year 1 or after year 9999 once in UTC
        instant = None
    if instant is None or not MIN_EPOCH_S <= instant.timestamp() < MAX_EPOCH_S:
        raise ValidationError(field, "must lie in years 2 to 9997 (the supported range)", text)
    return instant


def format_instant(dt: datetime) -> str:
    """Format aware ``dt`` as UTC ISO 8601 with ``Z``: ``2024-01-01T00:00:00Z``.

    Microseconds appear (6 digits) only when nonzero. Raises
    :class:`~scheduler.errors.ValidationError` (field ``instant``) for a
    naive datetime.
    """
    utc = _require_aware(dt, "instant").astimezone(UTC)
    return utc.replace(tzinfo=None).isoformat() + "Z"
