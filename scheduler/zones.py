"""Time zones: loading IANA zones from the bundled ``tzdata``, and their transitions.

Loading
-------
Every zone is read from the ``tzdata`` package shipped with the engine, never
from the host's ``/usr/share/zoneinfo``: two nodes on hosts with different
system tz databases must compute the same fire instants, and a control plane
without system tz files must still accept ``Asia/Singapore`` (case C53).
``zoneinfo.ZoneInfo(name)`` would prefer the host's files, so
:func:`load_zone` opens the ``tzdata`` resource itself and builds the zone
with ``ZoneInfo.from_file``; loaded zones are cached (one object per name,
so a zone can be used as a cache key by identity).

Accepted names are the ones ``tzdata`` lists (canonical zones and links such
as ``US/Pacific``, plus ``UTC`` and ``Etc/UTC``), except:

- the legacy abbreviation zones ``EST MST HST EST5EDT CST6CDT MST7MDT PST8PDT
  CET EET MET WET``: they load, but mean a fixed offset or an old US/EU rule,
  which is almost never what the author of ``EST`` meant;
- ``Factory`` (offset "-00", a placeholder).

Names that are not zones at all (``PST``, ``IST``, ``europe/berlin``) are
rejected too; every rejection is a :class:`~scheduler.errors.ValidationError`
on field ``tz`` whose rule names a canonical zone to use instead.

Transitions
-----------
``zoneinfo`` exposes no transition list, so :func:`next_transition` and
:func:`previous_transition` find UTC-offset changes by sampling: for each UTC
calendar year the offset is evaluated at every UTC midnight (a 1-day step),
and every step whose two ends disagree is bisected to the second. The result
(the year's offset at its first second and its transitions) is cached per
``(zone, year)``, so after the first look-up a query is a dict hit and a
bisect over a handful of integers.

Assumption: **no two offset changes fall within one sampling step (one
day)**; two such changes would be seen as one (or, if they cancel out, not
at all). Checked once against tzdata 2026f by reading every TZif file: no
zone has two offset changes less than a day apart, and the sampled
transitions 1900-2038 equal the files' explicit transitions for all 597
names. (Transitions after a file's last explicit one come from its POSIX
rule, which is what ``zoneinfo`` evaluates and so what we sample.)

Only UTC-offset changes count: a change of abbreviation or of the DST flag
that keeps the offset (e.g. a zone switching from standard time to permanent
DST of the same offset) is not a transition here, because wall clock time
does not move.

All instants are integer seconds since the Unix epoch (UTC); offsets are
integer seconds east of UTC (``wall = instant + offset``). Supported
instants lie in years 2..9997 (:data:`MIN_EPOCH_S`, :data:`MAX_EPOCH_S`), so
that walls one day either side stay representable as ``datetime``.
"""

from __future__ import annotations

import bisect
import functools
import importlib.resources
import re
import zoneinfo
from datetime import datetime, timedelta

from scheduler.errors import ValidationError

__all__ = [
    "DAY_S",
    "MAX_EPOCH_S",
    "MIN_EPOCH_S",
    "SAMPLE_STEP_S",
    "TRANSITION_HORIZON_S",
    "Transition",
    "load_zone",
    "next_transition",
    "previous_transition",
    "utc_offset",
]

DAY_S = 86_400
"""Seconds in a civil day without a transition."""

SAMPLE_STEP_S = DAY_S
"""Sampling step of the transition search (seconds). See the module assumption."""

TRANSITION_HORIZON_S = 2 * 366 * DAY_S
"""Default look-ahead of :func:`next_transition`: about two years, in seconds."""

_EPOCH = datetime(1970, 1, 1)

MIN_EPOCH_S = int((datetime(2, 1, 1) - _EPOCH).total_seconds())
"""First supported instant (0002-01-01T00:00:00Z), epoch seconds."""

MAX_EPOCH_S = int((datetime(9998, 1, 1) - _EPOCH).total_seconds())
"""End of the supported instants (9998-01-01T00:00:00Z, exclusive), epoch seconds."""

Transition = tuple[int, int, int]
"""``(instant_s, offset_before_s, offset_after_s)``: at ``instant_s`` the offset
changes; the second before it has ``offset_before_s``, ``instant_s`` itself has
``offset_after_s``."""

# Legacy zones that tzdata ships but we refuse, with the hint shown to the user.
_LEGACY_HINTS: dict[str, str] = {
    "EST": "EST is a fixed-offset legacy zone; use America/New_York (with DST) or Etc/GMT+5",
    "MST": "MST is a legacy zone; use America/Denver (with DST), America/Phoenix (no DST) or Etc/GMT+7",
    "HST": "HST is a legacy zone; use Pacific/Honolulu",
    "EST5EDT": "EST5EDT is a legacy US rule zone; use America/New_York",
    "CST6CDT": "CST6CDT is a legacy US rule zone; use America/Chicago",
    "MST7MDT": "MST7MDT is a legacy US rule zone; use America/Denver",
    "PST8PDT": "PST8PDT is a legacy US rule zone; use America/Los_Angeles",
    "CET": "CET is a legacy EU rule zone; use a city zone such as Europe/Berlin or Europe/Paris",
    "MET": "MET is a legacy EU rule zone; use a city zone such as Europe/Berlin or Europe/Paris",
    "EET": "EET is a legacy EU rule zone; use a city zone such as Europe/Athens or Europe/Helsinki",
    "WET": "WET is a legacy EU rule zone; use a city zone such as Europe/Lisbon",
    "Factory": "Factory is a placeholder zone with no real offset; use a city zone or UTC",
}

# Common abbreviations that are not zones at all.
_ABBREVIATION_HINTS: dict[str, str] = {
    "PST": "America/Los_Angeles",
    "PDT": "America/Los_Angeles",
    "PT": "America/Los_Angeles",
    "CST": "America/Chicago",
    "CDT": "America/Chicago",
    "CT": "America/Chicago",
    "EDT": "America/New_York",
    "ET": "America/New_York",
    "MDT": "America/Denver",
    "MT": "America/Denver",
    "AKST": "America/Anchorage",
    "AKDT": "America/Anchorage",
    "BST": "Europe/London",
    "IST": "Asia/Kolkata (India) or Europe/Dublin (Ireland)",
    "CEST": "Europe/Berlin",
    "EEST": "Europe/Athens",
    "WEST": "Europe/Lisbon",
    "MSK": "Europe/Moscow",
    "JST": "Asia/Tokyo",
    "KST": "Asia/Seoul",
    "SGT": "Asia/Singapore",
    "HKT": "Asia/Hong_Kong",
    "AEST": "Australia/Sydney",
    "AEDT": "Australia/Sydney",
    "ACST": "Australia/Adelaide",
    "AWST": "Australia/Perth",
    "NZST": "Pacific/Auckland",
    "NZDT": "Pacific/Auckland",
    "Z": "UTC",
}

_NAME_RE = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")


@functools.cache
def _tzdata_names() -> dict[str, str]:
    """Map lower-cased name -> name for every zone and link ``tzdata`` lists."""
    text = importlib.resources.files("tzdata").joinpath("zones").read_text("utf-8")
    names = [line.strip() for line in text.splitlines() if line.strip()]
    return {name.lower(): name for name in names}


_zone_cache: dict[str, zoneinfo.ZoneInfo] = {}


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """Return the ``ZoneInfo`` for IANA zone ``name``, read from bundled ``tzdata``.

    ``name`` is case-sensitive (``Europe/Berlin``); links (``US/Pacific``),
    ``UTC`` and ``Etc/UTC`` are accepted. The same object is returned for the
    same name on every call.

    Raises :class:`~scheduler.errors.ValidationError` (field ``tz``) for a
    non-string or empty name, a legacy abbreviation zone (``EST``, ``CET``,
    ...; the rule names the zone to use), a non-zone abbreviation (``PST``),
    a wrong-case name (the rule gives the right spelling) or an unknown name.
    """
    zone = _zone_cache.get(name) if isinstance(name, str) else None
    if zone is not None:
        return zone
    if not isinstance(name, str) or not name.strip():
        raise ValidationError("tz", "time zone must be a non-empty IANA zone name such as Europe/Berlin", name)
    if name in _LEGACY_HINTS:
        raise ValidationError("tz", _LEGACY_HINTS[name], name)
    upper = name.upper()
    if upper in _ABBREVIATION_HINTS:
        raise ValidationError(
            "tz",
            f"{name} is an abbreviation, not an IANA time zone; use {_ABBREVIATION_HINTS[upper]}",
            name,
        )
    names = _tzdata_names()
    canonical = names.get(name.lower()) if _NAME_RE.fullmatch(name) else None
    if canonical is None:
        raise ValidationError(
            "tz", "not an IANA time zone name (use e.g. Europe/Berlin, America/New_York or UTC)", name
        )
    if canonical != name:
        if canonical in _LEGACY_HINTS:
            raise ValidationError("tz", _LEGACY_HINTS[canonical], name)
        raise ValidationError("tz", f"time zone names are case-sensitive; use {canonical}", name)
    resource = importlib.resources.files("tzdata.zoneinfo").joinpath(name)
    with resource.open("rb") as fobj:
        zone = zoneinfo.ZoneInfo.from_file(fobj, key=name)
    return _zone_cache.setdefault(name, zone)


# --------------------------------------------------------------------------
# Offsets and transitions


def _offset_exact(zone: zoneinfo.ZoneInfo, instant_s: int) -> int:
    """UTC offset (seconds) of ``zone`` at ``instant_s``, asked of zoneinfo directly."""
    utc_wall = _EPOCH + timedelta(seconds=instant_s)
    local = zone.fromutc(utc_wall.replace(tzinfo=zone))
    offset = local.utcoffset()
    assert offset is not None
    return offset.days * DAY_S + offset.seconds


def _year_start_s(year: int) -> int:
    return (datetime(year, 1, 1) - _EPOCH).days * DAY_S


def _year_of(instant_s: int) -> int:
    return (_EPOCH + timedelta(seconds=instant_s)).year


class _Year:
    """One UTC calendar year of a zone: offset at its first second, and its transitions.

    ``instants`` holds the transitions ``x`` with ``start < x <= end`` (the
    year's first second excluded, the next year's first second included), in
    increasing order; ``befores[i]``/``afters[i]`` are the offsets around
    ``instants[i]``. ``start_offset`` is the offset at ``start``.
    """

    __slots__ = ("afters", "befores", "end", "instants", "start", "start_offset")

    def __init__(self, zone: zoneinfo.ZoneInfo, year: int) -> None:
        self.start = _year_start_s(year)
        self.end = _year_start_s(year + 1)
        self.instants: list[int] = []
        self.befores: list[int] = []
        self.afters: list[int] = []
        lo = self.start
        lo_offset = self.start_offset = _offset_exact(zone, lo)
        while lo < self.end:
            hi = min(lo + SAMPLE_STEP_S, self.end)
            hi_offset = _offset_exact(zone, hi)
            if hi_offset != lo_offset:
                # Invariant: offset(a) == lo_offset, offset(b) != lo_offset.
                a, b = lo, hi
                while b - a > 1:
                    mid = (a + b) // 2
                    if _offset_exact(zone, mid) == lo_offset:
                        a = mid
                    else:
                        b = mid
                self.instants.append(b)
                self.befores.append(lo_offset)
                self.afters.append(_offset_exact(zone, b))
            lo, lo_offset = hi, hi_offset

    def offset_at(self, instant_s: int) -> int:
        """Offset at ``instant_s`` (which must lie in ``[start, end)``)."""
        i = bisect.bisect_right(self.instants, instant_s)
        return self.afters[i - 1] if i else self.start_offset


@functools.lru_cache(maxsize=16_384)
def _year(zone: zoneinfo.ZoneInfo, year: int) -> _Year:
    return _Year(zone, year)


def _check_instant(instant_s: int, field: str = "after") -> None:
    if not MIN_EPOCH_S <= instant_s < MAX_EPOCH_S:
        raise ValidationError(field, "instant must lie in years 2..9997", instant_s)


def utc_offset(zone: zoneinfo.ZoneInfo, instant_s: int) -> int:
    """Return the UTC offset of ``zone`` at ``instant_s`` (seconds east of UTC).

    ``instant_s`` is epoch seconds; uses the per-year transition cache, so it
    agrees with :func:`next_transition` by construction. Raises
    :class:`~scheduler.errors.ValidationError` (field ``after``) outside
    :data:`MIN_EPOCH_S` .. :data:`MAX_EPOCH_S`.
    """
    _check_instant(instant_s)
    return _year(zone, _year_of(instant_s)).offset_at(instant_s)


def next_transition(
    zone: zoneinfo.ZoneInfo,
    after_epoch_s: int,
    horizon_s: int = TRANSITION_HORIZON_S,
) -> Transition | None:
    """Return the first offset change strictly after ``after_epoch_s``, or ``None``.

    The result is ``(instant_s, offset_before_s, offset_after_s)`` (epoch
    seconds; offsets in seconds east of UTC) with
    ``after_epoch_s < instant_s <= after_epoch_s + horizon_s``. ``None``
    means "no transition within the horizon" (default about two years), not
    "never": to keep looking, call again with ``after_epoch_s + horizon_s``.
    Also ``None`` when the search would pass :data:`MAX_EPOCH_S`.

    Accuracy: see the module's sampling assumption (at most one change per
    day). Raises :class:`~scheduler.errors.ValidationError` (field ``after``)
    when ``after_epoch_s`` is outside the supported range.
    """
    _check_instant(after_epoch_s)
    limit = min(after_epoch_s + horizon_s, MAX_EPOCH_S)
    year = _year_of(after_epoch_s)
    while True:
        data = _year(zone, year)
        i = bisect.bisect_right(data.instants, after_epoch_s)
        if i < len(data.instants):
            x = data.instants[i]
            return (x, data.befores[i], data.afters[i]) if x <= limit else None
        if data.end >= limit:
            return None
        year += 1


def previous_transition(
    zone: zoneinfo.ZoneInfo,
    at_epoch_s: int,
    horizon_s: int = TRANSITION_HORIZON_S,
) -> Transition | None:
    """Return the last offset change at or before ``at_epoch_s``, or ``None``.

    Same shape as :func:`next_transition`; the result satisfies
    ``at_epoch_s - horizon_s <= instant_s <= at_epoch_s`` (``None`` if no
    change in that window).
    """
    _check_instant(at_epoch_s)
    limit = max(at_epoch_s - horizon_s, MIN_EPOCH_S)
    year = _year_of(at_epoch_s)
    while True:
        data = _year(zone, year)
        i = bisect.bisect_right(data.instants, at_epoch_s)
        if i:
            x = data.instants[i - 1]
            return (x, data.befores[i - 1], data.afters[i - 1]) if x >= limit else None
        if data.start <= limit:
            return None
        year -= 1


def warm(names: list[str], instant_s: int, years: int = 2) -> int:
    """Compute ahead the transition tables of the zones ``names`` for the UTC
    years from ``instant_s``'s on (``years`` of them); return how many zones
    were warmed (names that are no valid zone are skipped).

    A zone's first use costs ~2.4 ms (its year tables are sampled from
    zoneinfo, see :class:`_Year`); a herd of thousands of schedules in
    hundreds of zones would pay it all on its first plan (~1.4 s for the 586
    zones tzdata names). A node calls this once at start, off the firing
    thread, for the zones its store's schedules use.
    """
    warmed = 0
    year = _year_of(instant_s)
    for name in names:
        try:
            zone = load_zone(name)
        except ValidationError:
            continue
        for offset in range(years):
            _year(zone, year + offset)
        warmed += 1
    return warmed
