"""Admin endpoints (admin keys only; docs/api.md, "Admin"): tenants, keys, status, verify.

Each calls the function the CLI command calls (:mod:`scheduler.jobs`,
:mod:`scheduler.api.keys`, :func:`scheduler.status.cluster_status`,
:func:`scheduler.audit.verify`), so inputs, errors and results are the CLI's:

* ``GET /v1/tenants`` (paged), ``POST /v1/tenants`` (as ``tenants add``; 409
  if it exists), ``PATCH /v1/tenants/{tenant}`` (as ``tenants set``: weight,
  rate cap, schedule quota); a write answers the tenant as the list shows it;
* ``GET /v1/keys`` (paged, ``?tenant=``), ``POST /v1/keys`` (as ``keys
  create``: the token is in this response only), ``POST
  /v1/keys/{key_id}:revoke`` (as ``keys revoke``);
* ``GET /v1/status`` (as ``scheduler status --json``);
* ``GET /v1/verify`` (as ``scheduler verify --json [--delivery]``) over a
  window of at most :data:`MAX_VERIFY_WINDOW_S` (a day: the audit runs
  within one request's statement timeout; the CLI audits longer ones).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from scheduler import jobs, status, store
from scheduler.api import keys as keys_mod
from scheduler.api.deps import Principal, admin_principal, db, decode_cursor, page_of, page_size
from scheduler.api.errors import pattern
from scheduler.api.inputs import JsonRoute
from scheduler.errors import ConflictError, ValidationError
from scheduler.schedule import format_instant, parse_instant
from scheduler.settings import MAX_FLEET_TIMING_S, Settings
from scheduler.spec import validate_tenant

router = APIRouter(tags=["admin"], route_class=JsonRoute)

MAX_VERIFY_WINDOW_S = 86_400
"""Longest ``/v1/verify`` window (seconds)."""

MAX_VERIFY_LIST = 1000
"""Most findings of each kind ``/v1/verify`` lists."""

Admin = Annotated[Principal, Depends(admin_principal)]


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO 8601 UTC ``Z`` text and UUIDs as strings (dicts, lists, tuples walked)."""
    if isinstance(value, datetime):
        return format_instant(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, memoryview | bytes):
        raise TypeError("bytes are never sent")
    return value


def _cursor_key(cursor: str | None, valid: Callable[[Any], bool]) -> Any:
    """The sort key in ``cursor`` if ``valid`` says it is one this list produced; else ValidationError (``cursor``)."""
    after = decode_cursor(cursor)
    if after is not None and not valid(after):
        raise ValidationError("cursor", "must be a next_cursor value returned by this list", cursor)
    return after


def _is_tenant(value: Any) -> bool:
    try:
        validate_tenant(value)
    except ValidationError:
        return False
    return True


def _is_key_id(value: Any) -> bool:
    try:
        keys_mod.check_key_id(value)
    except ValidationError:
        return False
    return True


# ---------------------------------------------------------------- tenants


class Tenant(BaseModel):
    """A tenant as stored: fair-share weight, fleet-wide rate cap, schedule quota, live job count."""

    tenant: str
    weight: int = Field(description="Fair-share weight, 1-1000.")
    max_rate: float | None = Field(description="Fleet-wide cap in runs/s; null: none.")
    max_schedules: int | None = Field(
        description=f"Live schedules PUT and apply may leave the tenant with; null: the default "
        f"({jobs.DEFAULT_MAX_SCHEDULES})."
    )
    jobs: int = Field(description="Live jobs (schedules) of the tenant now.")
    created_at: str = Field(description="When the tenant was created (ISO 8601 UTC).")


class TenantPage(BaseModel):
    items: list[Tenant]
    next_cursor: str | None


class TenantCreate(BaseModel):
    """``scheduler tenants add``: name (1-200 of letters, digits and ``._:@/-``), weight 1-1000, rate cap."""

    model_config = ConfigDict(extra="forbid")
    tenant: str = Field(max_length=200, strict=True)
    weight: int = Field(default=1, strict=True)
    max_rate: float | None = Field(default=None, strict=True)


class TenantUpdate(BaseModel):
    """``scheduler tenants set``: the fields given change; ``max_rate: null`` removes the cap,
    ``max_schedules: null`` restores the default quota."""

    model_config = ConfigDict(extra="forbid")
    weight: int | None = Field(default=None, strict=True)
    max_rate: float | None = Field(default=None, strict=True)
    max_schedules: int | None = Field(
        default=None,
        strict=True,
        description=f"Schedule quota, 0-{jobs.MAX_SCHEDULES_LIMIT}; null: back to the default "
        f"({jobs.DEFAULT_MAX_SCHEDULES}).",
    )


def _tenant(row: dict[str, Any]) -> Tenant:
    return Tenant(**jsonable({k: row.get(k) for k in Tenant.model_fields}))


def _tenant_page(conn: Any, *, after: str | None, limit: int, tenant: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``list_tenants_page``: the list's page, or (``tenant``) that tenant's row alone."""
    return store.execute(conn, "list_tenants_page", {"after": after, "limit": limit, "tenant": tenant})


def _read_tenant(conn: Any, tenant: str) -> Tenant:
    """``tenant`` as ``GET /v1/tenants`` lists it (the answer to a write of it)."""
    [row] = _tenant_page(conn, after=None, limit=1, tenant=tenant)
    return _tenant(row)


@router.get("/v1/tenants", response_model=TenantPage, summary="List tenants")
def list_tenants(
    request: Request,
    _: Admin,
    limit: Annotated[int, Depends(page_size)],
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
) -> TenantPage:
    """Tenants by name, a page at a time (`next_cursor` null on the last page)."""
    after = _cursor_key(cursor, _is_tenant)
    with db(request) as conn:
        rows = _tenant_page(conn, after=after, limit=limit + 1)
    items, next_cursor = page_of(rows, limit, lambda row: row["tenant"])
    return TenantPage(items=[_tenant(r) for r in items], next_cursor=next_cursor)


@router.post("/v1/tenants", status_code=201, response_model=Tenant, summary="Create a tenant")
def create_tenant(request: Request, _: Admin, body: TenantCreate) -> Tenant:
    """As `scheduler tenants add`; 409 if the tenant exists (change it with PATCH).
    The answer is the tenant as `GET /v1/tenants` lists it."""
    with db(request) as conn:
        created = jobs.add_tenant(conn, body.tenant, body.weight, body.max_rate)
        if not created:
            raise ConflictError(f"tenant: {body.tenant!r} exists; PATCH /v1/tenants/{body.tenant} to change it")
        return _read_tenant(conn, body.tenant)


@router.patch("/v1/tenants/{tenant:path_name}", response_model=Tenant, summary="Change a tenant")
def update_tenant(request: Request, _: Admin, tenant: str, body: TenantUpdate) -> Tenant:
    """As `scheduler tenants set`: `weight`, `max_rate` (null: no cap), `max_schedules` (null:
    the default quota); the fields not given are kept. 404 for an unknown tenant. The answer
    is the tenant as `GET /v1/tenants` lists it."""
    validate_tenant(tenant)
    given = body.model_fields_set
    if not given:
        raise ValidationError("body", "give weight, max_rate and/or max_schedules")
    if "weight" in given and body.weight is None:
        raise ValidationError(
            "weight", "must be a whole number from 1 to 1000 (null removes nothing: a tenant always has a weight)"
        )
    quota = body.max_schedules
    if quota is not None and not 0 <= quota <= jobs.MAX_SCHEDULES_LIMIT:
        raise ValidationError("max_schedules", f"must be a whole number from 0 to {jobs.MAX_SCHEDULES_LIMIT}", quota)
    with db(request) as conn:
        jobs.set_tenant(
            conn,
            tenant,
            weight=body.weight,
            max_rate=body.max_rate,
            clear_max_rate="max_rate" in given and body.max_rate is None,
            max_schedules=quota,
            clear_max_schedules="max_schedules" in given and quota is None,
        )
        return _read_tenant(conn, tenant)


# ---------------------------------------------------------------- keys


class Key(BaseModel):
    """A key as `keys list` shows it: never the secret or its hash."""

    key_id: str
    tenant: str | None
    role: Literal["admin", "tenant", "worker"]
    name: str | None
    created_at: str
    revoked_at: str | None
    last_used_at: str | None


class KeyPage(BaseModel):
    items: list[Key]
    next_cursor: str | None


class KeyCreate(BaseModel):
    """`scheduler keys create`: role, tenant (omitted for admin, required otherwise), optional name."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["admin", "tenant", "worker"]
    tenant: str | None = Field(default=None, max_length=200)
    name: str | None = Field(default=None, max_length=keys_mod.MAX_NAME_CHARS)


class CreatedKey(BaseModel):
    """The new key and its token: shown in this response only, it cannot be read back."""

    token: str
    key: Key


def _key(row: dict[str, Any]) -> Key:
    return Key(**jsonable({k: row.get(k) for k in Key.model_fields}))


@router.get("/v1/keys", response_model=KeyPage, summary="List keys")
def list_keys(
    request: Request,
    _: Admin,
    limit: Annotated[int, Depends(page_size)],
    tenant: Annotated[str | None, Query(max_length=200)] = None,
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
) -> KeyPage:
    """Keys by key id (all, or one tenant's), a page at a time; never secrets or hashes."""
    after = _cursor_key(cursor, _is_key_id)
    with db(request) as conn:
        rows = keys_mod.list_keys(conn, tenant, after=after, limit=limit + 1)
    items, next_cursor = page_of(rows, limit, lambda row: row["key_id"])
    return KeyPage(items=[_key(r) for r in items], next_cursor=next_cursor)


@router.post("/v1/keys", status_code=201, response_model=CreatedKey, summary="Create a key")
def create_key(request: Request, _: Admin, body: KeyCreate) -> JSONResponse:
    """As `scheduler keys create`; the token is in this response only (`Cache-Control: no-store`)."""
    with db(request) as conn:
        token, row = keys_mod.create(conn, body.tenant, body.role, body.name)
    content = CreatedKey(token=token, key=_key(row)).model_dump()
    return JSONResponse(content, status_code=201, headers={"Cache-Control": "no-store"})


@router.post("/v1/keys/{key_id}:revoke", response_model=Key, summary="Revoke a key")
def revoke_key(
    request: Request,
    _: Admin,
    key_id: Annotated[
        str,
        Path(
            pattern=pattern("^[0-9a-f]{16}$", "must be a key id: 16 hex digits (tk_<key id>_...)"),
            description="The key's id (tk_<key_id>_...).",
        ),
    ],
) -> Key:
    """As `scheduler keys revoke`: refused by this process at once, by every other API process
    within a second; revoking again changes nothing."""
    with db(request) as conn:
        row = keys_mod.revoke(conn, key_id)
    request.app.state.keys.forget(key_id)  # this process at once; the others within CACHE_TTL_S
    return _key(row)


# ---------------------------------------------------------------- status, verify


def _positive(field: str, value: float | None, default: float) -> float:
    if value is None:
        return default
    if not 0 < value <= MAX_FLEET_TIMING_S:
        raise ValidationError(field, f"must be a number of seconds > 0 and <= {MAX_FLEET_TIMING_S}", value)
    return value


@router.get("/v1/status", response_model=dict[str, Any], summary="Cluster status")
def cluster_status(
    request: Request,
    _: Admin,
    lease_ttl_s: Annotated[float | None, Query(description="The fleet's lease TTL (s).")] = None,
    renew_interval_s: Annotated[float | None, Query(description="The fleet's renew interval (s).")] = None,
    poll_interval_s: Annotated[float | None, Query(description="The fleet's poll interval (s).")] = None,
) -> dict[str, Any]:
    """As `scheduler status --json`: nodes (live, suspect, dead), their partitions, orphaned partitions."""
    ttl = _positive("lease_ttl_s", lease_ttl_s, Settings.lease_ttl_s)
    renew = _positive("renew_interval_s", renew_interval_s, Settings.renew_interval_s)
    poll = _positive("poll_interval_s", poll_interval_s, Settings.poll_interval_s)
    responsive_s = Settings(lease_ttl_s=ttl, renew_interval_s=renew, poll_interval_s=poll).responsive_s
    with db(request) as conn:
        return jsonable(status.cluster_status(conn, ttl, responsive_s))


@router.get("/v1/verify", response_model=dict[str, Any], summary="Audit a window of runs")
def verify(
    request: Request,
    _: Admin,
    since: Annotated[str, Query(max_length=100, description="Window start (inclusive), ISO 8601 with offset.")],
    until: Annotated[
        str, Query(max_length=100, description="Window end (exclusive), ISO 8601 with offset; at most a day later.")
    ],
    delivery: Annotated[bool, Query(description="Also audit delivery (as --delivery).")] = False,
    list_limit: Annotated[int, Query(ge=0, le=MAX_VERIFY_LIST, description="Findings listed per kind.")] = 100,
    lease_ttl_s: Annotated[float | None, Query(description="With delivery: the fleet's lease TTL (s).")] = None,
) -> dict[str, Any]:
    """As `scheduler verify --json`: counts, findings and `ok` (false when the audit found a break)."""
    from scheduler.audit import verify as audit_verify
    from scheduler.audit import verify_delivery

    start = parse_instant(since, "since")
    end = parse_instant(until, "until")
    if end - start > timedelta(seconds=MAX_VERIFY_WINDOW_S):
        raise ValidationError(
            "until", "the window may span at most 1 day over the API (use `scheduler verify` for longer)", until
        )
    ttl = _positive("lease_ttl_s", lease_ttl_s, Settings.lease_ttl_s)
    with db(request) as conn:
        report = audit_verify(conn, start, end, list_limit=list_limit)
        out = report.as_dict() | {"ok": report.ok}
        if delivery:
            delivered = verify_delivery(conn, start, end, lease_ttl_s=ttl, list_limit=list_limit)
            out["delivery"] = delivered.as_dict() | {"ok": delivered.ok}
            out["ok"] = report.ok and delivered.ok
    return jsonable(out)
