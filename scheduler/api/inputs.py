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

Request bodies: every route of the API is a :class:`JsonRoute`, whose
requests decode a JSON body with :func:`decode_body` instead of a plain
``json.loads``: a key given twice in one object (``{"interval_s": 60,
"interval_s": 61}``, which ``json.loads`` reads as 61) and a body nesting
arrays and objects deeper than :data:`MAX_BODY_DEPTH` are refused with a 422
naming the key or the body, so nothing is silently dropped and the rule is
the same at any depth (Python's own limit is its recursion limit).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import Request, Response
from fastapi.routing import APIRoute

from scheduler.api.errors import ApiError, BodyRefused
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


MAX_BODY_DEPTH = 128
"""How deep a request body may nest arrays and objects (a schedule's ``payload``, itself at
most 64 deep, sits one level down)."""


class _Pairs(dict):
    """A decoded JSON object that named ``duplicate`` more than once (:func:`decode_body` refuses it)."""

    duplicate: str | None = None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = _Pairs(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
    return obj


def _path(path: str, part: str | int) -> str:
    """The field path of ``part`` below ``path`` as errors name fields: ``items[0].name``."""
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def decode_body(body: bytes) -> Any:
    """The JSON value of a request ``body`` (bytes, UTF-8), every object a plain ``dict``.

    Raises :class:`BodyRefused` (a 422) for an object naming a key twice (``field`` the key's
    path, e.g. ``payload.b.c``) or a value nesting arrays and objects deeper than
    :data:`MAX_BODY_DEPTH` (``field`` ``body``); ``json.JSONDecodeError`` for text that is not
    JSON and ``UnicodeDecodeError`` for bytes that are not text, as ``json.loads`` does.
    """
    too_deep = BodyRefused("body", f"must nest arrays and objects at most {MAX_BODY_DEPTH} deep")
    try:
        value = json.loads(body, object_pairs_hook=_object)
    except RecursionError:
        raise too_deep from None
    # Depth first, in the order written: the first duplicate key found is the first written.
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, (dict, list)) and depth > MAX_BODY_DEPTH:
            raise too_deep
        if isinstance(node, _Pairs) and node.duplicate is not None:
            field = _path(path, node.duplicate)
            raise BodyRefused(field, "must appear once in its object (a duplicate JSON key)")
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((child, _path(path, key), depth + 1) for key, child in reversed(list(children)))
    return value


class JsonRequest(Request):
    """A request whose JSON body is decoded by :func:`decode_body`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = decode_body(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """The API's route class (every router's ``route_class``): its endpoint sees a :class:`JsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive, request._send))

        return route_handler
