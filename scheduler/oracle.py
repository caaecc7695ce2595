"""An independent, deliberately simple computation of a schedule's slots.

``verify --exhaustive`` and the tests use it to check the expected slots
that :mod:`scheduler.schedule` computes (the code that also fires them, so a
bug there is invisible to an audit built on it alone). It shares no code
with :mod:`scheduler.cron` or :mod:`scheduler.schedule` and does not use
``cronsim``: it has its own small field parser, and finds slots by brute
force, testing every wall-clock minute (every second in the ``seconds``
dialect) of every local day whose date matches, then mapping each matching
wall time to real instants with ``zoneinfo`` (zones are loaded from the
bundled ``tzdata`` by :func:`scheduler.zones.load_zone`, so both agree on
the rules; its transition sampling is not used).

The semantics it implements are the documented ones (README "Schedules",
docs/design.md §3):

* dialect ``unix``: 5 fields, minute hour day-of-month month day-of-week;
  ``seconds``: 6 fields, seconds first. Macros ``@yearly @annually
  @monthly @weekly @daily @midnight @hourly`` (second 0 in ``seconds``).
* values, names (``JAN``-``DEC``, ``SUN``-``SAT``), ranges, lists, steps
  (``*/n`` over the field's whole range, ``a-b/n``, ``a/n`` = from a to the
  field's end); day-of-week 0-7 with 0 and 7 Sunday, so ``*/7`` is Sunday
  as in Vixie cron; a day-of-week range ending in ``SUN`` runs through 7;
  ``?`` is ``*`` in either day field.
* day-of-month ``L`` (last day), ``LW`` (last weekday), ``NW`` (the weekday
  nearest to day N, never leaving the month; none in a month shorter than
  N); day-of-week ``dL`` (last d of the month) and ``d#n`` (n-th d).
* day rule: in ``unix``, when both day fields are restricted a day matches
  either (OR); when either starts with ``*`` it must match both (AND). In
  ``seconds`` the two always combine with AND (Spring's rule).
* DST: a *fixed-time* expression (neither minute nor hour starts with
  ``*``) fires once for a wall time that occurs twice, at its first
  occurrence, and at the transition instant (the first instant whose wall
  clock is later) for a wall time inside a spring-forward gap; a
  *wildcard* expression fires at every real instant whose wall clock
  matches, so twice in a repeated hour and never in a gap. Slots falling on
  the same instant are one slot.
* interval: ``anchor + k × interval_s`` for k ≥ 0; once: ``fire_at``.

It is slow by design and bounds its work: a call refuses (``OracleError``)
to test more than ``budget`` wall-clock units (minutes or seconds of
matching days; interval slots), the cost being counted before any is
tested. Nothing here validates like ``jobs add`` does (over-long steps, or
expressions that never fire, are computed, not refused); unknown syntax
raises ``OracleError``.
"""

from __future__ import annotations

import calendar
import dataclasses
from datetime import UTC, date, datetime, timedelta

from scheduler.zones import load_zone

__all__ = ["DEFAULT_BUDGET", "CronRule", "OracleError", "cron_slots", "parse", "slots"]

UTC = UTC
DEFAULT_BUDGET = 5_000_000
"""Wall-clock units (minutes or seconds) one call tests at most by default."""

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
_DAYS = "SUN MON TUE WED THU FRI SAT".split()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Local days tested either side of the requested instants' own: covers any
# fall-back (a repeated stretch) or gap shorter than a day.
_MARGIN = timedelta(days=1)


class OracleError(ValueError):
    """The oracle cannot compute this (unknown syntax, or more work than its budget)."""


@dataclasses.dataclass(frozen=True)
class CronRule:
    """A parsed expression: the value sets and day terms, the day rule, the DST class."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    dom: tuple[tuple, ...]  # ("in", values) | ("L",) | ("LW",) | ("W", n)
    dow: tuple[tuple, ...]  # ("in", values with 7 as 0) | ("last", d) | ("nth", d, n)
    day_and: bool
    fixed_time: bool
    seconds_dialect: bool

    def day_matches(self, day: date) -> bool:
        """Whether the local date ``day`` matches the month and day fields."""
        if day.month not in self.months:
            return False
        in_dom = any(_dom_term(term, day) for term in self.dom)
        in_dow = any(_dow_term(term, day) for term in self.dow)
        return (in_dom and in_dow) if self.day_and else (in_dom or in_dow)


def _number(token: str, low: int, high: int, names: list[str], base: int) -> int:
    upper = token.upper()
    if upper in names:
        return names.index(upper) + base
    if not (token.isascii() and token.isdigit()):
        raise OracleError(f"cannot read {token!r}")
    value = int(token)
    if not low <= value <= high:
        raise OracleError(f"{value} is outside {low}-{high}")
    return value


def _values(text: str, low: int, high: int, names: list[str] = (), base: int = 0, dow: bool = False) -> set[int]:
    """Every value of a plain field (lists, ranges, steps, names)."""
    out: set[int] = set()
    for term in text.split(","):
        step, stepped = 1, "/" in term
        if stepped:
            term, step_text = term.split("/", 1)
            step = _number(step_text, 1, 10_000, [], 0)
        if term == "*":
            first, last = low, high
        elif "-" in term:
            a, b = term.split("-", 1)
            first, last = _number(a, low, high, names, base), _number(b, low, high, names, base)
            if dow and last == 0 and first > 0:
                last = 7  # MON-SUN: through Sunday
            if last < first:
                raise OracleError(f"reversed range {term!r}")
        else:
            first = _number(term, low, high, names, base)
            last = high if stepped else first  # a/n: from a to the field's end
        out.update(range(first, last + 1, step))
    return out


def _nearest_weekday(year: int, month: int, n: int) -> int | None:
    length = calendar.monthrange(year, month)[1]
    if n > length:
        return None
    weekday = date(year, month, n).weekday()  # Monday 0 .. Sunday 6
    if weekday == 5:  # Saturday: the Friday before, or Monday the 3rd
        return 3 if n == 1 else n - 1
    if weekday == 6:  # Sunday: the Monday after, or the Friday before at month end
        return n - 2 if n == length else n + 1
    return n


def _last_weekday(year: int, month: int) -> int:
    length = calendar.monthrange(year, month)[1]
    while date(year, month, length).weekday() >= 5:
        length -= 1
    return length


def _dom_term(term: tuple, day: date) -> bool:
    kind = term[0]
    if kind == "in":
        return day.day in term[1]
    length = calendar.monthrange(day.year, day.month)[1]
    if kind == "L":
        return day.day == length
    if kind == "LW":
        return day.day == _last_weekday(day.year, day.month)
    return day.day == _nearest_weekday(day.year, day.month, term[1])


def _cron_weekday(day: date) -> int:
    return (day.weekday() + 1) % 7  # Sunday 0 .. Saturday 6


def _dow_term(term: tuple, day: date) -> bool:
    kind = term[0]
    if kind == "in":
        return _cron_weekday(day) in term[1]
    if _cron_weekday(day) != term[1]:
        return False
    if kind == "last":
        return day.day + 7 > calendar.monthrange(day.year, day.month)[1]
    return (day.day - 1) // 7 + 1 == term[2]


def _dom_terms(text: str) -> tuple[tuple, ...]:
    terms = []
    for term in text.split(","):
        upper = term.upper()
        if upper == "L":
            terms.append(("L",))
        elif upper == "LW":
            terms.append(("LW",))
        elif upper.endswith("W"):
            terms.append(("W", _number(term[:-1], 1, 31, [], 0)))
        else:
            terms.append(("in", frozenset(_values(term, 1, 31))))
    return tuple(terms)


def _dow_terms(text: str) -> tuple[tuple, ...]:
    terms = []
    for term in text.split(","):
        upper = term.upper()
        if "#" in upper:
            d, n = upper.split("#", 1)
            terms.append(("nth", _number(d, 0, 7, _DAYS, 0) % 7, _number(n, 1, 5, [], 0)))
        elif upper.endswith("L") and upper not in _DAYS:
            terms.append(("last", _number(upper[:-1], 0, 7, _DAYS, 0) % 7))
        else:
            terms.append(("in", frozenset(v % 7 for v in _values(term, 0, 7, _DAYS, 0, dow=True))))
    return tuple(terms)


def parse(expr: str, dialect: str = "unix") -> CronRule:
    """Parse ``expr`` in ``dialect`` (``unix`` or ``seconds``); raises OracleError."""
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise OracleError(f"unknown macro {text!r}")
        text = ("0 " if dialect == "seconds" else "") + _MACROS[text.lower()]
    parts = text.split()
    want = {"unix": 5, "seconds": 6}.get(dialect)
    if want is None or len(parts) != want:
        raise OracleError(f"dialect {dialect!r} takes {want} fields, got {len(parts)}")
    if dialect == "unix":
        parts.insert(0, "0")
    second, minute, hour, dom, month, dow = parts
    dom = "*" if dom == "?" else dom
    dow = "*" if dow == "?" else dow
    return CronRule(
        seconds=frozenset(_values(second, 0, 59)),
        minutes=frozenset(_values(minute, 0, 59)),
        hours=frozenset(_values(hour, 0, 23)),
        months=frozenset(_values(month, 1, 12, _MONTHS, 1)),
        dom=_dom_terms(dom),
        dow=_dow_terms(dow),
        day_and=dialect == "seconds" or dom.startswith("*") or dow.startswith("*"),
        fixed_time=not minute.startswith("*") and not hour.startswith("*"),
        seconds_dialect=dialect == "seconds",
    )


def _local(instant: datetime, zone) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _real_instants(wall: datetime, zone) -> list[datetime]:
    """The instants whose wall clock in ``zone`` is ``wall``: none (a gap), one or two."""
    found = set()
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if _local(instant, zone) == wall:
            found.add(instant)
    return sorted(found)


def _after_gap(wall: datetime, zone) -> datetime:
    """The first instant whose wall clock is later than ``wall`` (a wall time in a gap)."""
    a, b = sorted(wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1))
    low, high = int((a - _EPOCH).total_seconds()) - 1, int((b - _EPOCH).total_seconds()) + 1
    while high - low > 1:  # local(low) < wall < local(high)
        middle = (low + high) // 2
        if _local(_EPOCH + timedelta(seconds=middle), zone) > wall:
            high = middle
        else:
            low = middle
    return _EPOCH + timedelta(seconds=high)


def candidates_per_day(rule: CronRule) -> int:
    """Wall times one matching day holds for ``rule``: matching hours × minutes
    (× seconds in the ``seconds`` dialect), the units :func:`cron_slots` tests."""
    return len(rule.hours) * len(rule.minutes) * (len(rule.seconds) if rule.seconds_dialect else 1)


def cron_slots(
    expr: str, dialect: str, tz: str, start: datetime, end: datetime, *, budget: int = DEFAULT_BUDGET
) -> list[datetime]:
    """Slots of a cron expression in zone ``tz`` with ``start ≤ slot < end``, sorted, aware UTC.

    Raises OracleError for syntax it cannot read, or when testing would
    take more than ``budget`` wall-clock units (the wall times of matching
    local days whose hour, minute and second match: :func:`candidates_per_day`).
    """
    rule = parse(expr, dialect)
    zone = load_zone(tz)
    first_day = _local(start, zone).date() - _MARGIN
    last_day = _local(end, zone).date() + _MARGIN
    days = []
    day = first_day
    while day <= last_day:
        if rule.day_matches(day):
            days.append(day)
        day += timedelta(days=1)
    per_day = candidates_per_day(rule)
    if len(days) * per_day > budget:
        raise OracleError(f"{len(days) * per_day} wall-clock units to test, more than the budget of {budget}")
    out: set[datetime] = set()
    seconds = sorted(rule.seconds) if rule.seconds_dialect else [0]
    for day in days:
        midnight = datetime(day.year, day.month, day.day)
        offset = zone.utcoffset(midnight)
        # One offset at both wall midnights: no transition that day (zones
        # change offset at most once a day), each wall time is one instant.
        plain = offset == zone.utcoffset(midnight + timedelta(days=1))
        # Every wall time of the day whose hour, minute and second match (the
        # others cannot: skipping them is the same test, cheaper).
        for hour in sorted(rule.hours):
            for minute in sorted(rule.minutes):
                for second in seconds:
                    wall = datetime(day.year, day.month, day.day, hour, minute, second)
                    if plain:
                        out.add((wall - offset).replace(tzinfo=UTC))
                        continue
                    instants = _real_instants(wall, zone)
                    if not instants:
                        if rule.fixed_time:
                            out.add(_after_gap(wall, zone))
                        continue
                    if rule.fixed_time:
                        instants = instants[:1]
                    out.update(instants)
    return sorted(t for t in out if start <= t < end)


def slots(
    kind: str,
    cron_expr: str | None,
    dialect: str | None,
    tz: str | None,
    interval_s: int | None,
    anchor_at: datetime | None,
    fire_at: datetime | None,
    start: datetime,
    end: datetime,
    *,
    budget: int = DEFAULT_BUDGET,
) -> list[datetime]:
    """Slots of one schedule (the ``jobs`` columns) with ``start ≤ slot < end``, sorted, aware UTC.

    Raises OracleError as :func:`cron_slots` does (an interval schedule
    counts one unit per slot in the range).
    """
    if kind == "cron":
        return cron_slots(cron_expr or "", dialect or "unix", tz or "UTC", start, end, budget=budget)
    if kind == "once":
        return [fire_at] if fire_at is not None and start <= fire_at < end else []
    if kind != "interval" or not interval_s or anchor_at is None:
        raise OracleError(f"cannot compute a {kind!r} schedule")
    step = timedelta(seconds=interval_s)
    if (end - start) / step > budget:
        raise OracleError(f"more than {budget} interval slots to list")
    k = max(0, (start - anchor_at) // step - 1)
    out = []
    while anchor_at + k * step < end:
        if anchor_at + k * step >= start:
            out.append(anchor_at + k * step)
        k += 1
    return out
