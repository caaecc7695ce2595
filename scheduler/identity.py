"""Schedule identity: the key that timers with the same firing plan share (pure).

A midnight herd holds thousands of timers per schedule. The herd path
(:mod:`scheduler.firing.herds`) plans each distinct schedule once and lets
the store fire every timer of it, so the store must be able to tell which
timers share a plan without reading them: each job row carries a
``schedule_key``, and the ``schedules`` table maps a key to the spec it
stands for (alembic revision 0017).

What a key covers: everything :func:`scheduler.planner.plan_job` reads of a
job except its id and its slot, so two timers with the same key at the same
slot always get the same plan:

* the schedule: for ``cron`` the *canonical* expression (the parsed fields:
  numbers, names resolved, day-of-week 7 read as 0, so ``0 0 * * 7``,
  ``0 0 * * SUN`` and ``0 0 * * 0`` share a key; the day rule, a ``W`` day
  and the DST policy switch, see :class:`scheduler.cron.CronExpression`;
  the dialect only through these, so unix ``0 0 * * *`` and seconds
  ``0 0 0 * * *`` share a key) and the zone *as named*; for ``interval``
  the interval and its anchor; for ``once`` the instant;
* the misfire policy, catch-up window, grace and jitter.

Interval and one-shot specs share a key only with timers of the same anchor
or instant (timers created in bulk, one-shots of one moment): ``schedules``
holds about one row per other such job, a few hundred bytes each.

Zones are not merged with the zones they are links of (``US/Eastern`` and
``America/New_York`` have different keys): a later tzdata release may make
a link a zone of its own, and a key must never stand for two different
schedules. Different keys for one schedule only cost sharing.

The key is the first 8 bytes of SHA-256 of :attr:`ScheduleIdentity.canonical`
(a signed 64-bit integer, the SQL ``BIGINT``). Collisions are improbable
(~3·10⁻⁶ for ten million distinct specs) and harmless: the store keeps the
canonical text per key and a job whose key is taken by another spec is
stored with no key (:func:`scheduler.jobs.register_schedules`), which only
sends it to the per-timer path. A canonical form that ever changes gets a
new version prefix (``v1``), so old and new keys never mean different
things.
"""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import UTC, datetime
from typing import Any

from scheduler.cron import CronExpression

CANONICAL_VERSION = "v1"
"""Prefix of every canonical text; bumped if the canonical form ever changes."""

_CRON_FIELDS = ("seconds", "minutes", "hours", "days", "months", "weekdays")


@dataclasses.dataclass(frozen=True)
class ScheduleIdentity:
    """A spec's ``key`` (signed 64-bit) and the ``canonical`` text it hashes."""

    key: int
    canonical: str


def _sunday_zero(value: Any) -> Any:
    """Day-of-week 7 (Sunday, as cron also spells it) as 0, also inside ``N#k``/``NL`` pairs."""
    if isinstance(value, tuple):
        return (_sunday_zero(value[0]), *value[1:])
    return 0 if value == 7 else value


def cron_canonical(expr: str, dialect: str) -> str:
    """The canonical text of a valid cron expression (see the module doc).

    Raises :class:`~scheduler.errors.ValidationError` as
    :meth:`CronExpression.parse` does.
    """
    parsed = CronExpression.parse(expr, dialect)
    template = parsed._template
    parts = []
    for name in _CRON_FIELDS:
        values = template[name]
        if name == "weekdays":
            values = {_sunday_zero(v) for v in values}
        parts.append(",".join(repr(v).replace(" ", "") for v in sorted(values, key=repr)))
    return f"fixed={int(parsed.is_fixed_time)};and={int(parsed.day_and)};w={parsed.w_day};fields={'|'.join(parts)}"


def _instant(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).isoformat()


def identity_of(row: dict[str, Any]) -> ScheduleIdentity:
    """The identity of a job given as a dict with the ``jobs`` column names
    (``kind``, ``cron_expr``, ``cron_dialect``, ``tz``, ``interval_s``,
    ``anchor_at``, ``fire_at``, ``misfire``, ``catchup_window_s``,
    ``misfire_grace_s``, ``jitter_s``) of a valid spec.

    Raises :class:`~scheduler.errors.ValidationError` for an invalid cron
    expression; ``ValueError`` for an unknown kind.
    """
    kind = row["kind"]
    if kind == "cron":
        schedule = f"cron;{cron_canonical(row['cron_expr'], row['cron_dialect'] or 'unix')};tz={row['tz'] or 'UTC'}"
    elif kind == "interval":
        schedule = f"interval;{int(row['interval_s'])};anchor={_instant(row['anchor_at'])}"
    elif kind == "once":
        schedule = f"once;at={_instant(row['fire_at'])}"
    else:
        raise ValueError(f"unknown kind {kind!r}")
    canonical = (
        f"{CANONICAL_VERSION};{schedule};misfire={row['misfire']};catchup={int(row['catchup_window_s'])};"
        f"grace={int(row['misfire_grace_s'])};jitter={int(row['jitter_s'])}"
    )
    digest = hashlib.sha256(canonical.encode()).digest()
    return ScheduleIdentity(int.from_bytes(digest[:8], "big", signed=True), canonical)


SPEC_COLUMNS = (
    "kind",
    "cron_expr",
    "cron_dialect",
    "tz",
    "interval_s",
    "anchor_at",
    "fire_at",
    "misfire",
    "catchup_window_s",
    "misfire_grace_s",
    "jitter_s",
)
"""The ``jobs`` columns a key covers, in the ``schedules`` table's order."""
