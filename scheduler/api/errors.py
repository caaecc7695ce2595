"""Every error of the HTTP API as ``application/problem+json`` (RFC 9457; docs/api.md, "Errors").

Body: ``{"type": "about:blank", "title": <HTTP reason>, "status": <code>,
"detail": <one line>, "field": <input field>?}``. ``detail`` is the CLI's
one-line message (``<field>: <rule> (got <value>)``, the value cut by
:func:`scheduler.errors.clip`), except that where a rule or hint names another
input or a command it names this API's (:data:`API_WORDS`: ``since``, not
``--since``); a 401 carries no detail at all.

Mapping (:func:`install`):

* :class:`ApiError` → its status;
* :class:`scheduler.errors.ValidationError` and
  :class:`~scheduler.errors.ConfigError` → 422 (field and rule);
  :class:`~scheduler.errors.NotFoundError` → 404;
  :class:`~scheduler.errors.ConflictError` → 409;
* FastAPI's request validation (a parameter or body of the wrong shape,
  a body that is not JSON or not UTF-8) → 422 naming the field (the
  parameter name, or the body path such as ``items[0].name``) and the rule;
* a JSON body not UTF-8, naming a key twice, nested too deep or holding a
  number JSON or Python cannot take (NaN, 1e400, over 4300 digits)
  (:class:`BodyRefused`, raised by :func:`scheduler.api.inputs.decode_body`)
  → 422 naming the key, the value's path or ``body``; a body that is not JSON → 422 ``body`` saying where it broke;
* Starlette's HTTP errors (unknown path 404, method 405, body too large
  413) → that status; paths are exact: one with a trailing slash is a 404
  saying so (the app never redirects), a 405 too when only a route whose
  name takes ``/`` matched it;
* the store unreachable or failing after retries → 503;
* anything else → 500 with no internals (the exception is logged).
"""

from __future__ import annotations

import http
import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler import log as logmod
from scheduler.errors import (
    CLI_WORDS,
    ConfigError,
    ConflictError,
    NotFoundError,
    StoreError,
    ValidationError,
    clip,
)
from scheduler.schedule import NO_UTC_OFFSET, NOT_AN_INSTANT

PROBLEM_JSON = "application/problem+json"

FIELD_NAMES = {
    "interval": "interval_s",
    "jitter": "jitter_s",
    "header": "headers",
}
"""The project's field names (the CLI's option names) → this API's body fields."""

API_WORDS = {name: FIELD_NAMES.get(name, name) for name in CLI_WORDS} | {"tenants_add": "`POST /v1/tenants`"}
"""This API's words for what a rule or hint names (:data:`scheduler.errors.CLI_WORDS`
has the CLI's): its body and query fields (``interval_s`` where the CLI says
``--interval``) and endpoints (``POST /v1/tenants`` where the CLI says ``scheduler
tenants add``)."""


class Problem(BaseModel):
    """The body of every error response (RFC 9457 problem details)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    field: str | None = None


class ApiError(Exception):
    """An error answered as ``status`` with a problem+json body.

    ``title`` is the short HTTP-reason-like summary, ``detail`` the one-line
    explanation, ``field`` the input field at fault (if any), ``headers``
    extra response headers (e.g. ``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.field = field
        self.headers = headers or {}


class Unauthorized(ApiError):
    """401 with ``WWW-Authenticate: Bearer`` and no detail (no key, malformed, unknown, revoked, wrong)."""

    def __init__(self) -> None:
        super().__init__(401, "Unauthorized", "", headers={"WWW-Authenticate": "Bearer"})


class PayloadTooLarge(StarletteHTTPException):
    """413: the request body is over the limit (raised while it is read, so FastAPI passes it through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body: must be at most {limit} bytes")


class BodyRefused(StarletteHTTPException):
    """422: a request body that is not UTF-8, or is JSON but breaks a rule of its own (a duplicate
    key, nested too deep, a number that is not finite or has too many digits), raised while it
    is decoded (so FastAPI passes it through); ``field`` is the body's field at fault, ``rule``
    the rule."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(422, f"{field}: {rule}")
        self.field = field


_TITLES = {413: "Content Too Large", 422: "Unprocessable Content"}
"""RFC 9110's reason phrases where Python's differ by version (3.11 still says "... Entity")."""


def _reason(status: int) -> str:
    if status in _TITLES:
        return _TITLES[status]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem(
    status: int,
    detail: str | None = None,
    *,
    title: str | None = None,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A problem+json response: ``status``, ``title`` (default: the HTTP reason), ``detail`` and
    ``field`` when given (a 401 has neither)."""
    body: dict[str, Any] = {"type": "about:blank", "title": title or _reason(status), "status": status}
    if detail:
        body["detail"] = logmod.redact(detail)  # also hides anything shaped like an API token
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _loc_field(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "items", 0, "name")`` → ``items[0].name``; ``("query", "count")`` → ``count``;
    the body itself → ``body``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        where, parts = parts[0], parts[1:]
    else:
        where = "body"
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or where


MORE_FIELDS_NAMED = 5
"""A 422 with several errors details the first and at most this many others (each ``field: rule``)."""

PATTERN_RULES: dict[str, str] = {}
"""A field pattern → the rule a person reads instead of the regular expression
(registered with :func:`pattern`); a pattern not in it is quoted as is."""


def pattern(regex: str, rule: str) -> str:
    """``regex``, after registering ``rule`` (``"must be ..."``) as what a mismatch says:
    ``Field(pattern=pattern(RUN_ID_PATTERN, "must be <job id>..."))``."""
    PATTERN_RULES[regex] = rule
    return regex


def _bound(value: Any) -> str:
    """A bound as a person writes it: ``3600``, not ``3600.0``; ``2592000``, not ``2.592e+06``."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


_RULES = {
    "missing": "is required",
    "json_invalid": "must be valid JSON (UTF-8)",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
    "list_type": "must be a JSON array",
    "string_type": "must be a string",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number in ASCII digits",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "extra_forbidden": "is not a known field",
    "finite_number": "must be a finite number",
    # The CLI's words for an instant (scheduler.schedule.parse_instant) and a UUID.
    **dict.fromkeys(("datetime_parsing", "datetime_from_date_parsing", "datetime_type"), NOT_AN_INSTANT),
    "timezone_aware": NO_UTC_OFFSET,
    **dict.fromkeys(("uuid_parsing", "uuid_type"), "must be a UUID (32 hex digits as 8-4-4-4-12)"),
}


def _rule(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind in _RULES:
        return _RULES[kind]
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "")
        return f"must be {sign} {_bound(bound)}"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        shortest = ctx.get("min_length")
        return "must not be empty" if shortest == 1 else f"must be at least {shortest} characters"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}".replace("'", "")
    if kind == "string_pattern_mismatch":
        regex = str(ctx.get("pattern"))
        return PATTERN_RULES.get(regex) or f"must match {regex}"
    if kind == "value_error" and ctx.get("error") is not None:
        return str(ctx["error"])  # an API validator's own rule, without pydantic's "Value error, "
    message = str(error.get("msg", "is invalid"))
    # "Input should be ..." reads "input should be ..."; an acronym keeps its capitals ("UUID input ...").
    return message if message[1:2].isupper() else message[:1].lower() + message[1:]


def validation_detail(error: dict[str, Any]) -> tuple[str, str]:
    """``(field, one-line detail)`` of one pydantic/FastAPI validation error, in the CLI's
    ``<field>: <rule> (got <value>)`` form (the value cut by :func:`clip`; omitted when missing).
    A body that is not JSON is the field ``body``, its detail saying where it broke."""
    if error.get("type") == "json_invalid":  # loc ("body", <character position>)
        loc, reason = list(error.get("loc", ())), (error.get("ctx") or {}).get("error")
        where = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return "body", f"body: {_RULES['json_invalid']}" + (f": {reason}{where}" if reason else "")
    field = _loc_field(error.get("loc", ()))
    rule = _rule(error)
    given = error.get("input")
    got = "" if error.get("type") in ("missing", "json_invalid") or given is None else f" (got {clip(given)})"
    if isinstance(given, (dict, list)):
        got = ""
    if isinstance(given, (bytes, bytearray)):  # a body not sent as JSON reaches the model as bytes
        rule, got = f"{rule}, sent with Content-Type: application/json", ""
    return field, f"{field}: {rule}{got}"


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return problem(exc.status, exc.detail, title=exc.title, field=exc.field, headers=exc.headers)


def api_terms(exc: ValidationError) -> tuple[str, str]:
    """``(field, detail)`` of a project ValidationError in this API's words: the field's API
    name (``interval_s`` for ``interval``), and the rule led by it, naming this API's inputs
    where it names another (``API_WORDS``)."""
    field = FIELD_NAMES.get(exc.field, exc.field)
    return field, exc.render(API_WORDS, field)


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    field, detail = api_terms(exc)
    return problem(422, detail, field=field)


async def _config(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ConfigError)
    return problem(422, exc.render(API_WORDS))


def _named_field(text: str) -> str | None:
    """The field a ``<field>: <rule>`` message names (None if it names none)."""
    head, colon, _ = text.partition(":")
    return head if colon and " " not in head else None


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, NotFoundError)
    text = exc.render(API_WORDS)
    return problem(404, text, field=_named_field(text))


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ConflictError)
    text = exc.render(API_WORDS)
    return problem(409, text, field=_named_field(text))


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if not errors:
        return problem(422, "request: is invalid")
    field, detail = validation_detail(errors[0])
    if len(errors) > 1:  # the others named with their rules, so one round trip shows every fix
        others = list(dict.fromkeys(validation_detail(e)[1] for e in errors[1:]))
        named = "; ".join(others[:MORE_FIELDS_NAMED]) + ("; …" if len(others) > MORE_FIELDS_NAMED else "")
        detail += f" (and {len(errors) - 1} more: {named})"
    return problem(422, detail, field=field)


FASTAPI_BODY_ERROR = "There was an error parsing the body"
"""FastAPI's 400 for a body whose decoding failed other than as JSON or a :class:`BodyRefused`
(none is known: bytes that are not UTF-8 are a BodyRefused): answered as the 422 of any other
body that is not JSON."""


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
        return problem(422, "body: must be valid JSON (UTF-8)", field="body")
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail != _reason(status) else None
    # The path as decoded, not request.url.path: urlsplit drops a newline from it, so the 404
    # of /v1/runs:ack%0A named /v1/runs:ack, which exists.
    path = request.scope.get("path") or request.url.path
    raw_path = request.scope.get("raw_path") or b""
    if "\ufffd" in path and raw_path:  # invalid UTF-8 sent: name it as sent, never decoded lossily
        path = raw_path.decode("latin-1")
    trailing_slash = len(path) > 1 and raw_path.endswith(b"/")  # as sent: %2F is a name's slash, not the path's
    if status == 405 and trailing_slash:  # a route whose name takes "/" matched it with another method
        status, detail = 404, None
    if status == 404 and detail is None:
        detail = f"path: no such resource {clip(path)}"
        if trailing_slash:
            detail += f" (paths take no trailing slash: {clip(path.rstrip('/'))})"
    if status == 405 and detail is None:
        detail = f"method: {request.method} is not allowed on {clip(path)}"
    field = "body" if status == 413 else getattr(exc, "field", None)
    headers = dict(exc.headers or {}) if status == exc.status_code else {}
    return problem(status, detail, field=field, headers=headers)


def store_unavailable(path: str, exc: BaseException | None = None) -> JSONResponse:
    """503 with ``Retry-After: 1`` for a store that failed (logged, its password redacted)."""
    error = "" if exc is None else str(exc).strip()
    error = error.splitlines()[0] if error else type(exc).__name__
    logmod.event("api_store_error", logging.WARNING, path=path, error=logmod.redact(error))
    return problem(503, "store: unavailable, try again", headers={"Retry-After": "1"})


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return store_unavailable(request.url.path, exc)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logmod.event("api_internal_error", logging.ERROR, exc_info=True, path=request.url.path)
    return problem(500, "internal error (logged)")


def install(app: FastAPI) -> None:
    """Register the handlers above on ``app`` (most specific class first)."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ValidationError, _validation)
    app.add_exception_handler(ConfigError, _config)
    app.add_exception_handler(NotFoundError, _not_found)
    app.add_exception_handler(ConflictError, _conflict)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(StoreError, _store_unavailable)
    app.add_exception_handler(psycopg.OperationalError, _store_unavailable)
    app.add_exception_handler(psycopg.errors.ReadOnlySqlTransaction, _store_unavailable)  # a demoted primary
    app.add_exception_handler(PoolTimeout, _store_unavailable)
    app.add_exception_handler(Exception, _unexpected)
