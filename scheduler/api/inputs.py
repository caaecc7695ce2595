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
A query parameter given twice (``?limit=5&limit=6``, which FastAPI reads as
the last) is refused the same way, on every endpoint.

Names in paths (a schedule's, a tenant's) are matched by :class:`PathName`
(``{name:path_name}``), which takes ``/``: the router matches the decoded path,
so ``PUT /v1/schedules/a%2Fb`` reaches the endpoint and the name rule's 422
instead of being no route's path (a 404).

Request bodies: every route of the API is a :class:`JsonRoute`, whose
requests decode a JSON body with :func:`decode_body` instead of a plain
``json.loads``: a key given twice in one object (``{"interval_s": 60,
"interval_s": 61}``, which ``json.loads`` reads as 61) and a body nesting
arrays and objects deeper than :data:`MAX_BODY_DEPTH` are refused with a 422
naming the key or the body, so nothing is silently dropped and the rule is
the same at any depth (Python's own limit is its recursion limit). The body is
decoded strictly as UTF-8 first (``json.loads`` of bytes guesses UTF-16 and
UTF-32); ``NaN``/``Infinity`` literals and numbers infinite as doubles, and
numbers over :data:`MAX_NUMBER_DIGITS` digits (which Python will not convert)
are refused while decoding, naming where they are.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

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


class PathName(Convertor[str]):
    """A name in a path (``{name:path_name}``): one or more of any characters, ``/`` included.

    The router matches the percent-decoded path, where a name's ``%2F`` is a ``/`` like the
    path's own: matched as one segment (Starlette's default), ``PUT /v1/schedules/a%2Fb`` was
    no route's path, a 404 naming ``/v1/schedules/a/b``. Taken whole, the name reaches its
    endpoint and its own rule (a schedule name's 422, a tenant name's ``c/team``). A path
    sent ending in ``/`` stays the 404 of a trailing slash (:func:`check_request_text`)."""

    regex = "[\\s\\S]+"  # any character, a newline too (``.`` stops at one): it meets the name's rule

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("path_name", PathName())


def _refuse(field: str, rule: str) -> ApiError:
    return ApiError(422, "Unprocessable Content", f"{field}: {rule}", field=field)


_CONVERTER = re.compile(r"\{(\w+):\w+\}")
"""A path parameter's converter in a route's path (``{name:path_name}``), left out where a message names the route."""


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
    names a query parameter its route does not take or names one twice; a path sent ending
    in ``/`` (matched by a :class:`PathName` parameter) or in a newline (a route matches
    the path without it: Starlette's patterns end in ``$``) is a 404
    (StarletteHTTPException), as an unmatched one. Returns None for a good request."""
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode("utf-8", "surrogateescape")
    route = request.scope.get("route")
    if _decoded(raw_path, plus_is_space=False) is None:
        field = next(iter(request.path_params), "path")
        raise _refuse(field, "must be UTF-8 text with no NUL (percent-encoded bytes that are not UTF-8 are refused)")
    if raw_path.endswith(b"/"):  # a route taking "/" in a parameter matched; paths take none at the end
        raise StarletteHTTPException(404)
    if request.scope["path"].endswith("\n"):
        # The route's pattern ends in "$", which Python's re also matches before a final
        # newline: DELETE /v1/schedules/a%0A matched with the name "a" and deleted it.
        raise StarletteHTTPException(404)
    known = _query_names(route)
    given: set[str] = set()
    for pair in request.scope.get("query_string", b"").split(b"&"):
        if not pair:
            continue
        raw_name, _, raw_value = pair.partition(b"=")
        name = _decoded(raw_name)
        if name is None:
            raise _refuse("query", "parameter names must be UTF-8 text with no NUL")
        if name not in known:
            path = _CONVERTER.sub(r"{\1}", getattr(route, "path", ""))  # {name:path_name} -> {name}
            raise _refuse(name[:80], f"is not a known parameter of {request.method} {path}")
        if _decoded(raw_value) is None:
            raise _refuse(name, "must be UTF-8 text with no NUL")
        if name in given:
            raise _refuse(name, "must be given once (a repeated query parameter)")
        given.add(name)


MAX_BODY_DEPTH = 128
"""How deep a request body may nest arrays and objects (a schedule's ``payload``, itself at
most 64 deep, sits one level down)."""


MAX_NUMBER_DIGITS = 4300
"""Most digits a JSON number in a request body may be written with (Python's own limit on
converting a decimal integer; a longer one is valid JSON, refused by this rule, naming it)."""

NON_FINITE_RULE = "must be a finite number (NaN and Infinity are not JSON, nor a number beyond a double such as 1e400)"
"""The rule a ``NaN``, ``Infinity`` or ``-Infinity`` literal, or a number that is infinite as a
double (``1e400``), breaks: refused while the body is decoded, wherever it is."""

_BOM = b"\xef\xbb\xbf"


class _Pairs(dict):
    """A decoded JSON object that named ``duplicate`` more than once (:func:`decode_body` refuses it)."""

    duplicate: str | None = None


class _Refused:
    """A JSON value that breaks ``rule`` (decoded in its place; :func:`decode_body` refuses it,
    naming where it was)."""

    def __init__(self, rule: str) -> None:
        self.rule = rule


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = _Pairs(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
    return obj


def _too_many_digits(text: str) -> _Refused | None:
    if sum(c.isdigit() for c in text) > MAX_NUMBER_DIGITS:
        return _Refused(f"must be a number of at most {MAX_NUMBER_DIGITS} digits")
    return None


def _int(text: str) -> int | _Refused:
    return _too_many_digits(text) or int(text)


def _float(text: str) -> float | _Refused:
    refused = _too_many_digits(text)
    if refused is not None:
        return refused
    number = float(text)
    return number if math.isfinite(number) else _Refused(f"{NON_FINITE_RULE} (got {text})")


def _constant(name: str) -> _Refused:
    return _Refused(f"{NON_FINITE_RULE} (got {name})")


def _path(path: str, part: str | int) -> str:
    """The field path of ``part`` below ``path`` as errors name fields: ``items[0].name``."""
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def decode_body(body: bytes) -> Any:
    """The JSON value of a request ``body`` (bytes, UTF-8), every object a plain ``dict``.

    The bytes are decoded strictly as UTF-8 (one leading UTF-8 byte order mark is ignored, as
    RFC 8259 allows; UTF-16 and UTF-32, which ``json.loads`` of bytes would guess, are not
    UTF-8). Raises :class:`BodyRefused` (a 422) for bytes that are not UTF-8 (``field``
    ``body``, the detail naming the first bad byte and its offset), an object naming a key
    twice (``field`` the key's path, e.g. ``payload.b.c``), a ``NaN``/``Infinity``/``-Infinity``
    literal or a number infinite as a double (``1e400``; :data:`NON_FINITE_RULE`) or written
    with more than :data:`MAX_NUMBER_DIGITS` digits (``field`` the value's path; ``body``
    for the body itself), or a value nesting arrays and objects deeper than
    :data:`MAX_BODY_DEPTH` (``field`` ``body``); ``json.JSONDecodeError`` for text that is
    not JSON, as ``json.loads`` does. The first fault in the order written is the one named.
    """
    try:
        text = body.removeprefix(_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = exc.start + (len(_BOM) if body.startswith(_BOM) else 0)
        bad = body[offset]
        raise BodyRefused(
            "body", f"must be valid JSON (UTF-8): byte 0x{bad:02x} at offset {offset} is not UTF-8"
        ) from None
    too_deep = BodyRefused("body", f"must nest arrays and objects at most {MAX_BODY_DEPTH} deep")
    try:
        value = json.loads(
            text, object_pairs_hook=_object, parse_int=_int, parse_float=_float, parse_constant=_constant
        )
    except RecursionError:
        raise too_deep from None
    # Depth first, in the order written: the first duplicate key found is the first written.
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, _Refused):
            raise BodyRefused(path or "body", node.rule)
        if isinstance(node, (dict, list)) and depth > MAX_BODY_DEPTH:
            raise too_deep
        if isinstance(node, _Pairs) and node.duplicate is not None:
            field = _path(path, node.duplicate)
            raise BodyRefused(field, "must appear once in its object (a duplicate JSON key)")
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((child, _path(path, key), depth + 1) for key, child in reversed(list(children)))
    return value


JSON_WHITESPACE = b" \t\r\n"
"""What RFC 8259 counts as whitespace around a JSON value."""


class JsonRequest(Request):
    """A request whose JSON body is decoded by :func:`decode_body`; a body of JSON whitespace
    alone counts as none (as an empty one), on every endpoint."""

    async def body(self) -> bytes:
        raw = await super().body()
        return raw if raw.strip(JSON_WHITESPACE) else b""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = decode_body(await self.body())
        return self._json


NO_BODY_RULE = "this endpoint takes no body (send none, or {})"
"""Why a body sent to an endpoint that takes none is refused (:class:`JsonRoute`)."""


async def refuse_unexpected_body(request: JsonRequest) -> None:
    """Raise :class:`BodyRefused` (field ``body``, :data:`NO_BODY_RULE`) unless the request's
    body is empty, whitespace, ``{}`` or ``null``: what a client sends when it means no body.
    Anything else (a field the caller thinks it set, text that is not JSON) would be ignored,
    so it is refused instead. A body that is not UTF-8 is refused as :func:`decode_body` does."""
    body = await request.body()
    if not body:
        return
    try:
        value = decode_body(body)
    except json.JSONDecodeError:
        raise BodyRefused("body", NO_BODY_RULE) from None
    if value not in ({}, None):
        raise BodyRefused("body", NO_BODY_RULE)


class JsonRoute(APIRoute):
    """The API's route class (every router's ``route_class``): its endpoint sees a :class:`JsonRequest`;
    an endpoint that takes no body refuses one (:func:`refuse_unexpected_body`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def route_handler(request: Request) -> Response:
            json_request = JsonRequest(request.scope, request.receive, request._send)
            if not takes_body and request.method in ("POST", "PUT", "PATCH", "DELETE"):
                await refuse_unexpected_body(json_request)
            return await handler(json_request)

        return route_handler
