"""``GET /v1/explain``: the next fires of a cron expression, as ``scheduler jobs next`` (docs/api.md, "Explain").

Needs any valid key; the answer reads nothing from the store (the default
``after`` is this host's clock), but checking the key does
(:func:`scheduler.api.deps.authenticate`), so with the store down it is a 503
as every endpoint is. The inputs are checked by the same
functions as the CLI's (:class:`scheduler.schedule.CronSchedule`,
:func:`scheduler.schedule.parse_instant`, :func:`scheduler.spec.parse_whole`),
so a bad one is a 422 with the CLI's one-line message naming the field.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from scheduler.api.deps import Principal, any_principal
from scheduler.api.inputs import JsonRoute
from scheduler.errors import ValidationError
from scheduler.schedule import CronSchedule, format_instant, parse_instant
from scheduler.spec import check_cron_text, parse_whole

router = APIRouter(tags=["explain"], route_class=JsonRoute)

DEFAULT_COUNT = 5
MAX_COUNT = 10_000
"""As ``scheduler jobs next --count``."""

BUDGET_S = 2.0
"""Most CPU time one request spends listing fires (seconds): a sparse expression (29 February
on a Monday) takes about 0.1 s a fire, 10,000 would hold a thread for minutes. The listing stops
there with ``truncated`` true; ask again with ``after`` = the last fire."""

COUNT_RULE = f"must be a whole number from 1 to {MAX_COUNT} in ASCII digits"


class Fire(BaseModel):
    """One fire: the instant in UTC and the wall time in the schedule's zone (with its offset)."""

    at: str = Field(description="UTC instant, ISO 8601 with Z, e.g. 2023-10-29T01:00:00Z.")
    local: str = Field(description="Wall time in tz with its UTC offset, e.g. 2023-10-29T02:00:00+01:00.")


class Explanation(BaseModel):
    """The next ``count`` fires strictly after ``after``; ``exhausted`` when the supported range
    (year 9997) ended first, ``truncated`` when the time budget did (:data:`BUDGET_S`; ask again
    from the last fire); either way ``fires`` is then shorter than ``count``."""

    cron: str
    tz: str
    dialect: str
    after: str
    fires: list[Fire]
    exhausted: bool
    truncated: bool


def _count_schema(schema: dict[str, Any]) -> None:
    """``count`` is read as text and parsed as the CLI parses ``--count`` (the same messages);
    its schema says what clients should send: an integer from 1 to MAX_COUNT."""
    schema.pop("anyOf", None)
    schema.update({"type": "integer", "minimum": 1, "maximum": MAX_COUNT, "default": DEFAULT_COUNT})


@router.get("/v1/explain", response_model=Explanation, summary="Next fires of a cron expression")
def explain(
    _: Annotated[Principal, Depends(any_principal)],
    cron: Annotated[str | None, Query(description="Cron expression, e.g. `0 2 * * *`.", max_length=1000)] = None,
    tz: Annotated[str | None, Query(description="IANA zone of the wall clock (default UTC).", max_length=200)] = None,
    dialect: Annotated[
        str | None, Query(description="`unix` (5 fields, default) or `seconds` (6-7 fields).", max_length=20)
    ] = None,
    after: Annotated[
        str | None,
        Query(max_length=100, description="ISO 8601 instant with offset; fires strictly after it (default: now)."),
    ] = None,
    count: Annotated[
        str | None,
        Query(description=f"How many fires (1-{MAX_COUNT}, default {DEFAULT_COUNT}).", json_schema_extra=_count_schema),
    ] = None,
) -> Explanation:
    """The next fires of ``cron`` on the wall clock of ``tz``, as `scheduler jobs next`.

    Errors are the CLI's: `cron: is required (--cron EXPR)`, `tz: ...`, `count: must be a
    whole number from 1 to 10000 in ASCII digits (got '0')`, each a 422 naming the field.
    """
    if cron is None:
        raise ValidationError("cron", "is required (?cron=EXPR)")
    check_cron_text(cron)
    # Read as text and parsed as the CLI parses --count (the schema says integer): the same messages.
    n = DEFAULT_COUNT if count is None else parse_whole("count", count, minimum=1, maximum=MAX_COUNT, rule=COUNT_RULE)
    schedule = CronSchedule(cron, "UTC" if tz is None else tz, dialect or "unix")
    start = datetime.now(UTC) if after is None else parse_instant(after, "after")
    fires: list[Fire] = []
    instant = start
    exhausted = truncated = False
    deadline = time.thread_time() + BUDGET_S
    for listed in range(n):
        if listed and time.thread_time() > deadline:
            truncated = True
            break
        following = schedule.next_after(instant)
        if following is None:
            exhausted = True
            break
        instant = following
        fires.append(Fire(at=format_instant(instant), local=instant.astimezone(schedule.zone).isoformat()))
    return Explanation(
        cron=cron,
        tz=schedule.tz,
        dialect=dialect or "unix",
        after=format_instant(start),
        fires=fires,
        exhausted=exhausted,
        truncated=truncated,
    )
