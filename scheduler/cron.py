"""Cron expressions: parsing, validation and naive wall-clock matching.

This module knows nothing about time zones. It answers one question: given
a *wall-clock* time (a naive local date and time, encoded as integer
seconds since the naive 1970-01-01 00:00:00), which is the next wall-clock
time the expression matches? :mod:`scheduler.schedule` turns that into real
instants in a zone, with the DST policy of docs/design.md §3.

Matching is delegated to ``cronsim`` (its ``CronSim`` iterating a *naive*
datetime steps through matching wall times, and gets ``L``, ``LW``,
``5L``, ``#`` and ``7`` = Sunday right). Our own front layer parses the
expression first, so that every bad input is a
:class:`~scheduler.errors.ValidationError` on field ``cron`` whose rule
names the offending field, and rewrites it into a plain numeric expression
that cronsim reads the way we mean:

- dialects: ``unix`` is exactly 5 fields (minute hour day-of-month month
  day-of-week; a 6-field expression is refused with a hint to ask for
  ``seconds``, because ``0 * * * * *`` means different things to different
  libraries, case C50); ``seconds`` is exactly 6 fields, seconds first
  (Spring's ``CronExpression``, day-of-week 0-7, 0 and 7 = Sunday; not
  Quartz's 1-7 with 1 = Sunday). Quartz's 7-field form (with a year),
  Spring's ``L-n`` and ``@reboot`` are refused. The macros ``@yearly @annually @monthly
  @weekly @daily @midnight @hourly`` are expanded (in the seconds dialect
  with second 0).
- the day rule (which days match when both day fields are given): in the
  ``unix`` dialect Vixie/Debian's, when either day field starts with ``*``
  a day must match both (AND), otherwise either (OR); in the ``seconds``
  dialect Spring's, always both (AND: ``0 0 0 13 * FRI`` is Friday the
  13th). cronsim derives the unix rule from the text; the parsed
  expression carries the rule (``day_and``) and sets it on the iterator.
- ``?`` (Quartz, Spring, robfig, croniter: "no specific value") is read as
  ``*`` when it is a whole day-of-month or day-of-week field, in both
  dialects; so under the unix rule it counts as a field starting with
  ``*`` (``0 0 ? * MON`` is every Monday). Anywhere else (another field,
  or inside a list or range) it is refused. It cannot reach the DST
  policy, which looks at the minute and hour fields only.
- ranges: reversed ranges are refused, except that a day-of-week range
  ending in ``SUN`` or ``7`` runs through Sunday: ``MON-SUN`` is every day
  (croniter's reading, case C37; cronsim alone would refuse it).
- steps: a zero step, and a step larger than the field's span (minute and
  second 59, hour 23, day-of-month 30, month 11, day-of-week 7) are
  refused: ``*/59`` is valid and means minutes {0, 59}; ``*/60`` and
  ``*/90`` are not (case C49). ``59/15`` means {59} (case C29). A step
  runs over the values of its base, so in day-of-week ``*`` is 0-7 as in
  Vixie cron: ``*/7`` is {0, 7}, Sunday only, and ``*/2`` is {0, 2, 4, 6}
  (Sunday, Tuesday, Thursday, Saturday) in both dialects (Spring would
  count from Monday there).
- ``NW`` (the weekday nearest to day N, Quartz semantics, never crossing
  into another month, no fire in a month shorter than N) is not in
  cronsim: cronsim is handed the day range ``N-2..N+2`` and the matches on
  any other day than the nearest weekday are skipped. ``NW`` must be the
  only day-of-month term and day-of-week must be ``*``.
- unsatisfiable expressions (``0 0 31 2 *``, ``0 0 30 2 *``, case C32) are
  refused at parse time, never hang, in three bounded steps: a static
  check with a precise message for plain days beyond every chosen month's
  length; an exact check over the 91 *month shapes* (month, length,
  weekday of the 1st: which days match depends on nothing else, and all
  occur in 2001-2028), a few milliseconds at worst; and finally a search
  with the same iterator the schedules use: the Gregorian calendar repeats
  every 400 years (146,097 days, a whole number of weeks), so the set of
  matching wall times is periodic with that period and "no match within
  400 years and a day" means "never". Rare matches are found quickly:
  ``0 0 * 2 MON#5`` fires on Feb 29 falling on a Monday, 2044, 2072,
  2112 (case C44).

``is_fixed_time`` (neither the minute nor the hour field starts with ``*``,
after macro expansion; the seconds field does not count) selects the DST
policy in :mod:`scheduler.schedule`.

Speed: parsing is cached (``lru_cache`` on ``(expr, dialect)``) and the
cronsim object is built once per expression; each query clones it (a dict
copy) and iterates it once, 5-15 µs for everyday expressions. The clone is
a :class:`_WallSim`, a cronsim subclass that jumps to the next hour,
minute or second in the field's sorted set instead of ticking one unit at
a time, and memoises each month's matching days (cronsim's own
``match_day``); that made ``0 0 * * *`` from 07:34 about 4x faster.
"""

from __future__ import annotations

import calendar
import functools
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError
from cronsim.cronsim import Field

from scheduler.errors import ValidationError

__all__ = [
    "CYCLE_S",
    "DIALECTS",
    "MACROS",
    "CronExpression",
    "nearest_weekday",
]

DIALECTS = ("unix", "seconds")
"""Supported dialects: ``unix`` (5 fields), ``seconds`` (6 fields, seconds first)."""

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Macro -> the 5-field unix expression it stands for."""

CYCLE_S = 146_097 * 86_400
"""The Gregorian cycle: 400 years = 146,097 days = 20,871 weeks, in seconds."""

MAX_EXPR_LEN = 512
"""Longest expression accepted (characters)."""

_WALL_EPOCH = datetime(1970, 1, 1)
_SEARCH_START = datetime(2000, 1, 1)
_DAY = timedelta(days=1)
_HOUR_DELTA = timedelta(hours=1)
_MINUTE_DELTA = timedelta(minutes=1)
_MIDNIGHT = datetime.min.time()


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    max_step: int
    names: tuple[str, ...] = ()  # names[i] stands for the value name_base + i
    name_base: int = 0


_SECOND = _FieldSpec("second", 0, 59, 59)
_MINUTE = _FieldSpec("minute", 0, 59, 59)
_HOUR = _FieldSpec("hour", 0, 23, 23)
_DOM = _FieldSpec("day-of-month", 1, 31, 30)
_MONTH = _FieldSpec("month", 1, 12, 11, tuple("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()), 1)
_DOW = _FieldSpec("day-of-week", 0, 7, 7, tuple("SUN MON TUE WED THU FRI SAT".split()), 0)
_UNIX_SPECS = (_MINUTE, _HOUR, _DOM, _MONTH, _DOW)

_MONTH_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # leap-year maximum


_QUESTION_RULE = "'?' (no specific value, = *) is only allowed as a whole day-of-month or day-of-week field"


class _Reject(Exception):
    """Internal: a field-level rule violation (message is the rule)."""


def nearest_weekday(year: int, month: int, day: int) -> int | None:
    """Return the day of month ``NW`` fires on in ``year``-``month``, or ``None``.

    Quartz semantics: ``day`` itself if it is Monday-Friday; the Friday
    before if it is a Saturday (the Monday after, 3rd, when ``day`` is the
    1st); the Monday after if it is a Sunday (the Friday before when
    ``day`` is the month's last day). Never leaves the month; ``None``
    when the month has fewer than ``day`` days.
    """
    first_weekday, length = calendar.monthrange(year, month)
    if day > length:
        return None
    weekday = (first_weekday + day - 1) % 7  # Monday = 0
    if weekday == 5:
        return day + 2 if day == 1 else day - 1
    if weekday == 6:
        return day - 2 if day == length else day + 1
    return day


def _value(spec: _FieldSpec, token: str) -> int:
    """Parse one value (digits or a name) of ``spec``; range-checked."""
    if token.isdigit() and token.isascii():
        number = int(token)
        if not spec.low <= number <= spec.high:
            raise _Reject(f"value {number} is out of range for the {spec.name} field ({spec.low}-{spec.high})")
        return number
    upper = token.upper()
    if upper in spec.names:
        return spec.names.index(upper) + spec.name_base
    if token == "":
        raise _Reject(f"missing value in the {spec.name} field")
    allowed = f"{spec.low}-{spec.high}"
    if spec.names:
        allowed += f" or {spec.names[0]}-{spec.names[-1]}"
    raise _Reject(f"{token!r} is not a valid value in the {spec.name} field ({allowed})")


def _step(spec: _FieldSpec, token: str) -> int:
    if not (token.isdigit() and token.isascii()):
        raise _Reject(f"step {token!r} in the {spec.name} field must be a whole number")
    step = int(token)
    if step == 0:
        raise _Reject(f"step 0 in the {spec.name} field: a step must be at least 1")
    if step > spec.max_step:
        raise _Reject(f"step {step} is larger than the {spec.name} field allows (at most {spec.max_step})")
    return step


def _is_special(spec: _FieldSpec, upper: str) -> bool:
    """True for the L / LW / NW / nL / d#n forms (a name such as JUL is not special)."""
    if upper in spec.names:
        return False
    return "#" in upper or upper in ("L", "LW") or (upper[-1:] in ("L", "W") and upper[:-1].isalnum())


def _term(spec: _FieldSpec, term: str) -> tuple[str, int | None]:
    """Normalise one comma-separated term; return (cronsim text, W day or None)."""
    if term == "":
        raise _Reject(f"empty item in the {spec.name} field")
    if "?" in term:
        raise _Reject(f"{_QUESTION_RULE}, not in the {spec.name} field" if spec not in (_DOM, _DOW) else _QUESTION_RULE)
    upper = term.upper()
    if "/" in term:
        base, step_text = term.split("/", 1)
        step = _step(spec, step_text)
        if base == "*":
            return f"*/{step}", None
        if _is_special(spec, base.upper()):
            raise _Reject(f"a step cannot follow {base!r} in the {spec.name} field")
        if "-" in base:
            low, high = _range(spec, base)
            return f"{low}-{high}/{step}", None
        return f"{_value(spec, base)}/{step}", None
    if term == "*":
        return "*", None
    if "-" in term:
        if spec is _DOM and upper.startswith("L-"):
            raise _Reject(f"{term!r} (n days before the last day of the month) is not supported; L, LW and NW are")
        low, high = _range(spec, term)
        return f"{low}-{high}", None
    if not _is_special(spec, upper):
        return str(_value(spec, term)), None
    if spec is _DOM:
        if upper in ("L", "LW"):
            return upper, None
        if upper.endswith("W"):
            day = _value(spec, term[:-1])
            return f"{max(1, day - 2)}-{min(31, day + 2)}", day
    elif spec is _DOW:
        if "#" in upper:
            day_text, nth_text = term.split("#", 1)
            day = _value(spec, day_text)
            if not (nth_text.isdigit() and nth_text.isascii() and 1 <= int(nth_text) <= 5):
                raise _Reject(f"{term!r}: the n in day#n must be 1-5 in the day-of-week field")
            return f"{day}#{int(nth_text)}", None
        if upper == "L":
            raise _Reject("'L' alone is not allowed in the day-of-week field; write e.g. 5L for the last Friday")
        if upper.endswith("L"):
            return f"{_value(spec, term[:-1])}L", None
    if "#" in upper:
        raise _Reject(f"{term!r}: '#' (nth weekday) is only allowed in the day-of-week field")
    if upper.endswith("W"):
        raise _Reject(f"{term!r}: W (nearest weekday) is only allowed in the day-of-month field")
    raise _Reject(
        f"{term!r}: L is only allowed in the day-of-month field (L, LW) and the day-of-week field (5L = last Friday)"
    )


def _range(spec: _FieldSpec, text: str) -> tuple[int, int]:
    parts = text.split("-")
    if len(parts) != 2:
        raise _Reject(f"{text!r} is not a valid range in the {spec.name} field (write low-high)")
    low, high = _value(spec, parts[0]), _value(spec, parts[1])
    if spec is _DOW and low > 0 and high == 0 and parts[1].upper() == "SUN":
        high = 7  # MON-SUN, 1-SUN: through Sunday, i.e. through 7.
    if high < low:
        hint = " (a day-of-week range may end in SUN or 7)" if spec is _DOW else ""
        raise _Reject(f"range {text} in the {spec.name} field is reversed; wrap-around ranges are not supported{hint}")
    return low, high


def _field(spec: _FieldSpec, text: str) -> tuple[str, int | None]:
    """Normalise one field; return (cronsim text, W day or None).

    A day field that is exactly ``?`` is ``*`` (Quartz's "no specific value").
    """
    if text == "?" and spec in (_DOM, _DOW):
        return "*", None
    normalised = []
    w_day = None
    terms = text.split(",")
    for term in terms:
        out, term_w = _term(spec, term)
        if term_w is not None:
            if len(terms) > 1:
                raise _Reject(f"{term!r}: W (nearest weekday) must be the only term of the day-of-month field")
            w_day = term_w
        normalised.append(out)
    return ",".join(normalised), w_day


def _wall_of(dt: datetime) -> int:
    delta = dt - _WALL_EPOCH
    return delta.days * 86_400 + delta.seconds


def _month_names(months: set[Any]) -> str:
    return ", ".join(calendar.month_name[m] for m in sorted(months))


_MONTH_CACHE_SIZE = 512


class _WallSim(CronSim):
    """cronsim's iterator, for naive wall times only, jumping instead of ticking.

    ``CronSim.advance_*`` step one second/minute/hour/day at a time until a
    field matches (``0 0 * * *`` from 07:34 is 17 hour ticks). These
    overrides keep cronsim's contract (return ``False`` without touching
    ``dt`` when the field already matches; otherwise move ``dt`` forward to
    the next candidate, or to the start of the next larger unit so that
    ``advance`` re-checks the larger fields) but jump straight to the next
    value in the sorted field set, and memoise each month's matching days
    (``match_day``, cronsim's own day rule) in a small per-expression cache.
    Equivalence with plain ``CronSim`` is a property test.
    """

    _second_list: tuple[int, ...]
    _minute_list: tuple[int, ...]
    _hour_list: tuple[int, ...]
    _month_days: dict[tuple[int, int], tuple[int, ...]]

    def tick(self, seconds: int = 1) -> None:
        self.dt += timedelta(seconds=seconds)

    def advance_second(self) -> bool:
        dt = self.dt
        if dt.second in self.seconds:
            return False
        for second in self._second_list:
            if second > dt.second:
                self.dt = dt.replace(second=second)
                return True
        self.dt = dt.replace(second=0) + _MINUTE_DELTA
        return True

    def advance_minute(self) -> bool:
        dt = self.dt
        if dt.minute in self.minutes:
            return False
        for minute in self._minute_list:
            if minute > dt.minute:
                self.dt = dt.replace(minute=minute, second=0)
                return True
        self.dt = dt.replace(minute=0, second=0) + _HOUR_DELTA
        return True

    def advance_hour(self) -> bool:
        dt = self.dt
        if dt.hour in self.hours:
            return False
        for hour in self._hour_list:
            if hour > dt.hour:
                self.dt = dt.replace(hour=hour, minute=0, second=0)
                return True
        self.dt = datetime.combine(dt.date() + _DAY, _MIDNIGHT)
        return True

    def advance_day(self) -> bool:
        dt = self.dt
        key = (dt.year, dt.month)
        days = self._month_days.get(key)
        if days is None:
            length = calendar.monthrange(dt.year, dt.month)[1]
            days = tuple(d for d in range(1, length + 1) if self.match_day(date(dt.year, dt.month, d)))
            if len(self._month_days) >= _MONTH_CACHE_SIZE:
                self._month_days.clear()
            self._month_days[key] = days
        if dt.day in days:
            return False
        for day in days:
            if day > dt.day:
                self.dt = datetime(dt.year, dt.month, day)
                return True
        self.dt = datetime(dt.year + dt.month // 12, dt.month % 12 + 1, 1)
        return True


@dataclass(frozen=True, slots=True, eq=False)
class CronExpression:
    """A parsed, validated cron expression (immutable; build with :meth:`parse`).

    ``text`` is the expression as given, ``dialect`` ``"unix"`` or
    ``"seconds"``, ``fields`` the normalised 6 fields handed to cronsim
    (second minute hour day-of-month month day-of-week; numeric, names
    resolved, ``?`` read as ``*``, ``NW`` widened to ``N-2..N+2``),
    ``w_day`` the N of an ``NW`` day-of-month (else ``None``), ``day_and``
    the day rule (``True``: a day must match both day fields; ``False``:
    either), ``is_fixed_time`` the DST policy switch. Equality is by
    ``(fields, w_day, day_and)``: two spellings of the same schedule are
    equal.
    """

    text: str
    dialect: str
    fields: tuple[str, ...]
    w_day: int | None
    day_and: bool
    is_fixed_time: bool
    _template: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expr: str, dialect: str = "unix") -> CronExpression:
        """Parse and validate ``expr`` in ``dialect``; return the expression.

        Cached per ``(expr, dialect)``. Raises
        :class:`~scheduler.errors.ValidationError`: field ``dialect`` for an
        unknown dialect; field ``cron`` for anything wrong with the
        expression (wrong field count, unknown macro or ``@reboot``, a
        misplaced ``?``, ``L-n``, out-of-range value, unknown name, empty
        field, zero or over-long step, reversed range, misplaced
        ``L``/``W``/``#``, or an expression that never fires); the rule
        names the field at fault.
        """
        if not isinstance(dialect, str) or dialect not in DIALECTS:
            raise ValidationError(
                "dialect", "dialect must be 'unix' (5 fields) or 'seconds' (6 fields, seconds first)", dialect
            )
        if not isinstance(expr, str):
            raise ValidationError("cron", "cron expression must be a string", expr)
        return _parse(expr, dialect)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronExpression):
            return NotImplemented
        return (self.fields, self.w_day, self.day_and) == (other.fields, other.w_day, other.day_and)

    def __hash__(self) -> int:
        return hash((self.fields, self.w_day, self.day_and))

    def __str__(self) -> str:
        return self.text

    @property
    def normalized(self) -> str:
        """The 6-field numeric expression cronsim iterates (seconds first)."""
        return " ".join(self.fields)

    def smallest_wall_gap_s(self) -> int | None:
        """The smallest difference (seconds) between consecutive matching wall times, or ``None``.

        Exact over all time, for the naive wall clock (no zone: what a
        schedule's fires are apart away from UTC-offset changes).
        ``None`` means every gap is longer than a day (one time of day,
        and never two matching days in a row): then every gap is at least
        two days less that time of day, over 86,400. Cached per
        expression; see :func:`_smallest_wall_gap_s` for the method.
        """
        return _smallest_wall_gap_s(self)

    def next_wall(self, after_wall_s: int, limit_wall_s: int) -> int | None:
        """Return the first matching wall time in ``(after_wall_s, limit_wall_s]``, or ``None``.

        Wall times are integer seconds since the naive 1970-01-01T00:00:00
        (a local date and time, no zone). Matches are whole seconds (second
        0 in the unix dialect). ``None`` also when the search would leave
        the years ``datetime`` can represent. Pure; never raises for
        arguments within years 1..9999.
        """
        low = after_wall_s
        w_day = self.w_day
        while low < limit_wall_s:
            sim = object.__new__(_WallSim)
            sim.__dict__.update(self._template)
            try:
                sim.dt = _WALL_EPOCH + timedelta(seconds=low)
                found = next(sim)
                if w_day is not None and found.day != nearest_weekday(found.year, found.month, w_day):
                    # cronsim matched a day of N-2..N+2 that is not this month's NW day
                    low = _wall_of(datetime.combine(found.date() + _DAY, _MIDNIGHT)) - 1
                    continue
            except StopIteration:
                # cronsim gives up 50 years after its start; nothing matched
                # before the point it reached, so continue from there.
                low = _wall_of(sim.dt) - 1
                continue
            except (OverflowError, ValueError):  # left datetime's years
                return None
            wall = _wall_of(found)
            return wall if wall <= limit_wall_s else None
        return None


def _min_step(values: tuple[int, ...]) -> int | None:
    """Smallest difference of consecutive values of a sorted tuple; ``None`` for fewer than two."""
    if len(values) < 2:
        return None
    return min(b - a for a, b in zip(values, values[1:], strict=False))


def _scaled_step(values: tuple[int, ...], unit_s: int, span_s: int) -> int | None:
    """Smallest gap (seconds) between the last fire of one value and the first of the
    next: the smallest step of ``values`` in ``unit_s`` minus the ``span_s`` of the
    finer fields within one value; ``None`` for fewer than two values."""
    step = _min_step(values)
    return None if step is None else step * unit_s - span_s


# 2001-01-01 .. 2029-01-01 holds every kind of calendar day pair: the 14 kinds
# of year (leap or not, times the weekday of January 1st) all start in it, and
# so do the seven weekdays of December 31st followed by January 1st.
_PAIR_SCAN = ((2001, 1), (2029, 1))


@functools.lru_cache(maxsize=4096)
def _smallest_wall_gap_s(expression: CronExpression) -> int | None:
    """The method of :meth:`CronExpression.smallest_wall_gap_s`.

    Matching wall times are (matching days) x (times of day), and the times
    of day are the product hours x minutes x seconds, so consecutive
    matches are either inside one day: consecutive seconds of one minute
    (the smallest step of the second set), the last second of a minute to
    the first of the next chosen minute (smallest minute step x 60, less
    the second set's span), the last time of an hour to the first of the
    next chosen hour (likewise); or across midnight: the day's last time to
    the first time of the next matching day, ``86,400 - span`` of the
    day's times when the days are adjacent, and over 86,400 otherwise.
    Whether two adjacent calendar days ever both match is decided over
    2001-2028 (every kind of adjacent-day pair occurs there; see
    ``_PAIR_SCAN``), at most 10,227 ``match_day`` calls, and only when
    that gap would be the smallest.
    """
    template = expression._template
    seconds, minutes, hours = template["_second_list"], template["_minute_list"], template["_hour_list"]
    second_span = seconds[-1] - seconds[0]
    minute_span = minutes[-1] * 60 + seconds[-1] - minutes[0] * 60 - seconds[0]
    day_span = hours[-1] * 3600 + minutes[-1] * 60 + seconds[-1] - (hours[0] * 3600 + minutes[0] * 60 + seconds[0])
    within = [
        gap
        for gap in (
            _min_step(seconds),
            _scaled_step(minutes, 60, second_span),
            _scaled_step(hours, 3600, minute_span),
        )
        if gap is not None
    ]
    inside_a_day = min(within) if within else None
    across_midnight = 86_400 - day_span
    if inside_a_day is not None and inside_a_day <= across_midnight:
        return inside_a_day
    return across_midnight if _adjacent_days_match(expression) else inside_a_day


def _adjacent_days_match(expression: CronExpression) -> bool:
    """Whether two consecutive calendar days both match the day and month fields (see ``_PAIR_SCAN``)."""
    sim = object.__new__(_WallSim)
    sim.__dict__.update(expression._template)
    w_day = expression.w_day
    previous = None  # ordinal of the last matching day seen
    (year, month), end = _PAIR_SCAN
    while (year, month) < end:
        if month in sim.months:
            length = calendar.monthrange(year, month)[1]
            if w_day is not None:
                nearest = nearest_weekday(year, month, w_day)
                days: Any = () if nearest is None else (nearest,)
            else:
                days = range(1, length + 1)
            for day in days:
                current = date(year, month, day)
                if sim.match_day(current):
                    ordinal = current.toordinal()
                    if previous == ordinal - 1:
                        return True
                    previous = ordinal
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return False


@functools.lru_cache(maxsize=4096)
def _parse(expr: str, dialect: str) -> CronExpression:
    if len(expr) > MAX_EXPR_LEN:
        raise ValidationError("cron", f"expression is too long (at most {MAX_EXPR_LEN} characters)", expr)
    text = expr.strip()
    if not text:
        raise ValidationError("cron", "cron expression is empty", expr)
    if text.startswith("@"):
        macro = text.lower()
        if macro == "@reboot":
            raise ValidationError("cron", "@reboot is not a timer (it runs at daemon start) and is not supported", expr)
        if macro not in MACROS:
            raise ValidationError("cron", f"unknown macro; use one of {' '.join(MACROS)}", expr)
        parts = MACROS[macro].split()
        if dialect == "seconds":
            parts.insert(0, "0")
    else:
        parts = text.split()
    want = 5 if dialect == "unix" else 6
    if len(parts) != want:
        if len(parts) == 7:
            rule = "7 fields (Quartz with a year) are not supported"
        elif dialect == "unix" and len(parts) == 6:
            rule = (
                "6 fields given, but the unix dialect takes 5 (minute hour day-of-month month "
                "day-of-week); for a seconds-first expression use dialect 'seconds'"
            )
        elif dialect == "seconds" and len(parts) == 5:
            rule = (
                "5 fields given, but the seconds dialect takes 6 (second minute hour day-of-month "
                "month day-of-week); for a 5-field expression use dialect 'unix'"
            )
        else:
            rule = f"expected {want} fields for dialect {dialect!r}, got {len(parts)}"
        raise ValidationError("cron", rule, expr)

    specs = _UNIX_SPECS if dialect == "unix" else (_SECOND, *_UNIX_SPECS)
    try:
        normalised = [_field(spec, part) for spec, part in zip(specs, parts, strict=True)]
    except _Reject as reject:
        raise ValidationError("cron", str(reject), expr) from None
    fields = [text for text, _ in normalised]
    w_day = normalised[-3][1]
    if dialect == "unix":
        fields.insert(0, "0")
    second, minute, hour, dom, month, dow = fields
    if w_day is not None and dow != "*":
        raise ValidationError(
            "cron", "W (nearest weekday) in the day-of-month field needs day-of-week * (they cannot be combined)", expr
        )
    is_fixed_time = not minute.startswith("*") and not hour.startswith("*")
    # The day rule: Spring's AND in the seconds dialect; Vixie/Debian in unix.
    day_and = dialect == "seconds" or dom.startswith("*") or dow.startswith("*")

    _check_static_satisfiable(expr, month, dom, dow, w_day, day_and)
    try:
        sim = _WallSim(" ".join(fields), _SEARCH_START)
    except CronSimError as error:  # our checks should have caught it first
        raise ValidationError("cron", f"invalid expression ({error})", expr) from None
    sim.day_and = day_and  # cronsim derives it from the text (the unix rule)
    sim._second_list = tuple(sorted(sim.seconds))
    sim._minute_list = tuple(sorted(sim.minutes))
    sim._hour_list = tuple(sorted(sim.hours))
    sim._month_days = {}
    template = dict(sim.__dict__)
    parsed = CronExpression(expr, dialect, tuple(fields), w_day, day_and, is_fixed_time, template)
    if not _some_day_matches(sim, w_day):
        raise ValidationError(
            "cron", "the expression never fires (no date in the Gregorian calendar matches its day fields)", expr
        )
    start = _wall_of(_SEARCH_START) - 1
    if parsed.next_wall(start, start + CYCLE_S + 86_400) is None:
        raise ValidationError(
            "cron", "the expression never fires (no matching date in a whole 400-year Gregorian cycle)", expr
        )
    return parsed


def _month_shapes() -> list[tuple[int, int]]:
    """One ``(year, month)`` for every month shape (month, its length, weekday of the 1st).

    Which days of a month match a cron expression depends only on that
    shape, and every shape occurs in 2001..2028 (a 28-year span without a
    skipped leap year; the leap Februaries there start on 7 different
    weekdays). 91 shapes in all.
    """
    shapes: dict[tuple[int, int, int], tuple[int, int]] = {}
    for year in range(2001, 2029):
        for month in range(1, 13):
            first_weekday, length = calendar.monthrange(year, month)
            shapes.setdefault((month, length, first_weekday), (year, month))
    return sorted(shapes.values())


_MONTH_SHAPES = _month_shapes()


def _some_day_matches(sim: CronSim, w_day: int | None) -> bool:
    """Whether any date ever matches the day fields (and ``NW``), by month shape.

    Exact and bounded (at most 91 months of days, a few milliseconds): the
    time-of-day fields always match something, so "some date matches" is
    "the expression fires", and it spares the 400-year search its worst
    case (hundreds of milliseconds) on never-firing expressions.
    """
    for year, month in _MONTH_SHAPES:
        if month not in sim.months:
            continue
        length = calendar.monthrange(year, month)[1]
        if w_day is not None:
            day = nearest_weekday(year, month, w_day)
            if day is not None and sim.match_day(date(year, month, day)):
                return True
            continue
        for day in range(1, length + 1):
            if sim.match_day(date(year, month, day)):
                return True
    return False


def _check_static_satisfiable(expr: str, month: str, dom: str, dow: str, w_day: int | None, day_and: bool) -> None:
    """Refuse the common never-firing day/month combinations with a precise rule.

    Under the AND day rule (``day_and``: the seconds dialect, or either day
    field starts with ``*``), plain
    days-of-month that exceed every chosen month's length never match; nor
    does ``NW`` with N longer than every chosen month. The bounded search in
    :func:`_parse` decides everything else.
    """
    # cronsim types its parsed values as int | (int, int) (day-of-week's #);
    # months and days are ints.
    months = {m for m in Field.MONTH.parse(month) if isinstance(m, int)}
    names = _month_names(months)
    longest = max(_MONTH_DAYS[m] for m in months)
    if w_day is not None and w_day > longest:
        raise ValidationError("cron", f"the expression never fires: no day {w_day} in {names}", expr)
    days = {d for d in Field.DAY.parse(dom) if isinstance(d, int)}
    if day_and and days and all(d > 0 for d in days) and min(days) > longest:
        raise ValidationError(
            "cron", f"the expression never fires: day-of-month {min(days)} does not occur in {names}", expr
        )
