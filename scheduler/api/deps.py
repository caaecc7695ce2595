"""FastAPI dependencies of the HTTP API: who is asking (keys, roles), the store, paging.

* :func:`db`: a pooled store connection (autocommit, dict rows) as a
  context manager; write paths run ``scheduler.store.run_transaction(conn, body)``.
* :func:`tenant_principal`, :func:`worker_principal`, :func:`admin_principal`,
  :func:`any_principal`: authenticate ``Authorization: Bearer <token>``
  (:class:`scheduler.api.keys.KeyVerifier`), take a token from the key's
  rate bucket (429 beyond) and check the role (403). No key, a malformed,
  unknown, revoked or wrong one: 401, ``WWW-Authenticate: Bearer``, no detail.
* :func:`page_size`, :func:`encode_cursor`, :func:`decode_cursor`: list
  paging (docs/api.md, "Paging"): the page is ``{"items": [...],
  "next_cursor": str | null}``; the cursor is the URL-safe base64 of the JSON
  of the last item's sort key, opaque to clients; a bad one is a 422 naming
  ``cursor``.
"""

from __future__ import annotations

import base64
import binascii
import json
from contextlib import AbstractContextManager
from typing import Annotated, Any

import psycopg
from fastapi import Depends, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler.api.errors import ApiError, Unauthorized
from scheduler.api.keys import Principal
from scheduler.api.limits import page_limit
from scheduler.errors import ValidationError
from scheduler.settings import API_PAGE_SIZE, MAX_API_PAGE_SIZE

__all__ = [
    "Principal",
    "admin_principal",
    "any_principal",
    "db",
    "decode_cursor",
    "encode_cursor",
    "page_size",
    "tenant_principal",
    "worker_principal",
]

MAX_CURSOR_CHARS = 2048
"""Longest cursor accepted (a sort key is small)."""


def db(request: Request) -> AbstractContextManager[psycopg.Connection]:
    """A connection from the app's pool (``app.state.pool``), returned to it on exit.

    Autocommit with dict rows; ``statement_timeout`` bounds every statement.
    Raises ``psycopg_pool.PoolTimeout`` (answered 503) when none frees up in time.
    """
    return request.app.state.pool.connection()


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="key",
    description="An API key's token (`tk_...`, from `scheduler keys create` or `POST /v1/keys`).",
)
"""Documents ``Authorization: Bearer`` in the OpenAPI schema; the header is checked by :func:`_authenticate`."""


def _authenticate(
    request: Request, _documented: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None
) -> Principal:
    cached = getattr(request.state, "principal", None)
    if isinstance(cached, Principal):
        return cached
    token = _bearer(request)
    if token is None:
        raise Unauthorized()
    principal = request.app.state.keys.verify(lambda: db(request), token)
    if principal is None:
        raise Unauthorized()
    request.app.state.limiter.check(principal.key_id)
    request.state.principal = principal
    return principal


def _forbidden(role: str, allowed: str) -> ApiError:
    return ApiError(403, "Forbidden", f"role: a {role} key cannot use this endpoint (it needs {allowed})")


Authenticated = Annotated[Principal, Depends(_authenticate)]


def any_principal(principal: Authenticated) -> Principal:
    """Any valid key (admin, tenant or worker): 401 otherwise, 429 over its rate."""
    return principal


def tenant_principal(principal: Authenticated) -> Principal:
    """A ``tenant`` key (schedules): 403 for worker and admin keys."""
    if principal.role != "tenant":
        raise _forbidden(principal.role, "a tenant key")
    return principal


def worker_principal(principal: Authenticated) -> Principal:
    """A ``worker`` or ``tenant`` key (runs): 403 for admin keys."""
    if principal.role not in ("worker", "tenant"):
        raise _forbidden(principal.role, "a worker or tenant key")
    return principal


def admin_principal(principal: Authenticated) -> Principal:
    """An ``admin`` key (tenants, keys, status, verify): 403 for tenant and worker keys."""
    if principal.role != "admin":
        raise _forbidden(principal.role, "an admin key")
    return principal


def page_size(
    request: Request,
    limit: int | None = Query(
        None,
        ge=1,
        le=MAX_API_PAGE_SIZE,
        description=f"Items per page (default {API_PAGE_SIZE}, at most {MAX_API_PAGE_SIZE}).",
    ),
) -> int:
    """The ``limit`` query parameter of a list: the app's default when absent, 1..max (422 beyond)."""
    api = request.app.state.settings
    return page_limit(limit, api.page_size, api.max_page_size)


def encode_cursor(sort_key: Any) -> str:
    """The opaque cursor of the page after ``sort_key`` (a JSON-able value: the last item's sort key)."""
    raw = json.dumps(sort_key, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str | None) -> Any:
    """The sort key a cursor from :func:`encode_cursor` carries; None for None.

    Raises ValidationError (field ``cursor``, 422) for anything else; callers
    check the key's shape (and raise the same) before using it in a query.
    """
    if cursor is None:
        return None
    rule = "must be a next_cursor value returned by this list"
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
        raise ValidationError("cursor", rule, cursor)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValidationError("cursor", rule, cursor) from None
