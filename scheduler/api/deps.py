"""FastAPI dependencies of the HTTP API: who is asking (keys, roles), the store, paging.

* :func:`db`: a pooled store connection (autocommit, dict rows) as a
  context manager; write paths run ``scheduler.store.run_transaction(conn, body)``.
* :class:`Authenticate` (middleware): every ``/v1/`` request's
  ``Authorization: Bearer <token>`` is checked
  (:class:`scheduler.api.keys.KeyVerifier`) and a token taken from the
  key's rate bucket (429 beyond) before the request is routed or its body
  read; a client address over its budget of failed authentications
  (:class:`scheduler.api.limits.AuthThrottle`) is a 429 before its key is
  looked at;
* :func:`tenant_principal`, :func:`worker_principal`, :func:`admin_principal`,
  :func:`any_principal`: the request's principal (authenticated here if the
  middleware did not) with its role checked (403). No key, a malformed,
  unknown, revoked or wrong one: 401, ``WWW-Authenticate: Bearer``, no detail.
* :func:`page_size`, :func:`page_of`, :func:`encode_cursor`, :func:`decode_cursor`: list
  paging (docs/api.md, "Limits"): the page is ``{"items": [...],
  "next_cursor": str | null}``; the cursor is the URL-safe base64 of the JSON
  of the last item's sort key, opaque to clients; a bad one is a 422 naming
  ``cursor``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Annotated, Any

import psycopg
from fastapi import Depends, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from scheduler import store
from scheduler.api.errors import ApiError, Unauthorized, problem, store_unavailable
from scheduler.api.keys import Principal
from scheduler.api.limits import page_limit
from scheduler.errors import StoreError, ValidationError
from scheduler.settings import API_PAGE_SIZE, MAX_API_PAGE_SIZE

__all__ = [
    "Principal",
    "admin_principal",
    "any_principal",
    "db",
    "decode_cursor",
    "encode_cursor",
    "page_of",
    "page_size",
    "tenant_principal",
    "worker_principal",
]

MAX_CURSOR_CHARS = 2048
"""Longest cursor accepted (a sort key is small)."""


@contextlib.contextmanager
def pooled(pool: Any) -> Iterator[psycopg.Connection]:
    """A connection of ``pool``, returned to it on exit; closed first (so the pool replaces
    it) when the request met an error after which a node session reconnects
    (:func:`scheduler.store.drops_connection`: e.g. a server turned read-only, which keeps
    the connection up and refuses every write; a new one reaches the writable host)."""
    with pool.connection() as conn:
        try:
            yield conn
        except Exception as exc:
            if store.drops_connection(exc):
                conn.close()
            raise


def db(request: Request) -> AbstractContextManager[psycopg.Connection]:
    """A connection from the app's pool (``app.state.pool``; :func:`pooled`), returned to it on exit.

    Autocommit with dict rows; ``statement_timeout`` bounds every statement.
    Raises ``psycopg_pool.PoolTimeout`` (answered 503) when none frees up in time.
    """
    return pooled(request.app.state.pool)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive), else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def authenticate(app: Any, authorization: str | None, client: str | None) -> Principal:
    """The principal of an ``Authorization`` header value sent from address ``client`` (None:
    unknown), its key's rate taken.

    Raises a 429 :class:`~scheduler.api.errors.ApiError` before the key is looked
    at while ``client`` is over its budget of failed authentications
    (``app.state.auth_throttle``), unless the key is one that authenticated
    lately (:meth:`~scheduler.api.keys.KeyVerifier.known_good`: a worker
    already running behind the same address keeps working), which is then
    checked as always and, if it fails, answered 429 too;
    :class:`~scheduler.api.errors.Unauthorized` (401: no key, malformed,
    unknown, wrong, revoked; counted against ``client``); a 429 when the key
    is over its rate; store errors as the store raises them. Blocking (reads
    the store on a cache miss): call it from a worker thread.
    """
    throttle, keys = app.state.auth_throttle, app.state.keys
    token = bearer_token(authorization)
    throttled = throttle.wait_s(client) > 0
    if throttled and not keys.known_good(token):
        throttle.check(client)
    principal = None if token is None else keys.verify(lambda: pooled(app.state.pool), token)
    if principal is None:
        throttle.failed(client)
        if throttled:
            throttle.check(client)
        raise Unauthorized()
    app.state.limiter.check(principal.key_id)
    return principal


class Authenticate:
    """ASGI middleware: every ``/v1/`` request is authenticated (and its key's rate taken)
    before routing, so a caller without a valid key learns nothing but 401, not even that
    its body is malformed; the principal is left in the request state for the dependencies.
    A request with more than one ``Authorization`` header is a 400 (field ``authorization``)
    before any key is looked at."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        sent = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
        authorization = sent[0].decode("latin-1") if sent else None
        client = scope.get("client")
        try:
            if len(sent) > 1:  # which one counts would be a guess: a proxy may have appended one
                raise ApiError(
                    400,
                    "Bad Request",
                    f"authorization: must be sent once (got {len(sent)} Authorization headers)",
                    field="authorization",
                )
            principal = await run_in_threadpool(authenticate, scope["app"], authorization, client and client[0])
        except ApiError as exc:
            response = problem(exc.status, exc.detail, title=exc.title, field=exc.field, headers=exc.headers)
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction, StoreError) as exc:
            response = store_unavailable(scope["path"], exc)
        else:
            scope.setdefault("state", {})["principal"] = principal
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="key",
    description="An API key's token (`tk_...`, from `scheduler keys create` or `POST /v1/keys`).",
)
"""Documents ``Authorization: Bearer`` in the OpenAPI schema; the header is checked by :func:`authenticate`."""


def _authenticate(
    request: Request, _documented: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None
) -> Principal:
    cached = getattr(request.state, "principal", None)
    if isinstance(cached, Principal):
        return cached
    client = request.client.host if request.client else None
    principal = authenticate(request.app, request.headers.get("authorization"), client)
    request.state.principal = principal
    return principal


def _forbidden(role: str, allowed: str) -> ApiError:
    article = "an" if role[:1] in "aeiou" else "a"
    return ApiError(403, "Forbidden", f"role: {article} {role} key cannot use this endpoint (it needs {allowed})")


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


def page_of(rows: list[Any], limit: int, sort_key: Callable[[Any], Any]) -> tuple[list[Any], str | None]:
    """``(items, next_cursor)`` of a page read with ``LIMIT limit + 1``: the first ``limit`` rows,
    and the cursor of the last one's ``sort_key`` when a further row exists (else None)."""
    items = rows[:limit]
    return items, encode_cursor(sort_key(items[-1])) if len(rows) > limit else None


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
