"""Which (cron expression, zone) pairs a bench herd holds, and how many timers each.

Two kinds of herd, both due at one minute boundary ``t``:

* **the bench's own herd** (:func:`herd_expressions`, what ``bench herd`` and
  ``bench compare`` always ran, and still run by default or with
  ``--distinct-schedules 26``): corpus-like expressions in five zones,
  26 pairs when ``t``'s minute is not a multiple of 5 (up to 45 when it is:
  the ``*/5`` … ``*/30`` steps join), timers spread evenly over them
  (timer ``i`` gets pair ``i mod n``);
* **a herd of K distinct schedules** (:func:`distinct_pairs`, with
  :func:`popularity` and :func:`assign`): K pairs whose schedule identities
  (:func:`scheduler.identity.identity_of`: K distinct ``schedule_key``\\ s)
  all differ, drawn from every IANA zone the engine accepts and from the
  expression families real cron services hold (daily, hourly, weekdays,
  weekly, monthly, yearly, every k hours, two or three hours a day, hour
  and day-of-week ranges, minute lists, last day / nth weekday of the
  month, …), each instantiated at ``t``'s wall time in its zone and checked
  to fire exactly at ``t``. Popularity is Zipf-like: the pair of rank ``r``
  (0 = most common) gets a share ∝ ``1 / (r + 1) ** skew`` of the timers,
  and every pair at least one.

Ranking: a pair's rank comes from the rank of its zone (:data:`POPULAR_ZONES`
first, in that order, then every other zone in a seeded shuffle) times the
rank of its expression variant in its zone (daily first, then hourly,
weekdays, monthly, weekly, …; variants of a family by closeness to the
common form), with a seeded tie-break. So ``0 0 * * *``-like pairs in the
popular zones hold most timers and the long tail is a wide spread of
families and zones (zones sharing an offset give the same expression, named
in different zones: different schedules, as in a real service).

Everything is deterministic for a given ``(t, k, seed)``; two different
instants give pairs of the same families, zones and ranks, spelled for
their own wall times (``bench compare`` gives ``ours`` and ``naive`` the
same ``k`` and seed at their own ``T``).
"""

from __future__ import annotations

import calendar
import functools
import importlib.resources
import random
from datetime import datetime, timedelta

from scheduler.errors import ValidationError
from scheduler.identity import cron_canonical
from scheduler.schedule import CronSchedule
from scheduler.zones import load_zone

BENCH_HERD_K = 26
"""``--distinct-schedules`` value that means the bench's own herd (:func:`herd_expressions`)."""

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney")
"""Zones of the bench's own herd."""

POPULAR_ZONES = (
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "America/Los_Angeles",
    "Asia/Kolkata",
    "America/Chicago",
    "Asia/Tokyo",
    "Europe/Paris",
    "Australia/Sydney",
    "Asia/Shanghai",
    "America/Sao_Paulo",
    "Asia/Singapore",
    "Etc/UTC",
    "America/Denver",
    "Europe/Amsterdam",
    "Asia/Dubai",
    "America/Toronto",
    "Europe/Madrid",
    "Asia/Seoul",
)
"""The zones that rank first, most common first; every other zone follows in a seeded order."""

MAX_DISTINCT = 40_000
"""The most pairs :func:`distinct_pairs` is asked for (``bench herd`` refuses more):
fewer than all it can make at any instant."""

DEFAULT_SEED = 13
"""Seed of the zone order's tail, the rank tie-break and the timers' shuffle."""

DEFAULT_SKEW = 1.0
"""Zipf exponent of :func:`popularity`."""


def _wall(t: datetime, zone: str) -> tuple[int, int, int, int, int, int]:
    """(minute, hour, day, month, day of week with Sunday 0, days in the month) of ``t`` in ``zone``."""
    lt = t.astimezone(load_zone(zone))
    return lt.minute, lt.hour, lt.day, lt.month, (lt.weekday() + 1) % 7, calendar.monthrange(lt.year, lt.month)[1]


def herd_expressions(t: datetime) -> list[tuple[str, str]]:
    """The bench's own herd: (expression, zone) pairs that all fire at ``t`` (a minute boundary), corpus-like.

    Five expressions per zone of :data:`ZONES`, the ``*/5`` … ``*/30`` steps
    that match ``t``'s minute, and ``* * * * *`` in UTC: 26 pairs unless
    the minute is a multiple of 5. Raises AssertionError if one does not
    fire exactly at ``t``.
    """
    out = []
    for zone in ZONES:
        m, h, d, mon, dow, _ = _wall(t, zone)
        out += [
            (f"{m} {h} * * *", zone),
            (f"{m} * * * *", zone),
            (f"{m} {h} * * {dow}", zone),
            (f"{m} {h} {d} * *", zone),
            (f"{m} {h} {d} {mon} *", zone),
        ]
        for step in (5, 10, 15, 30):
            if m % step == 0:
                out.append((f"*/{step} * * * *", zone))
    out.append(("* * * * *", "UTC"))
    for expr, zone in out:  # guard: every expression must fire exactly at t
        assert CronSchedule(expr, zone).next_after(t - timedelta(seconds=1)) == t, (expr, zone)
    return out


@functools.cache
def usable_zones() -> tuple[str, ...]:
    """Every zone name the bundled ``tzdata`` lists that :func:`scheduler.zones.load_zone`
    accepts (canonical zones and links; the legacy ``EST``, ``CET``, … and
    ``Factory`` are left out), sorted."""
    names = importlib.resources.files("tzdata").joinpath("zones").read_text("utf-8").split()
    out = []
    for name in sorted(set(names)):
        try:
            load_zone(name)
        except ValidationError:
            continue
        out.append(name)
    return tuple(out)


def zone_order(seed: int = DEFAULT_SEED) -> list[str]:
    """:data:`POPULAR_ZONES`, then every other usable zone in an order fixed by ``seed``."""
    rest = [z for z in usable_zones() if z not in POPULAR_ZONES]
    random.Random(seed).shuffle(rest)
    return [*POPULAR_ZONES, *rest]


HOUR_OFFSETS = (12, 6, 18, 8, 16, 3, 9, 15, 21)
"""Offsets of the second hour of ``H,H2`` lists, most common first (twice a day first)."""

MINUTE_OFFSETS = (30, 15, 45, 20, 40, 10, 50, 5, 55)
"""Offsets of the second minute of ``M,M2`` lists, most common first (half past first)."""

HOUR_TRIPLES = ((8, 16), (6, 12), (4, 8), (6, 18), (12, 18), (3, 6), (2, 4), (9, 18))
"""Offsets of the other two hours of ``H,H2,H3`` lists."""


def _companions(value: int, span: int, preferred: tuple[int, ...]) -> list[int]:
    """The other values of a cyclic field of ``span`` values: at the ``preferred``
    offsets from ``value`` first, then at every other offset, ascending."""
    offsets = [*preferred, *(o for o in range(1, span) if o not in preferred)]
    return [(value + o) % span for o in offsets]


def _spell(*values: int) -> str:
    return ",".join(str(v) for v in sorted(set(values)))


def expression_variants(t: datetime, zone: str) -> list[str]:
    """The cron expressions (unix dialect) of every family this module knows, spelled
    for ``t``'s wall time in ``zone``, most common first; each matches that wall time.

    Families: ``M H * * *``, ``M * * * *``, weekdays ``M H * * 1-5`` (or
    weekends ``M H * * 0,6``), ``M H D * *``, ``M H * * DOW``, ``M H D MON *``,
    ``M */k * * *``, ``M H,H2 * * *``, ``M,M2 H * * *``, ``M H-H2 * * *``
    (hour ranges holding ``H``), ``M H * * A-B`` (day-of-week ranges holding
    the day), ``M H L * *`` (last day), ``M H * * DOW#n`` / ``DOWL``,
    ``M H D,D2 * *``, ``M H * A-B *`` (month ranges), ``*/s H * * *``,
    ``M,M2 * * * *``, ``M H,H2,H3 * * *``. Some spell the same schedule as
    another (``0 0,12 * * *`` and ``0 */12 * * *``): :func:`distinct_pairs`
    keeps one per schedule identity.
    """
    m, h, d, mon, dow, mdays = _wall(t, zone)
    out = [
        f"{m} {h} * * *",
        f"{m} * * * *",
        f"{m} {h} * * 1-5" if 1 <= dow <= 5 else f"{m} {h} * * 0,6",
        f"{m} {h} {d} * *",
        f"{m} {h} * * {dow}",
        f"{m} {h} {d} {mon} *",
    ]
    out += [f"{m} */{k} * * *" for k in (2, 3, 4, 6, 8, 12) if h % k == 0]
    hours2 = [_spell(h, h2) for h2 in _companions(h, 24, HOUR_OFFSETS)]
    minutes2 = [_spell(m, m2) for m2 in _companions(m, 60, MINUTE_OFFSETS)]
    out += [f"{m} {hh} * * *" for hh in hours2[:6]]
    out += [f"{mm} {h} * * *" for mm in minutes2[:4]]
    out += [f"{m} {a}-{b} * * *" for a, b in ((8, 18), (9, 17), (6, 22), (0, 11), (12, 23), (7, 19)) if a <= h <= b]
    if d == mdays:
        out.append(f"{m} {h} L * *")
    out.append(f"{m} {h} * * {dow}#{(d - 1) // 7 + 1}")
    if d + 7 > mdays:
        out.append(f"{m} {h} * * {dow}L")
    ranges = sorted(
        ((a, b) for a in range(7) for b in range(a + 1, 7) if a <= dow <= b and (a, b) != (0, 6)),
        key=lambda r: (-(r[1] - r[0]), r),
    )
    out += [f"{m} {h} * * {a}-{b}" for a, b in ranges]
    out += [f"{m} {h} {_spell(d, d2)} * *" for d2 in (1, 15, 28) if d2 != d]
    out += [f"{m} {h} * {a}-{b} *" for a, b in ((1, 6), (7, 12), (4, 9), (3, 11)) if a <= mon <= b]
    out += [f"*/{s} {h} * * *" for s in (5, 10, 15, 20, 30) if m % s == 0]
    out += [f"{mm} * * * *" for mm in minutes2[:8]]
    out += [f"{m} {hh} * * *" for hh in hours2[6:]]
    out += [f"{mm} {h} * * *" for mm in minutes2[4:]]
    out += [f"{m} {_spell(h, (h + a) % 24, (h + b) % 24)} * * *" for a, b in HOUR_TRIPLES]
    return out


def _fires_at(expr: str, zone: str, t: datetime) -> bool:
    return CronSchedule(expr, zone).next_after(t - timedelta(seconds=1)) == t


def distinct_pairs(t: datetime, k: int, seed: int = DEFAULT_SEED) -> list[tuple[str, str]]:
    """``k`` (expression, zone) pairs with ``k`` distinct schedule identities, all firing
    exactly at ``t`` (a minute boundary, aware), most popular first (see the module doc).

    Each pair is checked: ``CronSchedule(expr, zone).next_after(t - 1 s) == t``
    (a pair that does not, e.g. a wall time repeated by a DST fall-back,
    is left out). Raises ValueError if ``k < 1``, or if fewer than ``k``
    distinct pairs fire at ``t`` (more than :data:`MAX_DISTINCT` do).
    """
    if k < 1:
        raise ValueError(f"distinct schedules: {k} must be at least 1")
    zones = zone_order(seed)
    variants = {zone: expression_variants(t, zone) for zone in zones}
    tie = random.Random(seed + 1)
    candidates = sorted(
        ((zr + 1) * (vr + 1), tie.random(), zone, expr)
        for zr, zone in enumerate(zones)
        for vr, expr in enumerate(variants[zone])
    )
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    canonical = functools.lru_cache(maxsize=None)(cron_canonical)
    for _, _, zone, expr in candidates:
        try:
            # The identity of a bench cron spec is its canonical expression and
            # its zone (the policy columns are the same for all; identity_of).
            key = (canonical(expr, "unix"), zone)
            if key in seen or not _fires_at(expr, zone, t):
                continue
        except ValidationError:  # a spelling the engine refuses is no pair
            continue
        seen.add(key)
        out.append((expr, zone))
        if len(out) == k:
            return out
    raise ValueError(f"distinct schedules: {k} asked, only {len(out)} distinct pairs fire at {t.isoformat()}")


def popularity(k: int, jobs: int, skew: float = DEFAULT_SKEW) -> list[int]:
    """Timers per pair, rank 0 first: ``jobs`` in all, every pair at least one, the
    rest shared ∝ ``1 / (rank + 1) ** skew`` (rounded down; what rounding leaves
    goes one each to the first pairs). Non-increasing.

    Raises ValueError if ``k < 1`` or ``jobs < k`` (every pair needs a timer).
    """
    if k < 1 or jobs < k:
        raise ValueError(f"distinct schedules: {k} pairs need 1 to {jobs} (the herd's jobs)")
    weights = [1.0 / (r + 1) ** skew for r in range(k)]
    total = sum(weights)
    extra = jobs - k
    counts = [1 + int(extra * w / total) for w in weights]
    for r in range(jobs - sum(counts)):
        counts[r] += 1
    return counts


def assign(counts: list[int], seed: int = DEFAULT_SEED) -> list[int]:
    """Pair index of each timer: ``counts[r]`` timers get ``r``, in an order shuffled
    by ``seed`` (so every tenant's share of the herd holds a spread of pairs)."""
    out = [r for r, n in enumerate(counts) for _ in range(n)]
    random.Random(seed).shuffle(out)
    return out


def herd_plan(
    t: datetime, jobs: int, k: int | None, seed: int = DEFAULT_SEED, *, on_second: bool = False
) -> tuple[list[tuple[str, str]], list[int]]:
    """The pairs of a herd of ``jobs`` timers due at ``t`` and each timer's pair index.

    ``k`` None or :data:`BENCH_HERD_K`: the bench's own herd
    (:func:`herd_expressions`, timer ``i`` gets pair ``i mod n``); any other
    ``k``: :func:`distinct_pairs` with :func:`popularity` and :func:`assign`.
    ``on_second``: ``t`` is any whole second and the expressions are in the
    ``seconds`` dialect (:func:`seconds_pairs`); otherwise ``t`` is a minute
    boundary and they are 5-field. Raises ValueError as those do.
    """
    minute = t.replace(second=0) if on_second else t
    if k is None or k == BENCH_HERD_K:
        pairs = herd_expressions(minute)
        pair_of = [i % len(pairs) for i in range(jobs)]
    else:
        pairs = distinct_pairs(minute, k, seed)
        pair_of = assign(popularity(k, jobs), seed)
    return (seconds_pairs(pairs, t) if on_second else pairs), pair_of


def seconds_pairs(pairs: list[tuple[str, str]], t: datetime) -> list[tuple[str, str]]:
    """``pairs`` (5-field expressions firing at ``t``'s minute boundary) as ``seconds``-dialect
    expressions firing at ``t`` itself: ``t``'s second prefixed as the seconds field.

    For a herd whose instant is the next whole second rather than the next
    minute (the tests' herds: ``bench deliver``'s ``herd_on_second``), so a
    run never waits up to a minute for its instant. Raises AssertionError
    if one does not fire exactly at ``t``.
    """
    out = [(f"{t.second} {expr}", zone) for expr, zone in pairs]
    for expr, zone in out:
        assert CronSchedule(expr, zone, "seconds").next_after(t - timedelta(seconds=1)) == t, (expr, zone)
    return out


def plan_seconds(k: int | None) -> float:
    """A generous estimate of :func:`herd_plan`'s time for ``k`` pairs (seconds), for
    choosing a herd's instant after its loading: the first look at every
    zone's transitions, then the checks per pair."""
    return 0.0 if k is None or k == BENCH_HERD_K else 3.0 + k / 10_000
