"""Job specifications: validation at save, and schedules built from stored rows.

A :class:`JobSpec` is what a user registers: tenant, optional name, one
schedule (cron expression in a zone, fixed interval, or one-shot instant),
misfire policy and jitter. :meth:`JobSpec.validated` checks every field and
raises :class:`~scheduler.errors.ValidationError` naming the field and the
rule; nothing is written before it passes. Jitter must be smaller than the
smallest gap between consecutive slots (:func:`check_jitter`).

:class:`ScheduleCache` builds schedule objects from job rows and memoizes
``next_after`` per (schedule, instant): in a midnight herd most jobs share a
handful of expressions and the same nominal time, so 300,000 next-fire
computations collapse into a few dozen (DESIGN.md §5).
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

from scheduler.errors import ValidationError
from scheduler.planner import CATCHUP_WINDOW_S, MISFIRE_GRACE_S, MISFIRE_POLICIES
from scheduler.schedule import CronSchedule, IntervalSchedule, OnceSchedule

KINDS = ("cron", "interval", "once")
DIALECTS = ("unix", "seconds")
MAX_JITTER_S = 86_400
MAX_POLICY_S = 2_147_483_647
"""Largest catch-up window / misfire grace: the store keeps them in INTEGER columns."""
MAX_INTERVAL_S = 100 * 365 * 86_400
"""Largest interval (100 years): later slots would leave the supported date range."""
MAX_NAME_LEN = 200
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")


def validate_tenant(tenant: str) -> str:
    """Return ``tenant`` if valid: 1–200 chars of letters, digits and ``._:@/-``, not
    starting with punctuation. Raises ValidationError (field ``tenant``)."""
    if not isinstance(tenant, str) or not _TENANT_RE.match(tenant):
        raise ValidationError(
            "tenant", "must be 1-200 characters of letters, digits and . _ : @ / -, starting with a letter or digit",
            tenant)
    return tenant


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A timer as registered. Exactly one of ``cron``/``interval_s``/``at`` is set.

    Durations in whole seconds. ``at`` and ``anchor_at`` are aware datetimes.
    """

    tenant: str
    kind: str
    cron: str | None = None
    tz: str | None = None
    dialect: str | None = None
    interval_s: int | None = None
    at: datetime | None = None
    name: str | None = None
    misfire: str = "all"
    catchup_window_s: int = CATCHUP_WINDOW_S
    misfire_grace_s: int = MISFIRE_GRACE_S
    jitter_s: int = 0

    @classmethod
    def build(cls, *, tenant: str, cron: str | None = None, tz: str | None = None,
              dialect: str | None = None, interval_s: Any = None, at: datetime | None = None,
              name: str | None = None, misfire: str = "all",
              catchup_window_s: Any = CATCHUP_WINDOW_S, misfire_grace_s: Any = MISFIRE_GRACE_S,
              jitter_s: Any = 0) -> JobSpec:
        """Build and validate a spec from user input; raises ValidationError."""
        given = [k for k, v in (("cron", cron), ("interval", interval_s), ("at", at)) if v is not None]
        if len(given) != 1:
            raise ValidationError("schedule", "give exactly one of --cron, --interval or --at",
                                  ", ".join(given) or "none")
        kind = {"cron": "cron", "interval": "interval", "at": "once"}[given[0]]
        if kind != "cron" and (tz is not None or dialect is not None):
            raise ValidationError("tz" if tz is not None else "dialect",
                                  "applies to --cron schedules only")
        spec = cls(
            tenant=tenant, kind=kind, cron=cron,
            tz=("UTC" if tz is None else tz) if kind == "cron" else None,
            dialect=(dialect or "unix") if kind == "cron" else None,
            interval_s=_whole_seconds("interval", interval_s, minimum=1) if kind == "interval" else None,
            at=at, name=name, misfire=misfire,
            catchup_window_s=_whole_seconds("catchup_window", catchup_window_s, minimum=0),
            misfire_grace_s=_whole_seconds("misfire_grace", misfire_grace_s, minimum=0),
            jitter_s=_whole_seconds("jitter", jitter_s, minimum=0),
        )
        return spec.validated()

    def validated(self, now: datetime | None = None) -> JobSpec:
        """Check every field; return self. Raises ValidationError naming the field.

        ``now`` (aware; default: the host clock) only starts the search for
        UTC-offset changes in the jitter rule (:func:`check_jitter`).
        """
        validate_tenant(self.tenant)
        if self.name is not None and not (0 < len(self.name) <= MAX_NAME_LEN and self.name.isprintable()):
            raise ValidationError("name", f"must be 1-{MAX_NAME_LEN} printable characters", self.name)
        if self.kind not in KINDS:
            raise ValidationError("kind", f"must be one of {', '.join(KINDS)}", self.kind)
        if self.misfire not in MISFIRE_POLICIES:
            raise ValidationError("misfire", f"must be one of {', '.join(MISFIRE_POLICIES)}", self.misfire)
        if self.jitter_s > MAX_JITTER_S:
            raise ValidationError("jitter", f"must be at most {MAX_JITTER_S} seconds", self.jitter_s)
        for field, value in (("catchup_window", self.catchup_window_s), ("misfire_grace", self.misfire_grace_s)):
            if value > MAX_POLICY_S:
                raise ValidationError(field, f"must be at most {MAX_POLICY_S} seconds", value)
        if self.kind == "interval" and self.interval_s is not None and self.interval_s > MAX_INTERVAL_S:
            raise ValidationError("interval", f"must be at most {MAX_INTERVAL_S} seconds (100 years)",
                                  self.interval_s)
        if self.kind == "cron" and self.dialect not in DIALECTS:
            raise ValidationError("dialect", f"must be one of {', '.join(DIALECTS)}", self.dialect)
        if self.kind == "once" and (self.at is None or self.at.tzinfo is None):
            raise ValidationError("at", "must be an instant with a UTC offset (e.g. 2030-01-01T00:00:00Z)",
                                  None if self.at is None else self.at.isoformat())
        schedule = self.schedule(anchor=None)  # parses cron/zone; raises ValidationError
        check_jitter(self.jitter_s, schedule, now or datetime.now(timezone.utc))
        return self

    def schedule(self, anchor: datetime | None):
        """The schedule object; ``anchor`` is the interval origin (creation time)."""
        return build_schedule(self.kind, self.cron, self.dialect, self.tz, self.interval_s,
                              anchor, self.at)

    def row_fields(self) -> dict[str, Any]:
        """Columns of ``jobs`` this spec sets (for insert/replace queries)."""
        return {
            "tenant": self.tenant, "name": self.name, "kind": self.kind,
            "cron_expr": self.cron, "cron_dialect": self.dialect, "tz": self.tz,
            "interval_s": self.interval_s, "fire_at": self.at, "misfire": self.misfire,
            "catchup_window_s": self.catchup_window_s, "misfire_grace_s": self.misfire_grace_s,
            "jitter_s": self.jitter_s,
        }

    def same_as_row(self, row: dict[str, Any]) -> bool:
        """True if a stored job row has exactly this spec (idempotent ``--name``)."""
        mine = self.row_fields()
        return all(row.get(key) == value for key, value in mine.items())


def check_jitter(jitter_s: int, schedule, now: datetime) -> None:
    """Refuse jitter that is not smaller than the smallest gap between consecutive slots.

    Slot ``k`` is due at its nominal time plus up to ``jitter_s``; below
    the gap every slot is due before the next one's nominal time, so
    slots become due in nominal order (the planner relies on it). The
    gap: an interval's is the interval; a one-shot has none (any jitter
    passes); a cron schedule's is what
    :meth:`~scheduler.schedule.CronSchedule.smallest_gap_s` finds: the
    expression's smallest wall-clock gap over all time, and the fires
    around every UTC-offset change of its zone in the two years after
    ``now`` (a spring-forward day can bring slots closer: ``30 1,2 * *
    *`` in America/New_York has a 1,800 s gap once a year). Raises
    :class:`~scheduler.errors.ValidationError` on field ``jitter``.
    """
    if jitter_s <= 0:
        return
    gap = schedule.smallest_gap_s(jitter_s, now)
    if gap is None:
        return
    where = ""
    if isinstance(schedule, CronSchedule):
        wall_gap = schedule.expression.smallest_wall_gap_s()
        if wall_gap is None or gap < wall_gap:
            where = f", at a UTC-offset change of {schedule.tz}"
    raise ValidationError(
        "jitter", f"must be smaller than the smallest gap between slots ({gap} s for this schedule{where})",
        jitter_s)


def _whole_seconds(field: str, value: Any, minimum: int) -> int:
    """Coerce a user-given duration to whole seconds ≥ ``minimum`` or raise ValidationError."""
    if isinstance(value, bool):
        raise ValidationError(field, "must be a number of seconds", value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValidationError(field, "must be a number of seconds", value) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ValidationError(field, "must be a finite number of seconds", value)
    if number != int(number):
        raise ValidationError(field, "must be a whole number of seconds", value)
    if number < minimum:
        rule = "must be positive (at least 1 second)" if minimum == 1 else f"must be at least {minimum}"
        raise ValidationError(field, rule, value)
    return int(number)


def build_schedule(kind: str, cron: str | None, dialect: str | None, tz: str | None,
                   interval_s: int | None, anchor: datetime | None, at: datetime | None):
    """Schedule object for one job's columns. Raises ValidationError on bad values.

    ``anchor`` may be ``None`` for validation only (an interval is then
    anchored at the Unix epoch).
    """
    if kind == "cron":
        return CronSchedule(cron or "", tz or "UTC", dialect or "unix")
    if kind == "interval":
        return IntervalSchedule(interval_s, anchor or datetime(1970, 1, 1, tzinfo=timezone.utc))
    if kind == "once":
        return OnceSchedule(at)
    raise ValidationError("kind", f"must be one of {', '.join(KINDS)}", kind)


class _Memo:
    """A schedule whose ``next_after`` answers are memoized (bounded)."""

    __slots__ = ("_schedule", "_memo", "_max")

    def __init__(self, schedule, max_entries: int) -> None:
        self._schedule = schedule
        self._memo: dict[datetime, datetime | None] = {}
        self._max = max_entries

    def next_after(self, instant: datetime) -> datetime | None:
        try:
            return self._memo[instant]
        except KeyError:
            pass
        result = self._schedule.next_after(instant)
        if len(self._memo) >= self._max:
            self._memo.clear()
        self._memo[instant] = result
        return result


class ScheduleCache:
    """Schedules keyed by their defining columns, with memoized ``next_after``.

    Holds at most ``max_schedules`` schedules (least recently used evicted)
    and ``max_instants`` memoized answers per schedule.
    """

    def __init__(self, max_schedules: int = 50_000, max_instants: int = 256) -> None:
        self._schedules: OrderedDict[tuple, _Memo] = OrderedDict()
        self._max_schedules = max_schedules
        self._max_instants = max_instants

    def for_row(self, row: dict[str, Any]) -> _Memo:
        """The schedule of a ``jobs`` row (a dict with the ``jobs`` column names)."""
        return self.for_key((row["kind"], row["cron_expr"], row["cron_dialect"], row["tz"],
                             row["interval_s"], row["anchor_at"], row["fire_at"]))

    def for_key(self, key: tuple) -> _Memo:
        """The schedule for ``(kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at)``,
        the arguments of :func:`build_schedule` in order."""
        memo = self._schedules.get(key)
        if memo is None:
            memo = _Memo(build_schedule(*key), self._max_instants)
            self._schedules[key] = memo
            if len(self._schedules) > self._max_schedules:
                self._schedules.popitem(last=False)
        else:
            self._schedules.move_to_end(key)
        return memo
