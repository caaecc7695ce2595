"""``/v1/runs…``: list, claim, heartbeat, ack, nack, redrive, cancel over HTTP (docs/api.md, "Runs and workers").

Every endpoint is a thin shell over the store layer the CLI and the Python
worker use (:mod:`scheduler.delivery.lifecycle`, :mod:`scheduler.delivery.views`,
:func:`scheduler.jobs.list_runs`), with the key's tenant passed into each
statement's WHERE clause: another tenant's run is exactly a missing one
(404 for a single run, ``lost`` in a batch).

* ``GET /v1/runs`` (tenant keys): newest nominal time first, filters
  ``schedule`` (a live schedule's name), ``state``, ``since``/``until``
  (nominal time, ``since`` ≤ t < ``until``); cursor paging.
* ``POST /v1/runs:claim`` (worker or tenant keys): lease up to ``max`` runs
  of the key's tenant's ``queue`` (the tenant is never a body field).
* ``POST /v1/runs:heartbeat|:ack|:nack`` (worker or tenant keys): batches of
  up to 1,000 ``(id, lease_token)``; ``results`` answer each run in input
  order as the lifecycle does: ``leased`` / ``succeeded`` / ``failed``, or
  refused (nothing changed): ``canceled`` (the run was canceled while the
  token held it) or ``lost`` (the token no longer holds the run, it
  finished, or there is no such run of the key's tenant).
* ``POST /v1/runs/{id}:heartbeat|:ack|:nack`` (worker or tenant keys): one
  run; refused is 409 (``canceled`` or a stale token), 404 for a run the
  key's tenant does not have.
* ``POST /v1/runs/{id}:redrive`` (tenant keys): a dead or canceled run of a
  live schedule back to pending (409 naming the state otherwise, or naming the
  job for a run of a deleted schedule).
* ``POST /v1/runs/{id}:cancel`` (tenant keys): an unfinished run (pending,
  leased, failed) ends canceled; its token answers ``canceled`` from then on
  (409 naming the state for a finished run).

Run ids are ``<job id>.<nominal time in Unix microseconds>``
(:class:`~scheduler.delivery.lifecycle.RunKey`); a malformed one is a 422
naming ``id``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import psycopg
from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from scheduler.api.deps import (
    Principal,
    db,
    decode_cursor,
    encode_cursor,
    page_size,
    tenant_principal,
    worker_principal,
)
from scheduler.api.errors import PROBLEM_JSON, ApiError, Problem, pattern
from scheduler.api.inputs import JsonRoute
from scheduler.delivery import lifecycle, views
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.worker import ERROR_MAX_CHARS
from scheduler.errors import ValidationError

router = APIRouter(tags=["runs"], route_class=JsonRoute)

RUN_ID_RULE = "must be <job id>.<nominal time in Unix microseconds> (a run's id as a claim returned it)"
RUN_ID_PATTERN = pattern(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.(0|-?[1-9][0-9]{0,16})$", RUN_ID_RULE
)
"""A run id as the API writes it: the job id (lowercase UUID), a dot, the nominal time in Unix microseconds
(negative before 1970; no leading zero, no ``-0``: a run has one id)."""
QUEUE_PATTERN = pattern(r"^[A-Za-z0-9._-]{1,100}$", "must be 1-100 characters of letters, digits and . _ -")
SCHEDULE_NAME_MAX = 200
WORKER_LABEL_MAX = 100
"""Longest ``worker`` label a claim may give (``runs.worker`` is ``api:<key id>:<label>``)."""
MAX_RETRY_AFTER_S = 86_400 * 30

RunState = Literal["pending", "leased", "failed", "succeeded", "dead", "canceled"]
LeaseAnswer = Literal["leased", "canceled", "lost"]
AckAnswer = Literal["succeeded", "canceled", "lost"]
NackAnswer = Literal["failed", "canceled", "lost"]

RunId = Annotated[
    str,
    Path(
        description="The run id: `<job id>.<nominal time in Unix microseconds>`, as claims and lists give it.",
        pattern=RUN_ID_PATTERN,
        max_length=80,
    ),
]

_PROBLEM = {"model": Problem, "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        **_PROBLEM,
        "description": "Refused, nothing changed: the token no longer holds the run, or it was canceled "
        "(redrive: the run is not dead or canceled, or its schedule was deleted; cancel: the run is finished).",
    }
}
"""The one error the run endpoints add to the app's common ones (401, 403, 404, 413, 422, 429)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- models


class RunOut(BaseModel):
    """One run as ``GET /v1/runs`` lists it. Times are UTC; ``lateness_s`` = fired − scheduled."""

    id: str = Field(description="`<job id>.<nominal time in Unix microseconds>`.")
    schedule: str | None = Field(
        description="The schedule's name, as recorded on the run when it was fired (null if it had none)."
    )
    job_id: uuid.UUID
    queue: str | None = Field(description="The queue workers claim it from (null: pushed to an HTTP target).")
    state: RunState | None = Field(description="Delivery state (null: fired before delivery existed).")
    origin: str | None = Field(description="schedule, manual or backfill.")
    attempt: int = Field(description="Attempts claimed so far (0 before the first claim).")
    nominal_time: datetime
    scheduled_at: datetime = Field(description="Nominal time plus the schedule's jitter.")
    fired_at: datetime | None
    available_at: datetime | None = Field(description="Earliest next claim (pending) or retry (failed).")
    leased_until: datetime | None
    first_claimed_at: datetime | None
    finished_at: datetime | None
    last_error: str | None = Field(
        description="Why the last attempt failed, or why the run was canceled; null if none did, "
        "and once the run succeeded (the ack clears it)."
    )
    lateness_s: float | None
    worker: str | None = Field(
        description="Who made the last claim: `api:<key id>` or `api:<key id>:<label>` (the claim's `worker`) "
        "for an HTTP worker, `<host>:<pid>` for `scheduler worker`, the node id for a push "
        "(null: never claimed, or redriven since)."
    )


class RunPage(BaseModel):
    """A page of runs, newest nominal time first; ``next_cursor`` null on the last page."""

    items: list[RunOut]
    next_cursor: str | None


class ClaimIn(_Strict):
    """What a worker asks for: up to ``max`` runs of ``queue``, each leased ``lease_s`` seconds."""

    queue: str = Field("default", pattern=QUEUE_PATTERN, description="The queue of the key's tenant.")
    max: int = Field(1, ge=1, le=lifecycle.MAX_BATCH, strict=True, description="Most runs to lease.")
    lease_s: float = Field(
        lifecycle.DEFAULT_LEASE_S,
        ge=lifecycle.MIN_LEASE_S,
        le=lifecycle.MAX_LEASE_S,
        allow_inf_nan=False,
        strict=True,
        description="Lease of each attempt, seconds; heartbeats extend it.",
    )
    worker: str | None = Field(
        None,
        max_length=WORKER_LABEL_MAX,
        pattern=pattern(r"^[\x21-\x7e]+$", "must be printable ASCII without spaces"),
        description="A label of the claiming process (printable ASCII, no spaces), kept in the run as "
        "`api:<key id>:<label>`.",
    )


class ClaimedRun(BaseModel):
    """One attempt handed to a worker: ack or nack it with ``lease_token`` before ``leased_until``
    (or heartbeat to extend)."""

    id: str
    schedule: str | None = Field(description="The schedule's name when the run was fired (null if it had none).")
    job_id: uuid.UUID
    tenant: str
    queue: str
    origin: str | None
    nominal_time: datetime
    scheduled_at: datetime
    attempt: int = Field(description="1 on the first delivery; at least once: make the handler idempotent on `id`.")
    payload: Any = Field(None, description="The schedule's JSON payload (null without one).")
    lease_token: uuid.UUID
    leased_until: datetime
    claimed_at: datetime


class ClaimOut(BaseModel):
    """The runs leased, oldest nominal time first; empty when none is available."""

    runs: list[ClaimedRun]


class LeaseIn(_Strict):
    """A run and the lease token its claim returned."""

    id: str = Field(pattern=RUN_ID_PATTERN, max_length=80)
    lease_token: uuid.UUID


class NackIn(LeaseIn):
    """A failed attempt: ``retryable`` false makes the run dead; ``retry_after_s`` is the earliest retry."""

    error: str | None = Field(None, max_length=ERROR_MAX_CHARS, description="Kept as the run's last_error.")
    retryable: bool = Field(True, strict=True)
    retry_after_s: float | None = Field(None, ge=0, le=MAX_RETRY_AFTER_S, allow_inf_nan=False, strict=True)


class HeartbeatBatchIn(_Strict):
    lease_s: float = Field(
        lifecycle.DEFAULT_LEASE_S, ge=lifecycle.MIN_LEASE_S, le=lifecycle.MAX_LEASE_S, allow_inf_nan=False, strict=True
    )
    runs: list[LeaseIn] = Field(max_length=lifecycle.MAX_BATCH)


class AckBatchIn(_Strict):
    runs: list[LeaseIn] = Field(max_length=lifecycle.MAX_BATCH)


class NackBatchIn(_Strict):
    runs: list[NackIn] = Field(max_length=lifecycle.MAX_BATCH)


class HeartbeatResult(BaseModel):
    id: str
    answer: LeaseAnswer


class AckResult(BaseModel):
    id: str
    answer: AckAnswer


class NackResult(BaseModel):
    id: str
    answer: NackAnswer


class HeartbeatBatchOut(BaseModel):
    """One answer per run, in input order."""

    results: list[HeartbeatResult]


class AckBatchOut(BaseModel):
    """One answer per run, in input order."""

    results: list[AckResult]


class NackBatchOut(BaseModel):
    """One answer per run, in input order."""

    results: list[NackResult]


class HeartbeatIn(_Strict):
    lease_token: uuid.UUID
    lease_s: float = Field(
        lifecycle.DEFAULT_LEASE_S, ge=lifecycle.MIN_LEASE_S, le=lifecycle.MAX_LEASE_S, allow_inf_nan=False, strict=True
    )


class AckIn(_Strict):
    lease_token: uuid.UUID


class NackOneIn(_Strict):
    lease_token: uuid.UUID
    error: str | None = Field(None, max_length=ERROR_MAX_CHARS)
    retryable: bool = Field(True, strict=True)
    retry_after_s: float | None = Field(None, ge=0, le=MAX_RETRY_AFTER_S, allow_inf_nan=False, strict=True)


class RedriveOut(BaseModel):
    """The run redriven: pending, available now, attempt 0."""

    id: str
    state: Literal["pending"]


class CancelOut(BaseModel):
    """The run canceled: finished, its lease token refused from now on."""

    id: str
    state: Literal["canceled"]


# ---------------------------------------------------------------- helpers


def _key(text: str, field: str = "id") -> RunKey:
    """The run ``text`` names; ValidationError (``field``) in the API's words otherwise (a time
    out of range passes :data:`RUN_ID_PATTERN`; :meth:`RunKey.parse`'s rule names the CLI)."""
    try:
        return RunKey.parse(text, field)
    except ValidationError:
        raise ValidationError(field, RUN_ID_RULE, text) from None


def _cursor_key(cursor: str | None) -> RunKey | None:
    """The last run of the previous page a cursor names (its run id); ValidationError (``cursor``) otherwise."""
    value = decode_cursor(cursor)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError("cursor", "must be a next_cursor value returned by this list", cursor)
    try:
        return RunKey.parse(value, "cursor")
    except ValidationError:
        raise ValidationError("cursor", "must be a next_cursor value returned by this list", cursor) from None


def _run_out(row: dict[str, Any]) -> RunOut:
    return RunOut(
        id=row["run_id"],
        schedule=row["job_name"],
        job_id=row["job_id"],
        queue=row["queue"],
        state=row["state"],
        origin=row["origin"],
        attempt=row["attempt"],
        nominal_time=row["nominal_time"],
        scheduled_at=row["scheduled_at"],
        fired_at=row["fired_at"],
        available_at=row["available_at"],
        leased_until=row["leased_until"],
        first_claimed_at=row["first_claimed_at"],
        finished_at=row["finished_at"],
        last_error=row["last_error"],
        lateness_s=row["lateness_s"],
        worker=row["worker"],
    )


def _claimed_out(c: lifecycle.Claimed) -> ClaimedRun:
    # model_construct: the values come from the store's typed columns, already what the model says
    return ClaimedRun.model_construct(
        id=c.run_id,
        schedule=c.job_name,
        job_id=c.job_id,
        tenant=c.tenant,
        queue=c.queue or "",
        origin=c.origin,
        nominal_time=c.nominal_time,
        scheduled_at=c.scheduled_at,
        attempt=c.attempt,
        payload=c.payload,
        lease_token=c.token,
        leased_until=c.leased_until,
        claimed_at=c.claimed_at,
    )


def _tenant(principal: Principal) -> str:
    if principal.tenant is None:  # only admin keys have none, and no route here admits them
        raise ApiError(403, "Forbidden", "role: an admin key has no tenant's runs")
    return principal.tenant


def _batch_keys(runs: list[LeaseIn] | list[NackIn]) -> list[RunKey]:
    """The runs' keys in input order; ValidationError (``runs[i].id``) for a malformed id or one
    given twice (two answers for one run could not both be true)."""
    keys: list[RunKey] = []
    seen: set[RunKey] = set()
    for i, item in enumerate(runs):
        key = _key(item.id, f"runs[{i}].id")
        if key in seen:
            raise ValidationError(f"runs[{i}].id", "must name each run at most once per call", item.id)
        seen.add(key)
        keys.append(key)
    return keys


def _leases(keys: list[RunKey], runs: list[LeaseIn]) -> list[tuple[RunKey, uuid.UUID]]:
    return [(k, item.lease_token) for k, item in zip(keys, runs, strict=True)]


def _batch(
    runs: list[LeaseIn] | list[NackIn],
    principal: Principal,
    conn_cm: Any,
    call: Callable[[psycopg.Connection, list[RunKey], str], dict[str, str]],
) -> list[dict[str, str]]:
    """A batch form's results: ``call(conn, keys, tenant)`` (the lifecycle's answers by run id)
    answered for every run, in input order (``lost`` when the lifecycle gave none)."""
    keys, tenant = _batch_keys(runs), _tenant(principal)
    if not keys:
        return []
    with conn_cm as conn:
        answers = call(conn, keys, tenant)
    return [{"id": k.run_id, "answer": answers.get(k.run_id, "lost")} for k in keys]


def _one(
    run_id: str,
    principal: Principal,
    conn_cm: Any,
    call: Callable[[psycopg.Connection, RunKey, str], dict[str, str]],
    done: str,
    verb: str,
) -> dict[str, str]:
    """A single form's answer: ``call(conn, key, tenant)``; 200 ``{"id", "answer"}`` when the
    answer is ``done``; 404 for a run the tenant does not have; 409 for a refusal (canceled,
    or a token that no longer holds the run)."""
    key, tenant = _key(run_id), _tenant(principal)
    with conn_cm as conn:
        answer = call(conn, key, tenant).get(key.run_id, "lost")
        if answer == done:
            return {"id": key.run_id, "answer": answer}
        if answer == "canceled":
            raise ApiError(
                409,
                "Conflict",
                f"lease_token: refused (canceled): run {key.run_id} was canceled while this token held it; "
                f"stop working on it (the {verb} changed nothing)",
                field="lease_token",
            )
        exists, state = views.run_state(conn, key, tenant=tenant)
    if not exists:
        raise ApiError(404, "Not Found", f"id: no run {key.run_id}", field="id")
    raise ApiError(
        409,
        "Conflict",
        f"lease_token: refused (lost): this token no longer holds run {key.run_id} "
        f"({'it has no delivery state' if state is None else f'it is {state}'}: another attempt holds it, "
        f"or it finished); the {verb} changed nothing",
        field="lease_token",
    )


# ---------------------------------------------------------------- list


@router.get(
    "/v1/runs",
    response_model=RunPage,
    summary="List the tenant's runs",
)
def list_runs(
    principal: Annotated[Principal, Depends(tenant_principal)],
    limit: Annotated[int, Depends(page_size)],
    conn_cm: Annotated[Any, Depends(db)],
    schedule: Annotated[
        str | None, Query(min_length=1, max_length=SCHEDULE_NAME_MAX, description="Only this schedule's runs.")
    ] = None,
    state: Annotated[RunState | None, Query(description="Only runs in this delivery state.")] = None,
    since: Annotated[
        AwareDatetime | None, Query(description="Nominal time at or after (ISO 8601 with offset).")
    ] = None,
    until: Annotated[AwareDatetime | None, Query(description="Nominal time before (ISO 8601 with offset).")] = None,
    cursor: Annotated[
        str | None,
        Query(
            max_length=2048,
            pattern=pattern(r"^[A-Za-z0-9_-]+$", "must be the next_cursor of the previous page"),
            description="`next_cursor` of the previous page.",
        ),
    ] = None,
) -> RunPage:
    """Runs of the key's tenant, newest nominal time first (ties by job id), ``limit`` a page;
    an empty window (``until`` not after ``since``) is a 422 naming ``until``."""
    if since is not None and until is not None and until <= since:
        raise ValidationError("until", "must be later than since", until)
    after = _cursor_key(cursor)
    tenant = _tenant(principal)
    with conn_cm as conn:
        rows = views.list_tenant_runs(
            conn, tenant, limit=limit + 1, job_name=schedule, state=state, since=since, until=until, after=after
        )
    items = [_run_out(row) for row in rows[:limit]]
    next_cursor = encode_cursor(items[-1].id) if len(rows) > limit else None
    return RunPage(items=items, next_cursor=next_cursor)


# ---------------------------------------------------------------- claim


@router.post(
    "/v1/runs:claim",
    response_model=ClaimOut,
    summary="Lease runs of a queue",
)
def claim_runs(
    body: ClaimIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> Response:
    """Lease up to ``max`` pending runs of the key's tenant's ``queue`` available now, oldest
    available first; each gets attempt + 1 and a new ``lease_token``."""
    tenant = _tenant(principal)
    label = f"api:{principal.key_id}" + (f":{body.worker}" if body.worker else "")
    with conn_cm as conn:
        claimed = lifecycle.claim(
            conn, tenant=tenant, queue=body.queue, worker=label, limit=body.max, lease_s=body.lease_s
        )
    # Serialized here in one call: returning the model made FastAPI validate all 1,000 runs
    # again and encode them field by field, ~2x the CPU of the claim's whole HTTP cost
    # (docs/api.md, "Why this framework"); response_model still gives the schema.
    out = ClaimOut.model_construct(runs=[_claimed_out(c) for c in claimed])
    return Response(out.model_dump_json(), media_type="application/json")


# ---------------------------------------------------------------- batches


@router.post(
    "/v1/runs:heartbeat",
    response_model=HeartbeatBatchOut,
    summary="Extend the leases of runs",
)
def heartbeat_runs(
    body: HeartbeatBatchIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> dict[str, Any]:
    """Extend each lease to now + ``lease_s``: ``leased``, or ``canceled`` / ``lost`` (stop working on it)."""
    return {
        "results": _batch(
            body.runs,
            principal,
            conn_cm,
            lambda c, keys, t: lifecycle.heartbeat(c, _leases(keys, body.runs), body.lease_s, tenant=t),
        )
    }


@router.post(
    "/v1/runs:ack",
    response_model=AckBatchOut,
    summary="Record attempts that succeeded",
)
def ack_runs(
    body: AckBatchIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> dict[str, Any]:
    """``succeeded`` (also for an ack re-sent with the token that already succeeded), or refused."""
    return {
        "results": _batch(
            body.runs, principal, conn_cm, lambda c, keys, t: lifecycle.ack(c, _leases(keys, body.runs), tenant=t)
        )
    }


def _nack(key: RunKey, token: uuid.UUID, item: NackIn | NackOneIn) -> lifecycle.Nack:
    return lifecycle.Nack(key.run_id, token, item.error, item.retryable, item.retry_after_s)


@router.post(
    "/v1/runs:nack",
    response_model=NackBatchOut,
    summary="Record attempts that failed",
)
def nack_runs(
    body: NackBatchIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> dict[str, Any]:
    """``failed`` (the partition owner then retries it after a backoff, or makes it dead), or refused."""

    def nack(c: psycopg.Connection, keys: list[RunKey], t: str) -> dict[str, str]:
        fails = [_nack(k, item.lease_token, item) for k, item in zip(keys, body.runs, strict=True)]
        return lifecycle.nack(c, fails, tenant=t)

    return {"results": _batch(body.runs, principal, conn_cm, nack)}


# ---------------------------------------------------------------- one run


@router.post(
    "/v1/runs/{id}:heartbeat",
    response_model=HeartbeatResult,
    summary="Extend one run's lease",
    responses=_CONFLICT,
)
def heartbeat_run(
    id: RunId,  # noqa: A002 - the documented path parameter
    body: HeartbeatIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> dict[str, str]:
    """Extend the lease to now + ``lease_s``; 409 if the token no longer holds the run or it was canceled."""

    def heartbeat(c: psycopg.Connection, key: RunKey, t: str) -> dict[str, str]:
        return lifecycle.heartbeat(c, [(key, body.lease_token)], body.lease_s, tenant=t)

    return _one(id, principal, conn_cm, heartbeat, "leased", "heartbeat")


@router.post(
    "/v1/runs/{id}:ack",
    response_model=AckResult,
    summary="Record one attempt that succeeded",
    responses=_CONFLICT,
)
def ack_run(
    id: RunId,  # noqa: A002
    body: AckIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> dict[str, str]:
    """The run ends ``succeeded``; 409 if the token no longer holds it or it was canceled."""

    def ack(c: psycopg.Connection, key: RunKey, t: str) -> dict[str, str]:
        return lifecycle.ack(c, [(key, body.lease_token)], tenant=t)

    return _one(id, principal, conn_cm, ack, "succeeded", "ack")


@router.post(
    "/v1/runs/{id}:nack",
    response_model=NackResult,
    summary="Record one attempt that failed",
    responses=_CONFLICT,
)
def nack_run(
    id: RunId,  # noqa: A002
    body: NackOneIn,
    principal: Annotated[Principal, Depends(worker_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> dict[str, str]:
    """The attempt ends ``failed``; 409 if the token no longer holds the run or it was canceled."""

    def nack(c: psycopg.Connection, key: RunKey, t: str) -> dict[str, str]:
        return lifecycle.nack(c, [_nack(key, body.lease_token, body)], tenant=t)

    return _one(id, principal, conn_cm, nack, "failed", "nack")


@router.post(
    "/v1/runs/{id}:redrive",
    response_model=RedriveOut,
    summary="Move a dead or canceled run back to pending",
    responses=_CONFLICT,
)
def redrive_run(
    id: RunId,  # noqa: A002
    principal: Annotated[Principal, Depends(tenant_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> RedriveOut:
    """Pending again, available now, attempt 0 and a fresh retry budget (``last_error`` kept until an
    attempt succeeds); 409 naming the state for a run that is not dead or canceled, or naming the job for
    a run of a deleted schedule (nothing changed)."""
    tenant = _tenant(principal)
    _key(id)  # refused in the API's words before views.redrive parses it (in the CLI's)
    with conn_cm as conn:
        done = views.redrive(conn, id, tenant=tenant, field="id")
    return RedriveOut(id=done, state="pending")


@router.post(
    "/v1/runs/{id}:cancel",
    response_model=CancelOut,
    summary="Cancel an unfinished run",
    responses=_CONFLICT,
)
def cancel_run(
    id: RunId,  # noqa: A002
    principal: Annotated[Principal, Depends(tenant_principal)],
    conn_cm: Annotated[Any, Depends(db)],
) -> CancelOut:
    """A pending, leased or failed run ends ``canceled`` now: a pending one is never claimed or pushed,
    a leased one's worker hears ``canceled`` at its next heartbeat and its ack is refused (``last_error``:
    ``canceled by an API key <key id>``); 409 naming the state for a finished run (nothing changed).
    A canceled run can be redriven."""
    tenant = _tenant(principal)
    _key(id)  # refused in the API's words before views.cancel parses it (in the CLI's)
    with conn_cm as conn:
        done = views.cancel(conn, id, tenant=tenant, field="id", by=f"an API key {principal.key_id}")
    return CancelOut(id=done, state="canceled")
