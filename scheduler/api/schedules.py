"""``/v1/schedules``: a tenant's schedules over HTTP (docs/api.md, "Schedules").

A *schedule* is a named job of the key's tenant (:mod:`scheduler.jobs`); the
endpoints are the CLI's ``jobs`` commands on the same functions, so every
rule and every message is the CLI's (a refusal is a 422 problem+json whose
``detail`` is the CLI's one-line message and whose ``field`` names the body
field, e.g. ``interval_s`` for the CLI's ``interval``):

* ``PUT /v1/schedules/{name}``: idempotent upsert of the full spec
  (:func:`scheduler.jobs.apply_jobs` with one item): 201 created, 200
  replaced or unchanged (an unchanged PUT writes nothing: no revision, same
  ``ETag``). ``ETag`` is :func:`scheduler.jobs.spec_digest` (strong);
  ``If-Match`` / ``If-None-Match`` are evaluated as RFC 9110 says, in the
  write's transaction with the row locked (412 when they fail, with the
  current ``ETag`` if there is one). The response has the next 10 fires.
* ``GET /v1/schedules`` (cursor paging by name; filters ``paused``,
  ``kind``, ``queue``, ``name_prefix``), ``GET /v1/schedules/{name}``
  (``jobs describe``), ``DELETE`` (204; ``If-Match`` as for PUT), ``POST …/{name}:pause``,
  ``:resume`` (catch-up ``none`` or ``backfill``), ``:trigger`` (request id,
  force; ``jobs trigger``'s dedup), ``:backfill`` (``jobs backfill``).
* ``POST /v1/schedules:apply``: a tenant's whole set in one transaction
  (``prune`` with no items only with ``allow_empty``).

Names in URLs: a schedule's name is percent-encoded by the client (an
encoded ``/`` reaches the name rule's 422); it may contain ``:`` (``import:…:1``). Only ``POST`` has
``:action`` suffixes and a schedule's own URL takes no ``POST``, so the
action is the text after the LAST colon: ``POST /v1/schedules/a:b:pause``
pauses ``a:b``. Names the API writes must not contain ``/`` and must not be
``.`` or ``..`` (they could not be addressed as one segment).

Scoping: a schedule is found only by statements that take the key's tenant
in their ``WHERE`` clause (``get_job_by_name``, ``list_schedules``,
``find_jobs_by_names``, ``jobs_of_tenant_except``; the per-job functions
read the job again scoped by it, ``get_job``/``get_job_for_update``), and
what follows acts on the row so found, by its key; so another tenant's
schedule is a 404 exactly like a missing one. Tenant keys only (worker and
admin keys: 403). URL targets are checked when saved with the app's
``push_policy`` (the operator's ``push_allow``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

import psycopg
from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, WithJsonSchema, field_validator

from scheduler import jobs
from scheduler.api.deps import Principal, db, decode_cursor, page_of, page_size, tenant_principal
from scheduler.api.errors import FIELD_NAMES, PROBLEM_JSON, ApiError, Problem, api_terms
from scheduler.api.inputs import JsonRoute
from scheduler.delivery import manual, targets, views
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.ssrf import AddressPolicy
from scheduler.delivery.targets import DeliverySpec
from scheduler.errors import UNSTORABLE_TEXT, NotFoundError, ValidationError, clip
from scheduler.planner import DEFAULT_MISFIRE, MISFIRE_POLICIES
from scheduler.schedule import parse_instant
from scheduler.spec import (
    DIALECTS,
    KINDS,
    MAX_INTERVAL_S,
    MAX_JITTER_S,
    MAX_NAME_LEN,
    MAX_POLICY_S,
    JobSpec,
    check_name_segment,
    parse_decimal,
    parse_whole,
)

router = APIRouter(tags=["schedules"], route_class=JsonRoute)

MAX_APPLY_ITEMS = 10_000
"""Most items one ``apply`` takes (the 1 MB body bounds it anyway)."""
MAX_TRIGGER_WAIT_S = 10.0
"""Longest ``wait_s`` of ``:trigger`` (a request thread waits that long at most)."""

UNPROCESSABLE = "Unprocessable Content"
"""RFC 9110's title of a 422 (the app's handlers give the same)."""


# ---------------------------------------------------------------- models


def _schema(schema: dict[str, Any]) -> WithJsonSchema:
    """The JSON schema of a field the project's own parser checks (pydantic passes
    the value through, so the refusal is the CLI's message)."""
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]})


def _whole(minimum: int, maximum: int) -> WithJsonSchema:
    """The schema of a whole-number field (parsed by :func:`scheduler.spec.parse_whole`)."""
    return _schema({"type": "integer", "minimum": minimum, "maximum": maximum})


def _number(low: float, maximum: float, *, inclusive: bool = False) -> WithJsonSchema:
    """The schema of a number field (parsed by :func:`scheduler.spec.parse_decimal`)."""
    return _schema({"type": "number", "minimum" if inclusive else "exclusiveMinimum": low, "maximum": maximum})


def _choice(values: tuple[str, ...]) -> WithJsonSchema:
    """The schema of a field taking one of ``values`` (checked by the project)."""
    return _schema({"type": "string", "enum": list(values)})


_Text = Annotated[Any, _schema({"type": "string"})]


class ScheduleSpec(BaseModel):
    """A schedule's full spec (the body of ``PUT``; an ``apply`` item adds ``name``).
    Exactly one of ``cron``, ``interval_s``, ``at``; exactly one target,
    ``queue`` (default ``default``) or ``url``. Omitted fields take the
    CLI's defaults, so a PUT replaces the whole spec."""

    model_config = ConfigDict(extra="forbid")

    kind: Annotated[
        Any, _choice(KINDS), Field(description="Optional: the kind the other fields imply (checked, not needed).")
    ] = None
    cron: Annotated[_Text, Field(description="Cron expression (see dialect).")] = None
    tz: Annotated[_Text, Field(description="IANA zone of the cron expression (default UTC).")] = None
    dialect: Annotated[Any, _choice(DIALECTS), Field(description="unix (5 fields, default) or seconds (6 fields).")] = (
        None
    )
    interval_s: Annotated[Any, _whole(1, MAX_INTERVAL_S), Field(description="Fixed interval in seconds.")] = None
    at: Annotated[
        Any,
        _schema({"type": "string", "format": "date-time"}),
        Field(description="One-shot instant with a UTC offset, in the future."),
    ] = None
    misfire: Annotated[
        Any, _choice(MISFIRE_POLICIES), Field(description="Catch-up policy for overdue slots (default all).")
    ] = None
    catchup_window_s: Annotated[Any, _whole(0, MAX_POLICY_S), Field(description="Window of misfire all (only).")] = None
    misfire_grace_s: Annotated[
        Any, _whole(0, MAX_POLICY_S), Field(description="Grace of misfire once and skip (only).")
    ] = None
    jitter_s: Annotated[
        Any, _whole(0, MAX_JITTER_S), Field(description="Deterministic delay of up to this many seconds per run.")
    ] = None
    queue: Annotated[_Text, Field(description="Target: a queue of the tenant (default default).")] = None
    url: Annotated[_Text, Field(description="Target: an http(s) endpoint each run is pushed to.")] = None
    method: Annotated[_Text, Field(description="HTTP method of a url target: POST (default) or PUT, any case.")] = None
    headers: Annotated[
        Any,
        _schema({"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": targets.MAX_HEADERS}),
        Field(description="Headers of a url target, name → value (values never shown back)."),
    ] = None
    timeout_s: Annotated[
        Any, _number(0, targets.MAX_TIMEOUT_S), Field(description="Per-attempt timeout of a url target (default 10).")
    ] = None
    payload: Annotated[Any, Field(description="JSON delivered with every attempt (null: none).")] = None
    max_attempts: Annotated[
        Any, _whole(1, targets.MAX_ATTEMPTS), Field(description="Attempts of a run before it is dead (default 5).")
    ] = None
    backoff_base_s: Annotated[
        Any, _number(0, targets.MAX_BACKOFF_S), Field(description="Retry backoff base (default 1).")
    ] = None
    backoff_cap_s: Annotated[
        Any, _number(0, targets.MAX_BACKOFF_S), Field(description="Longest retry backoff (default 300).")
    ] = None
    max_age_s: Annotated[
        Any,
        _schema({"anyOf": [{"type": "integer", "minimum": 1, "maximum": targets.MAX_AGE_S}, {"type": "string"}]}),
        Field(description="No retry starts later than this after the first attempt: seconds, or 90m, 12h, 7d."),
    ] = None
    overlap: Annotated[Any, _choice(targets.OVERLAP_POLICIES), Field(description="Overlap policy (default allow).")] = (
        None
    )

    @field_validator("interval_s", "catchup_window_s", "misfire_grace_s", "jitter_s", "max_attempts", mode="before")
    @classmethod
    def _json_integer(cls, value: Any) -> Any:
        """A whole-number field takes a JSON integer (or null), never ``"60"`` or ``true``:
        the project's parser would read a string, and the schema says integer."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError("must be a JSON integer (not a string, a boolean or a fraction)")
        return value

    @field_validator("timeout_s", "backoff_base_s", "backoff_cap_s", mode="before")
    @classmethod
    def _json_number(cls, value: Any) -> Any:
        """A number field takes a JSON number (or null), never a string or a boolean."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError("must be a JSON number (not a string or a boolean)")
        return value

    @field_validator("max_age_s", mode="before")
    @classmethod
    def _json_age(cls, value: Any) -> Any:
        """Seconds as a JSON integer, or a duration string (``90m``, ``12h``, ``7d``)."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
            raise ValueError("must be a JSON integer of seconds or a duration string such as 12h")
        return value


class ApplyItem(ScheduleSpec):
    """An ``apply`` item: a spec with its ``name``."""

    name: Annotated[
        Any,
        WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_NAME_LEN}),
        Field(description="Schedule name."),
    ]


class Fire(BaseModel):
    nominal_time: datetime
    scheduled_at: datetime = Field(description="nominal_time plus the schedule's deterministic jitter.")


class Schedule(BaseModel):
    """A schedule as stored: its spec (header names only: values may be secrets),
    state and ``etag`` (the ``ETag`` a PUT's ``If-Match`` compares)."""

    name: str
    etag: str
    kind: Literal["cron", "interval", "once"]
    cron: str | None
    tz: str | None
    dialect: Literal["unix", "seconds"] | None
    interval_s: int | None
    at: datetime | None
    misfire: Literal["all", "once", "skip"]
    catchup_window_s: int
    misfire_grace_s: int
    jitter_s: int
    queue: str | None
    url: str | None
    method: Literal["POST", "PUT"] | None
    header_names: list[str]
    timeout_s: float | None
    payload: Any = Field(description="The payload as a JSON value (null: none).")
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    max_age_s: int | None
    overlap: Literal["allow", "forbid", "buffer_one", "replace"]
    paused: bool
    next_fire: datetime | None = Field(description="The next slot's nominal time (null: paused or none left).")
    revision: int
    created_at: datetime
    changed_at: datetime


class PutResult(BaseModel):
    outcome: Literal["created", "replaced", "unchanged"]
    schedule: Schedule
    next_fires: list[Fire] = Field(description="The next 10 fires, oldest first (none while paused).")


class SchedulePage(BaseModel):
    items: list[Schedule]
    next_cursor: str | None


class Run(BaseModel):
    """One of a schedule's recent runs: the fields ``GET /v1/runs`` shows under the same names
    (``id`` included), plus ``dispatch_lag_s``; ``run_id`` is ``id`` again (the name this
    representation had first, kept)."""

    id: str = Field(description="`<job id>.<nominal time in Unix microseconds>`, as `GET /v1/runs` names it.")
    run_id: str = Field(description="The same as `id`.")
    nominal_time: datetime
    scheduled_at: datetime | None
    fired_at: datetime | None
    state: str | None
    origin: str | None
    attempt: int | None
    lateness_s: float | None
    dispatch_lag_s: float | None
    available_at: datetime | None = Field(
        description="When it may be claimed; null for a pending run: a buffer_one run held behind "
        "an unfinished one (as in `GET /v1/runs`)."
    )
    finished_at: datetime | None
    last_error: str | None = Field(
        description="Why the last attempt failed, or why the run was canceled; null if none did, "
        "and once the run succeeded (the ack clears it)."
    )
    worker: str | None = Field(description="Who made the last claim, as in `GET /v1/runs` (null: never claimed).")


class SkipCount(BaseModel):
    ranges: int
    slots: int
    uncounted: int


class Counters(BaseModel):
    runs: dict[str, int] = Field(description="Runs per delivery state (predelivery: fired before delivery existed).")
    in_flight: int
    skips: dict[str, SkipCount] = Field(description="Skipped slots per reason.")


class Description(BaseModel):
    schedule: Schedule
    next_fires: list[Fire]
    recent_runs: list[Run] = Field(description="The last 10 runs, newest first.")
    counters: Counters


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    catch_up: Annotated[
        Any,
        _choice(manual.CATCH_UP_CHOICES),
        Field(description="Slots missed while paused: none (default) or backfill."),
    ] = "none"
    max_runs: Annotated[
        Any, _whole(1, manual.MAX_BACKFILL_RUNS), Field(description="With backfill: refuse if more slots were missed.")
    ] = manual.DEFAULT_BACKFILL_MAX_RUNS


class ResumeResult(BaseModel):
    schedule: Schedule
    backfilled: list[str] = Field(description="Run ids the catch-up created, oldest first.")


class TriggerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: Annotated[
        Any,
        _schema({"type": "string", "minLength": 1, "maxLength": manual.MAX_REQUEST_ID_LEN}),
        Field(description="Deduplicates: the same id again makes no second run (default: a new UUID)."),
    ] = None
    force: StrictBool = Field(
        False,
        description="Deliver the run at once even if the overlap policy would skip it (forbid) or hold it "
        "(buffer_one); replace still cancels unfinished runs. request_id still deduplicates.",
    )
    wait_s: Annotated[
        Any,
        _number(0, MAX_TRIGGER_WAIT_S, inclusive=True),
        Field(description="How long to wait for the owner's outcome (default 0)."),
    ] = 0


class TriggerResult(BaseModel):
    request_id: str
    created: bool = Field(description="False: the request id was used before; this is that request's state.")
    force: bool
    outcome: Literal["fired", "skipped", "deleted"] | None = Field(description="null: queued (no owner yet).")
    run_id: str | None


class BackfillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: Annotated[Any, WithJsonSchema({"type": "string", "format": "date-time"}), Field(description="Inclusive.")]
    until: Annotated[
        Any,
        WithJsonSchema({"type": "string", "format": "date-time"}),
        Field(description="Exclusive, not in the future."),
    ]
    dry_run: StrictBool = Field(False, description="List the runs it would create; write nothing.")
    max_runs: Annotated[
        Any, _whole(1, manual.MAX_BACKFILL_RUNS), Field(description="Refuse a range holding more slots.")
    ] = manual.DEFAULT_BACKFILL_MAX_RUNS


class BackfillResult(BaseModel):
    slots: int = Field(description="Slots of the schedule in the range.")
    created: list[str] = Field(description="Run ids created (dry_run: that would be), oldest first.")
    dry_run: bool


class ApplyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: Annotated[list[ApplyItem], Field(max_length=MAX_APPLY_ITEMS)]
    prune: StrictBool = Field(
        False,
        description="Delete the tenant's other named schedules, however they were made (jobs add --name, "
        "every jobs import line); unnamed jobs stay.",
    )
    allow_empty: StrictBool = Field(
        False,
        description="With prune and no items: delete every named schedule of the tenant "
        "(refused, 422 on items, without it).",
    )
    dry_run: StrictBool = Field(False, description="Check and report; write nothing.")


class ApplyResult(BaseModel):
    created: list[str]
    changed: list[str]
    unchanged: list[str]
    deleted: list[str]
    dry_run: bool


# ---------------------------------------------------------------- helpers


Tenant = Annotated[Principal, Depends(tenant_principal)]
NamePath = Annotated[str, Path(description="The schedule's name (one percent-encoded path segment).")]


def _invalid(exc: ValidationError, prefix: str = "") -> ApiError:
    """A 422 of a project ValidationError: ``detail`` the CLI's rule, led by this API's name
    for the field and naming this API's fields where the rule names another input
    (``API_WORDS``); ``field`` this API's name."""
    name, text = api_terms(exc)
    field = prefix + name
    detail = f"{prefix.rstrip('.')}: {text}" if prefix else text
    return ApiError(422, UNPROCESSABLE, detail, field=field)


def _not_found(name: str) -> ApiError:
    return ApiError(404, "Not Found", f"name: no schedule {clip(name)}", field="name")


def _spec(tenant: str, name: str, body: ScheduleSpec) -> JobSpec:
    """The JobSpec of a body (the CLI's builders: :meth:`DeliverySpec.build`,
    :meth:`JobSpec.build`). Raises ValidationError naming the project's field."""
    check_name_segment(name)  # first: a bad name is the error reported, whatever else is wrong
    if body.headers is not None and not isinstance(body.headers, dict):
        raise ValidationError("header", "must be an object of name → value strings", type(body.headers).__name__)
    delivery = DeliverySpec.build(
        queue=body.queue,
        url=body.url,
        method=body.method,
        headers=body.headers or None,
        timeout_s=body.timeout_s,
        payload=None if body.payload is None else _payload_text(body.payload),
        max_attempts=body.max_attempts,
        backoff_base_s=body.backoff_base_s,
        backoff_cap_s=body.backoff_cap_s,
        max_age_s=body.max_age_s,
        overlap=body.overlap,
    )
    for field, value in (("cron", body.cron), ("tz", body.tz), ("dialect", body.dialect), ("misfire", body.misfire)):
        if value is not None and not isinstance(value, str):
            raise ValidationError(field, "must be a string", value)
    spec = JobSpec.build(
        tenant=tenant,
        cron=body.cron,
        tz=body.tz,
        dialect=body.dialect,
        interval_s=body.interval_s,
        at=None if body.at is None else parse_instant(body.at, "at"),
        name=name,
        misfire=body.misfire if body.misfire is not None else DEFAULT_MISFIRE,
        catchup_window_s=body.catchup_window_s,
        misfire_grace_s=body.misfire_grace_s,
        jitter_s=0 if body.jitter_s is None else body.jitter_s,
        delivery=delivery,
    )
    if body.kind is not None and body.kind != spec.kind:
        raise ValidationError("kind", f"is {spec.kind} for the schedule given (cron, interval_s or at)", body.kind)
    return spec


def _payload_text(value: Any) -> str:
    """A payload given as a JSON value, as the JSON text :func:`targets.parse_payload` checks
    (NaN and infinities come out as the text it refuses)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        raise ValidationError(
            "payload", f"must nest arrays and objects at most {targets.MAX_PAYLOAD_DEPTH} deep"
        ) from None


def _schedule(row: dict, delivery_row: dict | None) -> Schedule:
    spec = JobSpec.from_rows(row, delivery_row)
    fields = jobs.spec_fields(spec)
    headers = fields.pop("headers")
    payload = fields.pop("payload")
    return Schedule(
        **fields,
        etag=jobs.spec_digest(spec),
        header_names=[name for name, _ in headers],
        payload=None if payload is None else json.loads(payload),
        paused=row["paused"],
        next_fire=row["next_nominal_at"],
        revision=row["revision"],
        created_at=row["created_at"],
        changed_at=row["changed_at"],
    )


def _fires(row: dict) -> list[Fire]:
    return [Fire(**fire) for fire in views.next_fires(row, views.DESCRIBE_FIRES)]


def _storable(text: str) -> bool:
    """False for text the store cannot hold (NUL, an unpaired surrogate): no row has it."""
    return not UNSTORABLE_TEXT.search(text)


def _job(conn: psycopg.Connection, tenant: str, name: str) -> dict:
    """The jobs row of the live schedule ``name`` of ``tenant``; 404 if none (a name no
    schedule can have is not looked up)."""
    if len(name) > MAX_NAME_LEN or not _storable(name):
        raise _not_found(name)
    try:
        return jobs.find_job(conn, tenant, name)
    except NotFoundError:
        raise _not_found(name) from None


def _read(conn: psycopg.Connection, tenant: str, name: str) -> tuple[dict, dict | None]:
    """The live schedule ``name`` of ``tenant``: its jobs row and job_delivery row (None: none)."""
    row = _job(conn, tenant, name)
    return row, jobs.get_delivery_row(conn, row)


def _policy(request: Request) -> AddressPolicy:
    """The save-time SSRF policy of URL targets: the app's ``push_policy`` (the
    operator's ``push_allow``; public addresses only without it)."""
    policy = request.app.state.push_policy
    assert isinstance(policy, AddressPolicy)
    return policy


_ETAG_RE = re.compile(r'\s*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*(?:,|$)')


def _etags(header: str | None, field: str) -> list[tuple[bool, str]] | Literal["*"] | None:
    """An If-Match / If-None-Match value: ``*``, or ``(weak, '"opaque"')`` pairs; None if absent.
    Raises ValidationError naming the header for a malformed value."""
    if header is None:
        return None
    if header.strip() == "*":
        return "*"
    tags: list[tuple[bool, str]] = []
    position = 0
    text = header.strip()
    while position < len(text):
        match = _ETAG_RE.match(text, position)
        if match is None:
            raise ValidationError(field, 'must be * or a comma-separated list of entity tags ("…" or W/"…")', header)
        tags.append((match.group(1) is not None, f'"{match.group(2)}"'))
        position = match.end()
    if not tags:
        raise ValidationError(field, 'must be * or a comma-separated list of entity tags ("…" or W/"…")', header)
    return tags


class _PreconditionFailed(Exception):
    def __init__(self, current: str | None) -> None:
        self.current = current


def _precondition(if_match: str | None, if_none_match: str | None) -> jobs.Precondition | None:
    """RFC 9110 §13.2.2 for a PUT: If-Match (strong comparison) first, then
    If-None-Match (weak comparison); raises _PreconditionFailed."""
    match = _etags(if_match, "If-Match")
    none_match = _etags(if_none_match, "If-None-Match")
    if match is None and none_match is None:
        return None

    def check(name: str, current: str | None) -> None:
        if match is not None:
            if current is None:
                raise _PreconditionFailed(None)
            if match != "*" and not any(not weak and tag == current for weak, tag in match):
                raise _PreconditionFailed(current)
        if none_match is not None and current is not None:
            if none_match == "*" or any(tag == current for _, tag in none_match):
                raise _PreconditionFailed(current)

    return check


def _precondition_failed(exc: _PreconditionFailed, if_match: str | None) -> ApiError:
    """The 412 of a failed precondition, with the current ``ETag`` when there is one."""
    headers = {} if exc.current is None else {"ETag": exc.current}
    detail = (
        "If-Match: the schedule does not exist"
        if exc.current is None
        else f"the schedule's current ETag is {exc.current}: the precondition failed (nothing written)"
    )
    return ApiError(
        412, "Precondition Failed", detail, field="If-Match" if if_match else "If-None-Match", headers=headers
    )


def _location(name: str) -> str:
    return "/v1/schedules/" + quote(name, safe="")


def _after(cursor: str | None) -> str | None:
    """The name a list cursor carries (:func:`decode_cursor`; 422 naming ``cursor``)."""
    key = decode_cursor(cursor)
    if key is not None and not (isinstance(key, dict) and isinstance(key.get("name"), str) and _storable(key["name"])):
        raise ValidationError("cursor", "must be a next_cursor value returned by this list", cursor)
    return None if key is None else key["name"]


ETAG_HEADER = {"ETag": {"description": "The spec's entity tag (strong).", "schema": {"type": "string"}}}
"""The ``ETag`` response header, as the OpenAPI document shows it."""


def _with_etag(description: str, **extra: Any) -> dict[str, Any]:
    """A success response carrying ``ETag`` (OpenAPI)."""
    return {"description": description, "headers": ETAG_HEADER, **extra}


def _problem(description: str) -> dict[str, Any]:
    """An error response of the OpenAPI document (problem+json)."""
    return {
        "model": Problem,
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


# ---------------------------------------------------------------- endpoints
# The POST …:action routes first (a name may contain ':'); see the module doc.


@router.post(
    "/v1/schedules:apply",
    response_model=ApplyResult,
    summary="Make the tenant's schedules match a set (one transaction)",
    responses={
        422: _problem(
            "A bad item (field items[i].<field>), no items with prune but not allow_empty (field items), "
            "or the quota (field max_schedules)."
        )
    },
)
def apply_schedules(body: ApplyRequest, request: Request, principal: Tenant) -> ApplyResult:
    """Create, change (in place) or leave each item; with ``prune``, delete the
    tenant's other named schedules (no items: only with ``allow_empty``);
    ``dry_run``: write nothing. All or nothing."""
    specs = []
    policy = _policy(request)
    for index, item in enumerate(body.items):
        try:
            specs.append(_spec(principal.tenant, item.name, item))
        except ValidationError as exc:
            raise _invalid(exc, f"items[{index}].") from None
    try:
        with db(request) as conn:
            report = jobs.apply_jobs(
                conn,
                principal.tenant,
                specs,
                prune=body.prune,
                allow_empty=body.allow_empty,
                dry_run=body.dry_run,
                push_policy=policy,
            )
    except ValidationError as exc:
        raise _invalid(exc, "" if exc.item is None else f"items[{exc.item}].") from None
    return ApplyResult(
        created=report.created,
        changed=report.changed,
        unchanged=report.unchanged,
        deleted=report.deleted,
        dry_run=report.dry_run,
    )


@contextlib.contextmanager
def _errors(name: str) -> Iterator[None]:
    """The project's errors inside as this API's: ValidationError → 422 naming the body
    field, NotFoundError (the schedule went away meanwhile) → 404 of ``name``."""
    try:
        yield
    except ValidationError as exc:
        raise _invalid(exc) from None
    except NotFoundError:
        raise _not_found(name) from None


@router.post(
    "/v1/schedules/{name:path_name}:pause",
    response_model=Schedule,
    summary="Pause a schedule",
    responses={200: _with_etag("The schedule, paused.")},
)
def pause_schedule(name: NamePath, request: Request, response: Response, principal: Tenant) -> Schedule:
    """No slot fires while paused (a due pending slot is recorded as skipped, reason paused).
    Pausing a paused schedule changes nothing."""
    with db(request) as conn, _errors(name):
        row = _job(conn, principal.tenant, name)
        jobs.set_paused(conn, row["job_id"], True, tenant=principal.tenant)
        schedule = _schedule(*_read(conn, principal.tenant, name))
    response.headers["ETag"] = schedule.etag
    return schedule


@router.post(
    "/v1/schedules/{name:path_name}:resume",
    response_model=ResumeResult,
    summary="Resume a schedule",
    responses={200: _with_etag("The schedule, resumed, and the runs of its catch-up.")},
)
def resume_schedule(
    name: NamePath,
    request: Request,
    response: Response,
    principal: Tenant,
    body: Annotated[ResumeRequest | None, Body()] = None,
) -> ResumeResult:
    """The next slot is the first strictly after now. ``catch_up``: ``none`` (the slots
    missed while paused never run) or ``backfill`` (a run each, origin backfill)."""
    body = body or ResumeRequest()
    with db(request) as conn, _errors(name):
        max_runs = _max_runs(body.max_runs)
        row = _job(conn, principal.tenant, name)
        result = manual.resume(conn, row["job_id"], catch_up=body.catch_up, max_runs=max_runs, tenant=principal.tenant)
        schedule = _schedule(*_read(conn, principal.tenant, name))
    response.headers["ETag"] = schedule.etag
    created = [] if result is None else [RunKey.of(row["job_id"], t).run_id for t in result.created]
    return ResumeResult(schedule=schedule, backfilled=created)


@router.post(
    "/v1/schedules/{name:path_name}:trigger",
    response_model=TriggerResult,
    summary="Run a schedule now, once",
    responses={202: {"model": TriggerResult, "description": "Queued: no partition owner carried it out yet."}},
)
def trigger_schedule(
    name: NamePath,
    request: Request,
    response: Response,
    principal: Tenant,
    body: Annotated[TriggerRequest | None, Body()] = None,
) -> TriggerResult:
    """A manual run (nominal time = the store's now) carried out by the job's partition
    owner; ``request_id`` deduplicates as ``jobs trigger`` does (the same id again
    returns the first request's state, ``created`` false). 200 with the outcome,
    202 while queued (``wait_s`` seconds waited, default 0)."""
    body = body or TriggerRequest()
    with _errors(name):
        wait_s = _wait(body.wait_s)
        with db(request) as conn:
            row = _job(conn, principal.tenant, name)
            made = manual.request_run(conn, row["job_id"], body.request_id, force=body.force, tenant=principal.tenant)
        # The wait borrows a pooled connection per read only.
        done = manual.wait_request(lambda: db(request), made, wait_s) if wait_s > 0 else made
    if done.outcome is None:
        response.status_code = 202
    return TriggerResult(
        request_id=done.request_id, created=done.created, force=done.force, outcome=done.outcome, run_id=done.run_id
    )


def _max_runs(value: Any) -> int:
    """``max_runs`` of backfill and resume, as ``jobs backfill --max-runs`` parses it."""
    return parse_whole(
        "max_runs",
        value,
        minimum=1,
        maximum=manual.MAX_BACKFILL_RUNS,
        rule=f"must be a whole number from 1 to {manual.MAX_BACKFILL_RUNS} in ASCII digits",
    )


def _wait(value: Any) -> float:
    rule = f"must be a number of seconds from 0 to {MAX_TRIGGER_WAIT_S:g}"
    number = parse_decimal("wait_s", value, rule=rule)
    if not 0 <= number <= MAX_TRIGGER_WAIT_S:
        raise ValidationError("wait_s", rule, value)
    return number


@router.post("/v1/schedules/{name:path_name}:backfill", response_model=BackfillResult, summary="Backfill a past range")
def backfill_schedule(name: NamePath, body: BackfillRequest, request: Request, principal: Tenant) -> BackfillResult:
    """A run (origin backfill) for each slot of the schedule in ``[since, until)`` that
    has none, in one transaction; bounded by ``max_runs`` (refused beyond, nothing
    written); ``dry_run`` lists what it would create."""
    with db(request) as conn, _errors(name):
        since = parse_instant(body.since, "since")
        until = parse_instant(body.until, "until")
        max_runs = _max_runs(body.max_runs)
        row = _job(conn, principal.tenant, name)
        result = manual.backfill(
            conn, row["job_id"], since, until, max_runs=max_runs, dry_run=body.dry_run, tenant=principal.tenant
        )
    return BackfillResult(
        slots=len(result.slots),
        created=[RunKey.of(row["job_id"], t).run_id for t in result.created],
        dry_run=result.dry_run,
    )


@router.get("/v1/schedules", response_model=SchedulePage, summary="List the tenant's schedules")
def list_schedules(
    request: Request,
    principal: Tenant,
    limit: Annotated[int, Depends(page_size)],
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page.")] = None,
    paused: Annotated[bool | None, Query(description="Only paused (true) or running (false) ones.")] = None,
    kind: Annotated[Literal["cron", "interval", "once"] | None, Query()] = None,
    queue: Annotated[str | None, Query(description="Only those whose target is this queue.")] = None,
    name_prefix: Annotated[
        str | None, Query(min_length=1, max_length=MAX_NAME_LEN, description="Only names starting with this (literal).")
    ] = None,
) -> SchedulePage:
    """Named live schedules by name, ``limit`` per page; ``next_cursor`` null on the last page."""
    after = _after(cursor)
    if queue is not None:
        targets.validate_queue(queue)
    if name_prefix is not None and not _storable(name_prefix):
        raise ValidationError("name_prefix", "must not contain NUL or unpaired surrogates", name_prefix)
    with db(request) as conn:
        rows = jobs.list_schedules(
            conn,
            principal.tenant,
            after=after,
            limit=limit + 1,
            paused=paused,
            kind=kind,
            queue=queue,
            name_prefix=name_prefix,
        )
    page, next_cursor = page_of(rows, limit, lambda row: {"name": row["name"]})
    return SchedulePage(items=[_schedule(row, jobs.delivery_columns(row)) for row in page], next_cursor=next_cursor)


@router.get(
    "/v1/schedules/{name:path_name}",
    response_model=Description,
    summary="Describe a schedule",
    responses={200: _with_etag("The schedule described.")},
)
def get_schedule(name: NamePath, request: Request, response: Response, principal: Tenant) -> Description:
    """As ``jobs describe``: the spec, the next 10 fires, the last 10 runs (state,
    attempts, lateness, dispatch lag) and counters. ``ETag``: the spec's."""
    with db(request) as conn, _errors(name):
        row = _job(conn, principal.tenant, name)
        described = views.describe_job(conn, row["job_id"], tenant=principal.tenant)
        if described["job"]["deleted_at"] is not None:
            raise _not_found(name)
        delivery_row = jobs.get_delivery_row(conn, described["job"])
    schedule = _schedule(described["job"], delivery_row)
    response.headers["ETag"] = schedule.etag
    counters = described["counters"]
    return Description(
        schedule=schedule,
        next_fires=[Fire(**fire) for fire in described["next_fires"]],
        recent_runs=[
            Run(**{key: run.get(key) for key in Run.model_fields} | {"id": run["run_id"]})
            for run in described["recent_runs"]
        ],
        counters=Counters(
            runs=counters["runs"],
            in_flight=counters["in_flight"],
            skips={reason: SkipCount(**value) for reason, value in counters["skips"].items()},
        ),
    )


@router.put(
    "/v1/schedules/{name:path_name}",
    response_model=PutResult,
    summary="Create or replace a schedule (idempotent)",
    responses={
        200: _with_etag("Replaced, or unchanged (nothing written)."),
        201: _with_etag(
            "Created.",
            model=PutResult,
            headers={**ETAG_HEADER, "Location": {"description": "The schedule's URL.", "schema": {"type": "string"}}},
        ),
        412: _problem("If-Match / If-None-Match failed (nothing written); ETag: the current one."),
        422: _problem("A bad field (named), or the quota (field max_schedules)."),
    },
)
def put_schedule(
    name: NamePath,
    body: ScheduleSpec,
    request: Request,
    response: Response,
    principal: Tenant,
    if_match: Annotated[str | None, Header(description="Entity tags the current spec must match, or *.")] = None,
    if_none_match: Annotated[str | None, Header(description="* (create only) or tags it must not match.")] = None,
) -> PutResult:
    """Upsert the full spec. 201 created, 200 replaced (in place: revision bumped) or
    unchanged (nothing written). ``ETag`` of the stored spec; next 10 fires."""
    policy = _policy(request)
    try:
        spec = _spec(principal.tenant, name, body)
        precondition = _precondition(if_match, if_none_match)
        with db(request) as conn:
            report = jobs.apply_jobs(
                conn,
                principal.tenant,
                [spec],
                precondition=precondition,
                push_policy=policy,
            )
    except ValidationError as exc:
        raise _invalid(exc) from None
    except _PreconditionFailed as exc:
        raise _precondition_failed(exc, if_match) from None
    row, delivery_row = report.stored[name]
    schedule = _schedule(row, delivery_row)
    outcome = "created" if report.created else "replaced" if report.changed else "unchanged"
    response.headers["ETag"] = schedule.etag
    if outcome == "created":
        response.status_code = 201
        response.headers["Location"] = _location(name)
    return PutResult(outcome=outcome, schedule=schedule, next_fires=_fires(row))


@router.delete(
    "/v1/schedules/{name:path_name}",
    status_code=204,
    response_class=Response,
    summary="Delete a schedule",
    responses={412: _problem("If-Match / If-None-Match failed (nothing deleted); ETag: the current one.")},
)
def delete_schedule(
    name: NamePath,
    request: Request,
    principal: Tenant,
    if_match: Annotated[str | None, Header(description="Entity tags the current spec must match, or *.")] = None,
    if_none_match: Annotated[str | None, Header(description="Tags it must not match (* always fails).")] = None,
) -> Response:
    """It stops firing at once; its runs stay (a due pending slot is recorded as skipped,
    reason deleted). ``If-Match`` / ``If-None-Match`` as for PUT (412, nothing deleted)."""
    try:
        with db(request) as conn, _errors(name):
            precondition = _precondition(if_match, if_none_match)
            row = _job(conn, principal.tenant, name)
            jobs.delete_job(conn, row["job_id"], tenant=principal.tenant, precondition=precondition)
    except _PreconditionFailed as exc:
        raise _precondition_failed(exc, if_match) from None
    return Response(status_code=204)


__all__ = ["router", "FIELD_NAMES"]
