"""Checks every request's path and query string before its endpoint reads them.

FastAPI (Starlette) decodes a percent-encoded path or query value that is not
UTF-8 lossily (``%FF`` becomes U+FFFD, so two different names reach the
endpoint as one) and passes NUL on (the store refuses it: a 500), and it
ignores a query parameter the endpoint does not declare (``?timezone=`` for
``tz`` answered as if absent). :func:`check_request_text` is installed as a
dependency of the whole application (it runs after routing, so it knows the
route's parameters, and after :class:`~scheduler.api.deps.Authenticate`, so a
request without a key still gets only a 401); it answers 422 naming the
parameter (``path`` parameters by their route name), before anything is read.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import Request

from scheduler.api.errors import ApiError
from scheduler.errors import UNSTORABLE_TEXT


def _decoded(raw: bytes, *, plus_is_space: bool = True) -> str | None:
    """``raw`` percent-decoded as UTF-8 (``+`` as a space in a query, not in a path); None if it
    is not UTF-8 or holds text the store cannot keep (NUL, an unpaired surrogate)."""
    try:
        text = unquote_to_bytes(raw.replace(b"+", b" ") if plus_is_space else raw).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if UNSTORABLE_TEXT.search(text) else text


def _refuse(field: str, rule: str) -> ApiError:
    return ApiError(422, "Unprocessable Content", f"{field}: {rule}", field=field)


def _query_names(route: Any) -> set[str]:
    """The query parameter names ``route`` takes: its endpoint's and its dependencies'."""
    names: set[str] = set()
    pending = [getattr(route, "dependant", None)]
    while pending:
        dependant = pending.pop()
        if dependant is None:
            continue
        names.update(param.alias for param in dependant.query_params)
        pending.extend(dependant.dependencies)
    return names


def check_request_text(request: Request) -> None:
    """Refuse (ApiError 422 naming the parameter) a request whose path or a query name or
    value is not UTF-8 or holds NUL or an unpaired surrogate once percent-decoded, or that
    names a query parameter its route does not take. Returns None for a good request."""
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode("utf-8", "surrogateescape")
    route = request.scope.get("route")
    if _decoded(raw_path, plus_is_space=False) is None:
        field = next(iter(request.path_params), "path")
        raise _refuse(field, "must be UTF-8 text with no NUL (percent-encoded bytes that are not UTF-8 are refused)")
    known = _query_names(route)
    for pair in request.scope.get("query_string", b"").split(b"&"):
        if not pair:
            continue
        raw_name, _, raw_value = pair.partition(b"=")
        name = _decoded(raw_name)
        if name is None:
            raise _refuse("query", "parameter names must be UTF-8 text with no NUL")
        if name not in known:
            raise _refuse(name[:80], f"is not a known parameter of {request.method} {getattr(route, 'path', '')}")
        if _decoded(raw_value) is None:
            raise _refuse(name, "must be UTF-8 text with no NUL")
