"""Where a job's runs go and what they carry: target, payload, retry and overlap policy.

A :class:`DeliverySpec` is the delivery half of a job as registered
(docs/delivery.md, "Targets"):

* the **target**: a queue of the job's tenant (``queue``, default
  ``default``; 1-100 characters of letters, digits and ``. _ -``) *or* an
  HTTP endpoint (``url``, ``method`` POST or PUT, ``headers``, a
  per-attempt ``timeout_s``, default 10 s), never both;
* the **payload**: JSON delivered with every attempt, at most
  :data:`MAX_PAYLOAD_BYTES` in its compact UTF-8 encoding;
* the **retry policy**: ``max_attempts`` (1-100, default 5),
  ``backoff_base_s`` and ``backoff_cap_s`` (default 1 s and 300 s,
  ``0 < base <= cap <= 86400``), ``max_age_s`` (unset, or 1 s to 30 days);
* the **overlap policy**: ``allow`` (default), ``forbid``, ``buffer_one``,
  ``replace``.

Storage (alembic revisions 0022 and 0023): ``jobs.queue`` (NULL for an
HTTP target) and ``jobs.overlap`` on the job row firing reads; everything
else in a ``job_delivery`` row, which exists only when something there is
not the default (:meth:`DeliverySpec.delivery_row`). Delivery is not part
of a job's schedule identity (:mod:`scheduler.identity`).

Validation is static here (:meth:`DeliverySpec.validated`: every rule but
where a URL's host resolves; an explicit port must be 1-65535); the SSRF rule that resolves the host
(:func:`scheduler.delivery.ssrf.check_url`) runs when the job is saved
(:func:`check_targets`, called by every write path of
:mod:`scheduler.jobs`). Every refusal is a
:class:`~scheduler.errors.ValidationError` naming the field and the rule,
one line, whatever the input (NaN, megabytes of text, bytes that are not
UTF-8, JSON nested thousands deep).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from scheduler.delivery.ssrf import AddressPolicy, check_url, shown_url, split_url
from scheduler.errors import ValidationError
from scheduler.spec import parse_decimal, parse_whole

DEFAULT_QUEUE = "default"
OVERLAP_POLICIES = ("allow", "forbid", "buffer_one", "replace")
DEFAULT_OVERLAP = "allow"
METHODS = ("POST", "PUT")
DEFAULT_METHOD = "POST"
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 300.0
DEFAULT_MAX_ATTEMPTS = 5
MAX_ATTEMPTS = 100
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_CAP_S = 300.0
MAX_BACKOFF_S = 86_400.0
MAX_AGE_S = 30 * 86_400
"""Longest ``max_age_s`` (30 days)."""
MAX_PAYLOAD_BYTES = 65_536
"""Largest payload: 64 kB in its compact UTF-8 JSON encoding."""
MAX_PAYLOAD_INPUT_BYTES = 1_048_576
"""Largest payload *input* (before compaction; a ``--payload-file`` is read no further)."""
MAX_PAYLOAD_DEPTH = 64
"""Deepest nesting of arrays and objects in a payload."""
MAX_HEADERS = 20
MAX_HEADER_NAME_LEN = 100
MAX_HEADER_VALUE_LEN = 4_096
RESERVED_HEADERS = (
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "idempotency-key",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
)
"""Header names (lower case) a job may not set: the engine sets them, or they break HTTP
framing; names starting with ``scheduler-`` (the engine's own headers) or ``content-``
(the body is always the engine's plain JSON: a ``Content-Encoding`` would lie about it)
are refused too."""

_QUEUE_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE_RE = re.compile(r"[\t\x20-\x7e]*")
_DURATION_RE = re.compile(r"(?:[0-9]{1,9}[dhms]){1,4}")
_DURATION_PART = re.compile(r"([0-9]+)([dhms])")
_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


@dataclasses.dataclass(frozen=True)
class DeliverySpec:
    """A job's target, payload, retry and overlap policy (see the module doc).

    Exactly one of ``queue`` and ``url``. ``headers`` are ``(name, value)``
    pairs ordered by lower-cased name (no two with the same name in any
    case); ``payload`` is the compact JSON text (``None``: no payload).
    ``method`` and ``timeout_s`` are set for a URL target and ``None`` for a
    queue. Durations in seconds. Build from user input with :meth:`build`;
    :meth:`validated` checks a spec built any other way.
    """

    queue: str | None = DEFAULT_QUEUE
    url: str | None = None
    method: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float | None = None
    payload: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S
    max_age_s: int | None = None
    overlap: str = DEFAULT_OVERLAP

    @classmethod
    def build(
        cls,
        *,
        queue: str | None = None,
        url: str | None = None,
        method: str | None = None,
        headers: Iterable[str] | Mapping[str, str] | None = None,
        timeout_s: Any = None,
        payload: str | bytes | None = None,
        max_attempts: Any = None,
        backoff_base_s: Any = None,
        backoff_cap_s: Any = None,
        max_age_s: Any = None,
        overlap: str | None = None,
    ) -> DeliverySpec:
        """Build and validate a spec from user input (CLI options, CSV columns); ``None`` = default.

        ``headers``: ``"Name: value"`` strings, or a mapping name → value.
        ``payload``: JSON text (str, or UTF-8 bytes); a JSON ``null`` means
        no payload. Numbers: ints/floats or strings of ASCII digits;
        ``max_age_s`` also as a duration (``90m``, ``12h``, ``7d``,
        ``1d12h``). ``method``, ``headers`` and ``timeout_s`` apply to a
        ``url`` target only. Static rules only: the URL's host is resolved
        when the job is saved (:func:`check_targets`). Raises
        ValidationError naming the field.
        """
        if queue is not None and url is not None:
            raise ValidationError("target", "give either {queue} or {url}, not both")
        if url is None:
            for field, value in (("method", method), ("header", headers or None), ("timeout_s", timeout_s)):
                if value is not None:
                    raise ValidationError(field, "applies to {url} targets only")
        spec = cls(
            queue=(DEFAULT_QUEUE if queue is None else queue) if url is None else None,
            url=url,
            method=(DEFAULT_METHOD if method is None else _method(method)) if url is not None else None,
            headers=parse_headers(headers) if headers is not None else (),
            timeout_s=(DEFAULT_TIMEOUT_S if timeout_s is None else parse_timeout(timeout_s))
            if url is not None
            else None,
            payload=None if payload is None else parse_payload(payload),
            max_attempts=DEFAULT_MAX_ATTEMPTS if max_attempts is None else parse_max_attempts(max_attempts),
            backoff_base_s=(
                DEFAULT_BACKOFF_BASE_S if backoff_base_s is None else parse_backoff("backoff_base_s", backoff_base_s)
            ),
            backoff_cap_s=(
                DEFAULT_BACKOFF_CAP_S if backoff_cap_s is None else parse_backoff("backoff_cap_s", backoff_cap_s)
            ),
            max_age_s=None if max_age_s is None else parse_max_age(max_age_s),
            overlap=DEFAULT_OVERLAP if overlap is None else overlap,
        )
        if spec.backoff_base_s > spec.backoff_cap_s:  # blame what was given, echoed as given
            if backoff_base_s is None:
                raise ValidationError(
                    "backoff_cap_s",
                    f"must not be below {{backoff_base_s}} ({_num(spec.backoff_base_s)} s, its default)",
                    backoff_cap_s,
                )
            raise _base_above_cap(spec.backoff_cap_s, backoff_base_s)
        return spec.validated()

    def validated(self) -> DeliverySpec:
        """Check every field (not where the URL resolves); return self. Raises ValidationError."""
        if (self.queue is None) == (self.url is None):
            raise ValidationError("target", "give exactly one of {queue} or {url}")
        if self.queue is not None:
            validate_queue(self.queue)
            for field, value in (("method", self.method), ("timeout_s", self.timeout_s)):
                if value is not None:
                    raise ValidationError(field, "applies to {url} targets only")
            if self.headers:
                raise ValidationError("header", "applies to {url} targets only")
        else:
            split_url(self.url, "url")
            _check_port(self.url)
            if "#" in self.url:
                raise ValidationError(
                    "url", "must not carry a #fragment (it is never sent to the endpoint)", shown_url(self.url)
                )
            if self.method not in METHODS:
                raise ValidationError("method", f"must be one of {', '.join(METHODS)}", self.method)
            _check_timeout(self.timeout_s)
            _check_headers(self.headers)
        if self.payload is not None and (not isinstance(self.payload, str) or parse_payload(self.payload) is None):
            raise ValidationError("payload", "must be JSON text other than null (None is no payload)")
        parse_max_attempts(self.max_attempts)
        for field, value in (("backoff_base_s", self.backoff_base_s), ("backoff_cap_s", self.backoff_cap_s)):
            _check_backoff(field, value)
        if self.backoff_base_s > self.backoff_cap_s:
            raise _base_above_cap(self.backoff_cap_s, self.backoff_base_s)
        if self.max_age_s is not None:
            parse_max_age(self.max_age_s)
        if self.overlap not in OVERLAP_POLICIES:
            raise ValidationError("overlap", f"must be one of {', '.join(OVERLAP_POLICIES)}", self.overlap)
        return self

    # ------------------------------------------------------------ storage

    def job_fields(self) -> dict[str, Any]:
        """The ``jobs`` columns this spec sets: ``queue`` (``None`` for a URL target) and ``overlap``."""
        return {"queue": self.queue, "overlap": self.overlap}

    def delivery_row(self) -> dict[str, Any] | None:
        """Parameters of the ``job_delivery`` row (without the key), or ``None`` when
        everything there is the default (a queue target, no payload, the default
        retry policy): such a job has no row.

        ``headers`` and ``payload`` are JSON texts (``headers`` an object
        name → value, ``None`` without headers).
        """
        if (
            self.url is None
            and self.payload is None
            and self.max_attempts == DEFAULT_MAX_ATTEMPTS
            and self.backoff_base_s == DEFAULT_BACKOFF_BASE_S
            and self.backoff_cap_s == DEFAULT_BACKOFF_CAP_S
            and self.max_age_s is None
        ):
            return None
        return {
            "url": self.url,
            "method": self.method,
            "headers": json.dumps(dict(self.headers), ensure_ascii=False) if self.headers else None,
            "timeout_s": self.timeout_s,
            "payload": self.payload,
            "max_attempts": self.max_attempts,
            "backoff_base_s": self.backoff_base_s,
            "backoff_cap_s": self.backoff_cap_s,
            "max_age_s": self.max_age_s,
        }

    @classmethod
    def from_rows(cls, job: Mapping[str, Any], delivery: Mapping[str, Any] | None) -> DeliverySpec:
        """The spec a stored job has: its ``jobs`` row (``queue``, ``overlap``) and its
        ``job_delivery`` row or ``None`` (JSONB columns decoded, as psycopg returns them).
        Not validated (a row is what was validated when saved)."""
        overlap = job.get("overlap") or DEFAULT_OVERLAP
        if delivery is None:
            return cls(queue=job.get("queue"), overlap=overlap)
        headers = delivery.get("headers") or {}
        payload = delivery.get("payload")
        return cls(
            queue=job.get("queue"),
            url=delivery.get("url"),
            method=delivery.get("method"),
            headers=tuple(sorted(((str(k), str(v)) for k, v in headers.items()), key=lambda kv: kv[0].lower())),
            timeout_s=delivery.get("timeout_s"),
            payload=None if payload is None else _compact(payload),
            max_attempts=delivery["max_attempts"],
            backoff_base_s=delivery["backoff_base_s"],
            backoff_cap_s=delivery["backoff_cap_s"],
            max_age_s=delivery.get("max_age_s"),
            overlap=overlap,
        )

    def same_as(self, other: DeliverySpec) -> bool:
        """True if ``other`` is this spec: every field equal, payloads equal as JSON values
        (the store keeps ``1e2`` as ``100.0``, object keys in its own order)."""
        if dataclasses.replace(self, payload=None) != dataclasses.replace(other, payload=None):
            return False
        if self.payload is None or other.payload is None:
            return self.payload == other.payload
        return _json_key(self.payload) == _json_key(other.payload)

    def describe(self) -> dict[str, Any]:
        """A printable view for ``jobs show``: target, header *names* only (values may be
        secrets), the payload decoded, the retry and overlap policy."""
        out: dict[str, Any] = {"target": self.target_text()}
        if self.url is not None:
            out.update(
                url=self.url,
                method=self.method,
                header_names=[name for name, _ in self.headers],
                timeout_s=self.timeout_s,
            )
        else:
            out["queue"] = self.queue
        out.update(
            payload=None if self.payload is None else json.loads(self.payload),
            max_attempts=self.max_attempts,
            backoff_base_s=self.backoff_base_s,
            backoff_cap_s=self.backoff_cap_s,
            max_age_s=self.max_age_s,
            overlap=self.overlap,
        )
        return out

    def target_text(self) -> str:
        """``queue <name>`` or ``<METHOD> <scheme>://<host>[:port]`` (no path or query, which
        may carry a token): short, for listings."""
        if self.url is None:
            return f"queue {self.queue}"
        scheme, host, port = split_url(self.url)
        default = 443 if scheme == "https" else 80
        host = f"[{host}]" if ":" in host else host
        return f"{self.method} {scheme}://{host}{'' if port == default else f':{port}'}"


def target_text(job: Mapping[str, Any]) -> str:
    """The target of a ``jobs`` row (``queue`` column, and ``url``/``method`` if the
    listing joined them), as :meth:`DeliverySpec.target_text` shows it."""
    if job.get("queue") is not None:
        return f"queue {job['queue']}"
    if job.get("url") is None:
        return "url"
    try:
        return DeliverySpec(queue=None, url=job["url"], method=job.get("method") or DEFAULT_METHOD).target_text()
    except ValidationError:
        return "url"


# ---------------------------------------------------------------- fields


def validate_queue(queue: Any) -> str:
    """Return ``queue`` if it is 1-100 characters of ASCII letters, digits and ``. _ -``;
    raises ValidationError (field ``queue``)."""
    if not isinstance(queue, str) or not _QUEUE_RE.fullmatch(queue):
        raise ValidationError("queue", "must be 1-100 characters of letters, digits and . _ -", queue)
    return queue


def _check_port(url: str) -> None:
    """Refuse an explicit port 0 (``http://host:0/``; :func:`~scheduler.delivery.ssrf.split_url`
    has already refused a malformed port or one above 65535). Raises ValidationError (field ``url``)."""
    if urlsplit(url).port == 0:
        raise ValidationError("url", "port must be 1-65535", shown_url(url))


def _method(value: Any) -> str:
    text = value.strip().upper() if isinstance(value, str) else value
    if text not in METHODS:
        raise ValidationError("method", f"must be one of {', '.join(METHODS)}", value)
    return text


def parse_headers(headers: Iterable[str] | Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``(name, value)`` pairs, ordered by lower-cased name, from ``"Name: value"`` strings
    or a mapping. Surrounding spaces of a value are dropped.

    Rules (field ``header``): at most :data:`MAX_HEADERS`; a name is an
    HTTP token (letters, digits and ``!#$%&'*+.^_`|~-``) of at most
    :data:`MAX_HEADER_NAME_LEN` characters, not one the engine sets or that
    breaks HTTP (:data:`RESERVED_HEADERS`, ``Scheduler-*``), not given
    twice (in any case); a value is at most :data:`MAX_HEADER_VALUE_LEN`
    characters of printable ASCII or tabs (no CR, LF or other control
    character). An error echoes the name, never the value (it may be a
    secret).
    """
    if isinstance(headers, Mapping):
        pairs = [(name, value) for name, value in headers.items()]
    else:
        if isinstance(headers, (str, bytes)):
            headers = [headers]  # type: ignore[list-item]
        pairs = []
        for item in headers:
            if not isinstance(item, str) or ":" not in item:
                raise ValidationError("header", "must be 'Name: value'", _header_echo(item))
            name, _, value = item.partition(":")
            pairs.append((name, value))
            if len(pairs) > MAX_HEADERS:
                break
    out = tuple(
        sorted(
            ((name, value.strip(" \t") if isinstance(value, str) else value) for name, value in pairs),
            key=lambda kv: str(kv[0]).lower(),
        )
    )
    _check_headers(out)
    return out


def _header_echo(item: Any) -> Any:
    """What an error may echo of a header: its name part only (without a colon, the
    first word: ``Authorization Bearer s3cret`` echoes ``Authorization``)."""
    if isinstance(item, str):
        return item.partition(":")[0] if ":" in item else (item.split(None, 1) or [""])[0][:40]
    return type(item).__name__


def _check_headers(headers: Sequence[tuple[str, str]]) -> None:
    if len(headers) > MAX_HEADERS:
        raise ValidationError("header", f"at most {MAX_HEADERS} headers", f"{len(headers)} or more")
    seen: set[str] = set()
    for name, value in headers:
        if not isinstance(name, str) or len(name) > MAX_HEADER_NAME_LEN or not _TOKEN_RE.fullmatch(name):
            raise ValidationError(
                "header",
                f"name must be 1-{MAX_HEADER_NAME_LEN} characters of letters, digits and !#$%&'*+.^_`|~-",
                name,
            )
        lower = name.lower()
        if lower in RESERVED_HEADERS or lower.startswith(("scheduler-", "content-")):
            raise ValidationError(
                "header", "name is set by the engine or breaks HTTP (Host, Content-*, Scheduler-*, ...)", name
            )
        if lower in seen:
            raise ValidationError("header", "name given twice", name)
        seen.add(lower)
        if not isinstance(value, str):
            raise ValidationError("header", f"value of {name} must be a string (text), not a number, list or null")
        if len(value) > MAX_HEADER_VALUE_LEN or not _HEADER_VALUE_RE.fullmatch(value):
            raise ValidationError(
                "header",
                f"value of {name} must be at most {MAX_HEADER_VALUE_LEN} characters of printable ASCII "
                "(no CR, LF or other control characters)",
            )


def parse_timeout(value: Any) -> float:
    """A per-attempt timeout in seconds, ``0 < t <= 300``; raises ValidationError (field ``timeout_s``)."""
    number = parse_decimal("timeout_s", value, rule=_TIMEOUT_RULE)
    _check_timeout(number, value)
    return number


_TIMEOUT_RULE = f"must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}, in ASCII digits"


def _check_timeout(number: Any, given: Any = None) -> None:
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number <= MAX_TIMEOUT_S:
        raise ValidationError("timeout_s", _TIMEOUT_RULE, number if given is None else given)


def parse_max_attempts(value: Any) -> int:
    """Attempts of a run, 1-100; raises ValidationError (field ``max_attempts``)."""
    return parse_whole(
        "max_attempts",
        value,
        minimum=1,
        maximum=MAX_ATTEMPTS,
        rule=f"must be a whole number from 1 to {MAX_ATTEMPTS} in ASCII digits",
    )


def parse_backoff(field: str, value: Any) -> float:
    """A backoff base or cap in seconds, ``0 < s <= 86400``; raises ValidationError naming ``field``."""
    number = parse_decimal(field, value, rule=_BACKOFF_RULE)
    _check_backoff(field, number, value)
    return number


_BACKOFF_RULE = f"must be a number of seconds above 0 and at most {MAX_BACKOFF_S:g}, in ASCII digits"


def _check_backoff(field: str, number: Any, given: Any = None) -> None:
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number <= MAX_BACKOFF_S:
        raise ValidationError(field, _BACKOFF_RULE, number if given is None else given)


def _base_above_cap(cap_s: float, given: Any) -> ValidationError:
    return ValidationError("backoff_base_s", f"must not exceed {{backoff_cap_s}} ({_num(cap_s)} s)", given)


_MAX_AGE_RULE = (
    f"must be a duration from 1 second to 30 days ({MAX_AGE_S} s): whole seconds, "
    "or e.g. 90m, 12h, 7d, 1d12h (ASCII digits)"
)


def parse_max_age(value: Any) -> int:
    """``max_age_s`` in whole seconds from an int, a string of ASCII digits or a duration
    (``d``, ``h``, ``m``, ``s`` parts, e.g. ``1d12h``), 1 s to 30 days; raises
    ValidationError (field ``max_age_s``)."""
    if isinstance(value, str) and _DURATION_RE.fullmatch(value.strip(" \t").lower()):
        seconds = sum(int(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value.strip(" \t").lower()))
        if not 1 <= seconds <= MAX_AGE_S:
            raise ValidationError("max_age_s", _MAX_AGE_RULE, value)
        return seconds
    return parse_whole("max_age_s", value, minimum=1, maximum=MAX_AGE_S, rule=_MAX_AGE_RULE)


def _num(value: float) -> str:
    return f"{value:g}"


# ---------------------------------------------------------------- payload


def _refuse_constant(name: str) -> Any:
    raise ValidationError("payload", "must be valid JSON (NaN and Infinity are not JSON)", name)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of a payload; a key given twice is refused (JSON would silently keep the last)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValidationError("payload", "must not give an object key twice", key)
        obj[key] = value
    return obj


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValidationError("payload", "numbers must be finite double-precision values", text[:40])
    return number


def _bounded_int(text: str) -> int:
    """A JSON integer, refused past Python's integer-conversion limit (4,300 digits by default,
    ``sys.get_int_max_str_digits``), which would otherwise raise a bare ValueError."""
    limit = sys.get_int_max_str_digits()
    if limit and len(text.lstrip("-")) > limit:
        raise ValidationError("payload", f"numbers must have at most {limit} digits", text[:20] + "...")
    return int(text)


def parse_payload(payload: str | bytes) -> str | None:
    """The compact JSON text (``,``/``:`` separators, non-ASCII kept) of a payload given as
    JSON text or UTF-8 bytes; ``None`` for a JSON ``null`` (no payload).

    Rules (field ``payload``): UTF-8 text of at most
    :data:`MAX_PAYLOAD_INPUT_BYTES`; valid JSON (no NaN/Infinity, numbers
    finite as doubles, integers of at most 4,300 digits); no object giving a key twice, at any level (the
    message echoes the key); arrays and objects nested at most
    :data:`MAX_PAYLOAD_DEPTH` deep; no ``\\u0000`` and no unpaired surrogate
    in a string (the store cannot keep them); at most
    :data:`MAX_PAYLOAD_BYTES` (64 kB) in the compact UTF-8 encoding — the
    message gives the size. Raises ValidationError.
    """
    if isinstance(payload, bytes):
        if len(payload) > MAX_PAYLOAD_INPUT_BYTES:
            raise _input_too_large(len(payload))
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError("payload", f"must be UTF-8 text (bad byte at offset {exc.start})") from None
    if not isinstance(payload, str):
        raise ValidationError("payload", "must be JSON text", type(payload).__name__)
    if len(payload) > MAX_PAYLOAD_INPUT_BYTES:
        raise _input_too_large(len(payload))
    try:
        value = json.loads(
            payload,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise ValidationError(
            "payload", f"must be valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise ValidationError("payload", f"must nest arrays and objects at most {MAX_PAYLOAD_DEPTH} deep") from None
    if value is None:
        return None
    _check_tree(value)
    text = _compact(value)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError("payload", "must be valid Unicode (an unpaired surrogate escape, e.g. \\ud800)") from None
    if size > MAX_PAYLOAD_BYTES:
        raise ValidationError(
            "payload",
            f"is {size:,} bytes as compact UTF-8 JSON; the limit is {MAX_PAYLOAD_BYTES:,} bytes (64 kB)",
        )
    return text


def _input_too_large(size: int) -> ValidationError:
    return ValidationError(
        "payload",
        f"input is {size:,} bytes or characters; at most {MAX_PAYLOAD_INPUT_BYTES:,} are read "
        f"(and the compact JSON may be at most {MAX_PAYLOAD_BYTES:,} bytes)",
    )


def _check_tree(value: Any) -> None:
    """Depth and string rules of :func:`parse_payload`, walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_PAYLOAD_DEPTH:
                raise ValidationError("payload", f"must nest arrays and objects at most {MAX_PAYLOAD_DEPTH} deep")
            children = list(item.items()) if isinstance(item, dict) else [(None, v) for v in item]
            for key, child in children:
                if key is not None:
                    _check_string(key)
                stack.append((child, depth + 1))
        elif isinstance(item, str):
            _check_string(item)


def _check_string(text: str) -> None:
    if "\x00" in text:
        raise ValidationError("payload", "strings must not contain \\u0000 (the store cannot keep it)")


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _normalize(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def _json_key(text: str) -> Any:
    """A payload as a comparable value: numbers as normalized decimals (1e2 == 100 == 100.0)."""
    return _normalize(json.loads(text, parse_float=Decimal, parse_int=Decimal))


# ---------------------------------------------------------------- save-time SSRF


def check_targets(
    specs: Iterable[DeliverySpec],
    policy: AddressPolicy,
    *,
    resolve: Callable[[str, int], list[str]] | None = None,
) -> None:
    """The save-time SSRF rule for every URL target of ``specs``
    (:func:`scheduler.delivery.ssrf.check_url`; each distinct URL resolved
    once). Raises ValidationError (field ``url``) for the first refused.
    """
    seen: set[str] = set()
    for spec in specs:
        if spec.url is None or spec.url in seen:
            continue
        seen.add(spec.url)
        if resolve is None:
            check_url(spec.url, policy, field="url")
        else:
            check_url(spec.url, policy, field="url", resolve=resolve)
