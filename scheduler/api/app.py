"""The tenant HTTP API as one ASGI application (FastAPI; docs/api.md).

:func:`create_app` builds it: the routers of ``/v1/schedules…``
(:mod:`scheduler.api.schedules`), ``/v1/runs…`` (:mod:`scheduler.api.runs`),
the admin endpoints (:mod:`scheduler.api.admin`) and ``/v1/explain``
(:mod:`scheduler.api.explain`); the error handlers of
:mod:`scheduler.api.errors`; the body limit of :mod:`scheduler.api.limits`;
and on ``app.state``: ``pool`` (a ``psycopg_pool.ConnectionPool`` opened
while the app runs), ``keys`` (:class:`scheduler.api.keys.KeyVerifier`),
``limiter`` (:class:`scheduler.api.limits.RateLimiter`), ``auth_throttle``
(:class:`scheduler.api.limits.AuthThrottle`), ``settings``
(:class:`scheduler.settings.ApiSettings`), ``push_policy`` (the SSRF allowlist
of schedules' URL targets at save time, from ``push_allow``).

Handlers are plain ``def`` functions: FastAPI runs them in its thread pool,
each with a pooled psycopg connection (the store layer is synchronous).
The schema is served at ``/openapi.json`` and committed as
``docs/openapi.json`` (:mod:`scheduler.api.schema` checks they agree).
"""

from __future__ import annotations

import select
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from scheduler import __version__, store
from scheduler.api import admin, errors, explain, inputs, runs, schedules
from scheduler.api.access import AccessLog
from scheduler.api.deps import Authenticate
from scheduler.api.keys import KeyVerifier
from scheduler.api.limits import AuthThrottle, BodyLimit, RateLimiter
from scheduler.delivery.ssrf import AddressPolicy
from scheduler.settings import ApiSettings
from scheduler.store.session import PREPARE_THRESHOLD

STATEMENT_TIMEOUT_S = 10.0
"""``statement_timeout`` of the API's store sessions: no request holds a connection longer."""

POOL_TIMEOUT_S = 10.0
"""How long a request waits for a free store connection before a 503."""

_PROBLEM = {
    "model": errors.Problem,
    "content": {errors.PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
}

COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {**_PROBLEM, "description": description}
    for status, description in (
        (401, "No key, or a malformed, unknown, revoked or wrong one (no detail)."),
        (403, "The key's role may not use this endpoint."),
        (404, "No such object (or another tenant's)."),
        (409, "The request conflicts with what the store holds (e.g. the name exists)."),
        (413, "Request body over the limit (1 MiB)."),
        (422, "Invalid input: `field` and `detail` name the field and the rule."),
        (
            429,
            "Over the key's rate, or too many failed authentications from the address: `Retry-After` says when.",
        ),
    )
}
COMMON_RESPONSES[401]["headers"] = {
    "WWW-Authenticate": {"description": "Always `Bearer`.", "schema": {"type": "string"}, "required": True}
}
COMMON_RESPONSES[429]["headers"] = {
    "Retry-After": {
        "description": "Whole seconds until the key (or the address) may send again (at least 1).",
        "schema": {"type": "integer", "minimum": 1},
        "required": True,
    }
}
"""The error responses every ``/v1`` operation documents (problem+json)."""

DESCRIPTION = """\
The trigger engine's tenant API: schedules, runs and workers over HTTP.
Authenticate with `Authorization: Bearer tk_...` (a key from `scheduler keys create`).
Every error is `application/problem+json` naming the field and the rule.
See docs/api.md."""


RECONNECT_TIMEOUT_S = 1.0
"""How long the pool retries a connection that failed to open before giving up (psycopg_pool's
``reconnect_timeout``, default 300 s, retried on a doubling backoff: 1, 2, 4, 8 s ...). With
it, a store back from an outage waited for the pool's next retry: a trial saw ~25 s of 503s
with the store up. Given up after a second, the next request that finds no connection starts
a new attempt at once (psycopg_pool grows the pool for a waiting client), so the first
request after the store is back is served. While the store is down, a request that finds no
connection starts an attempt (retried once, a second later) and is answered 503 after
:data:`POOL_TIMEOUT_S`."""


def check_pooled(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it is about to lend: raises (the pool then closes it
    and takes another) if the server has spoken on it while it sat idle.

    An idle autocommit connection of the API receives nothing unless the server is ending
    it: a termination notice (a restart, a failover, ``pg_terminate_backend``) or EOF. So
    a readable socket (one ``poll`` with no wait, no round trip) is checked with
    psycopg_pool's own ``check_connection`` (one empty query), which raises on a dead
    connection. Without it, after a store restart every pooled connection failed the
    first request that took it: up to ``api_pool_size`` 503s (a trial). A connection lost
    without a word (a network partition) is not seen here; keepalives and the statement
    timeout bound that request.
    """
    if conn.closed:
        raise psycopg.OperationalError("the pooled connection is closed")
    poller = select.poll()  # not select.select: an API serving many clients has descriptors past 1024
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


def _pool(dsn: str, size: int) -> ConnectionPool:
    return ConnectionPool(
        store.libpq_dsn(dsn),
        min_size=1,
        max_size=max(1, size),
        timeout=POOL_TIMEOUT_S,
        open=False,
        name="scheduler-api",
        configure=store.pin_time_zone,
        check=check_pooled,
        reconnect_timeout=RECONNECT_TIMEOUT_S,
        kwargs={
            "autocommit": True,
            "row_factory": dict_row,
            "application_name": "scheduler-api",
            "connect_timeout": 5,
            "options": store.session_options(dsn, statement_timeout=STATEMENT_TIMEOUT_S),
            # Never prepared server-side, as the engine's sessions (a generic plan of
            # claim_runs made while runs was empty would seq-scan every run later).
            "prepare_threshold": PREPARE_THRESHOLD,
        },
    )


def create_app(
    dsn: str,
    *,
    settings: ApiSettings | None = None,
    access_log: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The API application against the store at ``dsn``.

    ``settings`` (default :class:`ApiSettings` ()) bounds requests and sets
    the per-key rate; ``access_log`` logs one ``api_request`` record per
    request (:class:`scheduler.api.access.AccessLog`). ``clock`` (monotonic
    seconds) paces the per-key rate and the failed-authentication throttle
    (tests pin one). The store pool opens when the app starts (ASGI
    lifespan) and closes when it stops. Raises ConfigError for a malformed
    DSN or settings (nothing is opened).
    """
    api = (settings or ApiSettings()).check()
    store.check_dsn(dsn)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool.open(wait=False)
        try:
            yield
        finally:
            app.state.pool.close()

    app = FastAPI(
        title="trigger engine API",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # Paths are exact: a trailing slash is a 404 (errors.py says so), never a redirect
        # (Starlette's is absolute, built from Host and the socket's scheme: http:// behind TLS).
        redirect_slashes=False,
        dependencies=[Depends(inputs.check_request_text)],
    )
    app.state.settings = api
    app.state.pool = _pool(dsn, api.pool_size)
    app.state.keys = KeyVerifier()
    app.state.limiter = RateLimiter(api.rate_per_s, api.burst, clock=clock)
    app.state.auth_throttle = AuthThrottle(api.auth_fail_rate_per_s, api.auth_fail_burst, clock=clock)
    app.state.push_policy = AddressPolicy.parse(api.push_allow)
    errors.install(app)
    for module in (schedules, runs, explain, admin):
        app.include_router(module.router, responses=COMMON_RESPONSES)
    app.add_middleware(BodyLimit, max_bytes=api.max_body_bytes)
    app.add_middleware(Authenticate)  # no key, nothing else is looked at
    if access_log:
        app.add_middleware(AccessLog)  # outermost: sees every answer, 401s and 429s included
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with error responses declared as problem+json only (FastAPI adds an
    ``application/json`` entry for every response ``model``; errors are never sent as that)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if status[:1] in "45" and errors.PROBLEM_JSON in content:
                        content.pop("application/json", None)
        app.openapi_schema = schema
    return app.openapi_schema
