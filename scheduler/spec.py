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
computations collapse into a few dozen (docs/design.md §5).
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from scheduler.errors import ValidationError
from scheduler.planner import CATCHUP_WINDOW_S, DEFAULT_MISFIRE, MISFIRE_GRACE_S, MISFIRE_POLICIES
from scheduler.schedule import CronSchedule, IntervalSchedule, OnceSchedule, Schedule, ScheduleKind
from scheduler.zones import load_zone

if TYPE_CHECKING:
    from scheduler.delivery.targets import DeliverySpec

KINDS = ("cron", "interval", "once")

CRON_ONE_LINE = "must be one line of fields separated by spaces or tabs (no line breaks or other control characters)"
"""The rule of a cron expression's characters (checked when a job is saved; stored rows are
read as they are). Tabs stay: FreeBSD's crontab separates fields with them."""


def check_cron_text(expr: str) -> None:
    """Refuse a cron expression that is not one line (:data:`CRON_ONE_LINE`), with a
    ValidationError naming ``cron``. The parser splits on any whitespace, so
    ``"0 3 * * *\\n"`` parsed; this is checked wherever an expression comes in (a job
    saved, ``jobs next``, ``GET /v1/explain``), not when a stored row is read."""
    if not expr.replace("\t", " ").isprintable():
        raise ValidationError("cron", CRON_ONE_LINE, expr)


DIALECTS = ("unix", "seconds")
MAX_JITTER_S = 86_400
MAX_POLICY_S = 2_147_483_647
"""Largest catch-up window / misfire grace: the store keeps them in INTEGER columns."""
MAX_INTERVAL_S = 100 * 365 * 86_400
"""Largest interval (100 years): later slots would leave the supported date range."""
MAX_NAME_LEN = 200
NAME_SEGMENT_RULE = "must not contain / or be . or .. (it is one URL path segment)"
"""The rule a job name meets beyond being printable: the tenant API addresses a job as
``/v1/schedules/<name>``, one URL path segment (a name of the CLI or an import that broke
it could be neither read nor kept by an apply's prune over the API)."""


def check_name_segment(name: Any, field: str = "name") -> Any:
    """Return ``name`` if it is not a string breaking :data:`NAME_SEGMENT_RULE` (other
    types are the printable-text rule's to refuse); else raise ValidationError naming ``field``."""
    if isinstance(name, str) and ("/" in name or name in (".", "..")):
        raise ValidationError(field, NAME_SEGMENT_RULE, name)
    return name


def _default_delivery() -> DeliverySpec:
    from scheduler.delivery.targets import DeliverySpec  # imports this module

    return DeliverySpec()


_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}")
"""A tenant name, matched whole (``fullmatch``: an anchored ``$`` lets a final newline through)."""


def validate_tenant(tenant: str) -> str:
    """Return ``tenant`` if valid: 1–200 chars of letters, digits and ``._:@/-``, not
    starting with punctuation. Raises ValidationError (field ``tenant``)."""
    if not isinstance(tenant, str) or not _TENANT_RE.fullmatch(tenant):
        raise ValidationError(
            "tenant",
            "must be 1-200 characters of letters, digits and . _ : @ / -, starting with a letter or digit",
            tenant,
        )
    return tenant


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A timer as registered. Exactly one of ``cron``/``interval_s``/``at`` is set.

    Durations in whole seconds. ``at`` and ``anchor_at`` are aware datetimes.
    ``delivery`` is where its runs go and what they carry
    (:class:`scheduler.delivery.targets.DeliverySpec`; default: the tenant's
    queue ``default``, no payload): not part of the schedule identity.
    """

    tenant: str
    kind: str
    cron: str | None = None
    tz: str | None = None
    dialect: str | None = None
    interval_s: int | None = None
    at: datetime | None = None
    name: str | None = None
    misfire: str = DEFAULT_MISFIRE
    catchup_window_s: int = CATCHUP_WINDOW_S
    misfire_grace_s: int = MISFIRE_GRACE_S
    jitter_s: int = 0
    delivery: DeliverySpec = dataclasses.field(default_factory=_default_delivery)

    @classmethod
    def build(
        cls,
        *,
        tenant: str,
        cron: str | None = None,
        tz: str | None = None,
        dialect: str | None = None,
        interval_s: Any = None,
        at: datetime | None = None,
        name: str | None = None,
        misfire: str = DEFAULT_MISFIRE,
        catchup_window_s: Any = None,
        misfire_grace_s: Any = None,
        jitter_s: Any = 0,
        delivery: DeliverySpec | None = None,
    ) -> JobSpec:
        """Build and validate a spec from user input; raises ValidationError.

        Numbers may be ints or strings of ASCII digits (:func:`parse_whole`).
        ``catchup_window_s`` (default :data:`~scheduler.planner.CATCHUP_WINDOW_S`)
        is used by the ``all`` policy only, ``misfire_grace_s`` (default
        :data:`~scheduler.planner.MISFIRE_GRACE_S`) by ``once`` and ``skip``:
        giving one (not ``None``) with a policy that ignores it is refused
        (ValidationError naming both). ``tz`` ``None`` means UTC; an empty
        ``tz`` is refused.
        """
        given = [k for k, v in (("cron", cron), ("interval", interval_s), ("at", at)) if v is not None]
        if len(given) != 1:
            raise ValidationError(
                "schedule", "give exactly one of {cron}, {interval} or {at}", ", ".join(given) or "none"
            )
        kind = {"cron": "cron", "interval": "interval", "at": "once"}[given[0]]
        if kind != "cron" and (tz is not None or dialect is not None):
            raise ValidationError("tz" if tz is not None else "dialect", "applies to {cron} schedules only")
        if misfire_grace_s is not None and misfire == "all":
            raise ValidationError(
                "misfire_grace_s", "{misfire_grace_s} is ignored by {misfire} all (it applies to once and skip)"
            )
        if catchup_window_s is not None and misfire in MISFIRE_POLICIES and misfire != "all":
            raise ValidationError(
                "catchup_window_s", f"{{catchup_window_s}} is ignored by {{misfire}} {misfire} (it applies to all only)"
            )
        spec = cls(
            tenant=tenant,
            kind=kind,
            cron=cron,
            tz=("UTC" if tz is None else tz) if kind == "cron" else None,
            dialect=(dialect or "unix") if kind == "cron" else None,
            interval_s=parse_seconds("interval", interval_s) if kind == "interval" else None,
            at=at,
            name=name,
            misfire=misfire,
            catchup_window_s=(
                CATCHUP_WINDOW_S if catchup_window_s is None else parse_seconds("catchup_window_s", catchup_window_s)
            ),
            misfire_grace_s=MISFIRE_GRACE_S
            if misfire_grace_s is None
            else parse_seconds("misfire_grace_s", misfire_grace_s),
            jitter_s=parse_seconds("jitter", jitter_s),
            delivery=_default_delivery() if delivery is None else delivery,
        )
        return spec.validated()

    def validated(self, now: datetime | None = None) -> JobSpec:
        """Check every field; return self. Raises ValidationError naming the field.

        ``now`` (aware; default: the host clock) only starts the search for
        UTC-offset changes in the jitter rule (:func:`check_jitter`).
        """
        validate_tenant(self.tenant)
        if self.name is not None and not (
            isinstance(self.name, str) and 0 < len(self.name) <= MAX_NAME_LEN and self.name.isprintable()
        ):
            raise ValidationError("name", f"must be 1-{MAX_NAME_LEN} printable characters", self.name)
        check_name_segment(self.name)
        if self.kind not in KINDS:
            raise ValidationError("kind", f"must be one of {', '.join(KINDS)}", self.kind)
        if self.misfire not in MISFIRE_POLICIES:
            raise ValidationError("misfire", f"must be one of {', '.join(MISFIRE_POLICIES)}", self.misfire)
        if self.jitter_s > MAX_JITTER_S:
            raise ValidationError("jitter", f"must be at most {MAX_JITTER_S} seconds", self.jitter_s)
        for field, value in (("catchup_window_s", self.catchup_window_s), ("misfire_grace_s", self.misfire_grace_s)):
            if value > MAX_POLICY_S:
                raise ValidationError(field, f"must be at most {MAX_POLICY_S} seconds", value)
        if self.kind == "interval" and self.interval_s is not None and self.interval_s > MAX_INTERVAL_S:
            raise ValidationError("interval", f"must be at most {MAX_INTERVAL_S} seconds (100 years)", self.interval_s)
        if self.kind == "cron" and isinstance(self.cron, str):
            check_cron_text(self.cron)
        if self.kind == "cron" and self.dialect not in DIALECTS:
            raise ValidationError("dialect", f"must be one of {', '.join(DIALECTS)}", self.dialect)
        if self.kind == "cron":
            load_zone(self.tz or "")  # an empty or unknown zone is refused here, never read as UTC
        if self.kind == "once" and (self.at is None or self.at.tzinfo is None):
            raise ValidationError(
                "at",
                "must be an instant with a UTC offset (e.g. 2030-01-01T00:00:00Z)",
                None if self.at is None else self.at.isoformat(),
            )
        schedule = self.schedule(anchor=None)  # parses cron/zone; raises ValidationError
        check_jitter(self.jitter_s, schedule, now or datetime.now(UTC))
        self.delivery.validated()
        return self

    def schedule(self, anchor: datetime | None) -> ScheduleKind:
        """The schedule object; ``anchor`` is the interval origin (creation time)."""
        return build_schedule(self.kind, self.cron, self.dialect, self.tz, self.interval_s, anchor, self.at)

    def row_fields(self) -> dict[str, Any]:
        """Columns of ``jobs`` this spec sets (for insert/replace queries), with the
        delivery's ``queue`` and ``overlap``; the rest of delivery goes to
        ``job_delivery`` (:meth:`DeliverySpec.delivery_row`)."""
        return {
            **self.delivery.job_fields(),
            "tenant": self.tenant,
            "name": self.name,
            "kind": self.kind,
            "cron_expr": self.cron,
            "cron_dialect": self.dialect,
            "tz": self.tz,
            "interval_s": self.interval_s,
            "fire_at": self.at,
            "misfire": self.misfire,
            "catchup_window_s": self.catchup_window_s,
            "misfire_grace_s": self.misfire_grace_s,
            "jitter_s": self.jitter_s,
        }

    @classmethod
    def from_rows(cls, row: dict[str, Any], delivery_row: dict[str, Any] | None = None) -> JobSpec:
        """The spec a stored job has: its ``jobs`` row and its ``job_delivery`` row
        (``None``: it has none). Not validated (a row is what was validated when
        saved); ``same_as_row`` of the result and the same rows is true."""
        from scheduler.delivery.targets import DeliverySpec

        return cls(
            tenant=row["tenant"],
            kind=row["kind"],
            cron=row["cron_expr"],
            tz=row["tz"],
            dialect=row["cron_dialect"],
            interval_s=row["interval_s"],
            at=row["fire_at"],
            name=row["name"],
            misfire=row["misfire"],
            catchup_window_s=row["catchup_window_s"],
            misfire_grace_s=row["misfire_grace_s"],
            jitter_s=row["jitter_s"],
            delivery=DeliverySpec.from_rows(row, delivery_row),
        )

    def same_as_row(self, row: dict[str, Any], delivery_row: dict[str, Any] | None = None) -> bool:
        """True if a stored job has exactly this spec (idempotent ``--name``): its
        ``jobs`` row and its ``job_delivery`` row (``None``: it has none), delivery
        included."""
        from scheduler.delivery.targets import DeliverySpec

        mine = self.row_fields()
        if not all(row.get(key) == value for key, value in mine.items()):
            return False
        return self.delivery.same_as(DeliverySpec.from_rows(row, delivery_row))


def check_jitter(jitter_s: int, schedule: ScheduleKind, now: datetime) -> None:
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
        "jitter", f"must be smaller than the smallest gap between slots ({gap} s for this schedule{where})", jitter_s
    )


_WHOLE_RE = re.compile(r"[+-]?[0-9]+")
MAX_DIGITS = 100
"""Longest whole number parsed (digits); Python's ``int()`` refuses beyond 4,300."""
_DECIMAL_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_whole(
    field: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    unit: str = "",
    rule: str | None = None,
    max_note: str = "",
) -> int:
    """A whole number from user input: an ``int``, an integral finite ``float``, or a
    string of ASCII digits with an optional sign (surrounding spaces ignored).

    Parsed as an integer, never through ``float``, so a huge value is
    compared and echoed exactly as typed; non-ASCII digits (``٦٠``), which
    Python's ``int()`` would accept, are refused, as are ``1e3``, ``1_000``
    and ``1.5``. ``unit`` (e.g. ``"seconds"``) goes into the messages;
    ``rule``, if given, is the one message of every refusal (e.g. "must be a
    whole number from 1 to 1000 in ASCII digits"); ``max_note`` is appended
    to the "at most" message. Raises ValidationError naming ``field`` with
    the value as given.
    """
    of_unit = f" of {unit}" if unit else ""
    shape = rule or f"must be a whole number{of_unit} in ASCII digits"
    if isinstance(value, bool):
        raise ValidationError(field, shape, value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")) or value != int(value):
            raise ValidationError(field, shape, value)
        number = int(value)
    elif isinstance(value, str) and _WHOLE_RE.fullmatch(value.strip(" \t")):
        text = value.strip(" \t")
        if len(text.lstrip("+-").lstrip("0")) > MAX_DIGITS:  # beyond int()'s digit limit: no bound is that far
            if text.startswith("-") and minimum is None or not text.startswith("-") and maximum is None:
                raise ValidationError(field, f"must have at most {MAX_DIGITS} digits", value)
            number = (minimum - 1) if text.startswith("-") else (maximum + 1)  # type: ignore[operator]
        else:
            number = int(text)
    else:
        raise ValidationError(field, shape, value)
    if minimum is not None and number < minimum:
        if rule is None and minimum == 1 and unit == "seconds":
            rule_text = "must be positive (at least 1 second)"
        else:
            rule_text = rule or f"must be at least {minimum}"
        raise ValidationError(field, rule_text, value)
    if maximum is not None and number > maximum:
        raise ValidationError(field, rule or f"must be at most {maximum}{' ' + unit if unit else ''}{max_note}", value)
    return number


def parse_decimal(field: str, value: Any, *, rule: str | None = None) -> float:
    """A number from user input: an ``int``/``float`` or a string in ASCII decimal
    notation (``2``, ``0.5``, ``1e3``; no ``inf``/``nan``, no non-ASCII digits).

    Range checks are the caller's. Raises ValidationError naming ``field``
    (with ``rule`` as the message if given).
    """
    shape = rule or "must be a number in ASCII digits"
    if isinstance(value, bool):
        raise ValidationError(field, shape, value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _DECIMAL_RE.fullmatch(value.strip(" \t")):
        return float(value.strip(" \t"))
    raise ValidationError(field, shape, value)


SECONDS_FIELDS: dict[str, dict[str, Any]] = {
    "interval": {"minimum": 1, "maximum": MAX_INTERVAL_S, "max_note": " (100 years)"},
    "catchup_window_s": {"minimum": 0, "maximum": MAX_POLICY_S},
    "misfire_grace_s": {"minimum": 0, "maximum": MAX_POLICY_S},
    "jitter": {"minimum": 0, "maximum": MAX_JITTER_S},
}
"""Bounds of each duration field of a spec, in whole seconds (the CLI's options use them too)."""


def parse_seconds(field: str, value: Any) -> int:
    """A duration field of :data:`SECONDS_FIELDS` in whole seconds (:func:`parse_whole`);
    raises ValidationError naming ``field``, the value as typed and the bound."""
    return parse_whole(field, value, unit="seconds", **SECONDS_FIELDS[field])


def build_schedule(
    kind: str,
    cron: str | None,
    dialect: str | None,
    tz: str | None,
    interval_s: int | None,
    anchor: datetime | None,
    at: datetime | None,
) -> ScheduleKind:
    """Schedule object for one job's columns. Raises ValidationError on bad values.

    ``anchor`` may be ``None`` for validation only (an interval is then
    anchored at the Unix epoch).
    """
    if kind == "cron":
        return CronSchedule(cron or "", tz or "UTC", dialect or "unix")
    if kind == "interval":
        return IntervalSchedule(interval_s, anchor or datetime(1970, 1, 1, tzinfo=UTC))
    if kind == "once":
        return OnceSchedule(at)
    raise ValidationError("kind", f"must be one of {', '.join(KINDS)}", kind)


class _Memo:
    """A schedule whose ``next_after`` answers are memoized (bounded)."""

    __slots__ = ("_schedule", "_memo", "_max")

    def __init__(self, schedule: Schedule, max_entries: int) -> None:
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


ScheduleKey = tuple[str, str | None, str | None, str | None, int | None, datetime | None, datetime | None]
"""``(kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at)``: the
arguments of :func:`build_schedule`, the ``jobs`` columns that define a schedule."""


def schedule_key(row: dict[str, Any]) -> ScheduleKey:
    """The :data:`ScheduleKey` of a ``jobs`` (or ``job_revisions``) row: a dict
    with the ``jobs`` column names."""
    return (
        row["kind"],
        row["cron_expr"],
        row["cron_dialect"],
        row["tz"],
        row["interval_s"],
        row["anchor_at"],
        row["fire_at"],
    )


class ScheduleCache:
    """Schedules keyed by their defining columns, with memoized ``next_after``.

    Holds at most ``max_schedules`` schedules (least recently used evicted)
    and ``max_instants`` memoized answers per schedule.
    """

    def __init__(self, max_schedules: int = 50_000, max_instants: int = 256) -> None:
        self._schedules: OrderedDict[ScheduleKey, _Memo] = OrderedDict()
        self._max_schedules = max_schedules
        self._max_instants = max_instants

    def for_row(self, row: dict[str, Any]) -> _Memo:
        """The schedule of a ``jobs`` row (a dict with the ``jobs`` column names)."""
        return self.for_key(schedule_key(row))

    def for_key(self, key: ScheduleKey) -> _Memo:
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
