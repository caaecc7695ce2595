"""Signatures of pushed requests (Stripe's webhook scheme; docs/delivery.md, "Push").

Every request the push loop sends carries::

    Scheduler-Signature: t=1767225600,v1=5257a869e7ec...,v1=9f1c0b...

``t`` is the signing instant in Unix seconds; each ``v1`` is the lower-case
hex HMAC-SHA256, keyed with one of the tenant's valid signing secrets (the
whole secret string, UTF-8), of ``"<t>." + body`` (the exact body bytes).
During a rotation the tenant has two (or more) valid secrets and the header
carries one ``v1`` per secret, newest first, so a receiver configured with
either the old or the new secret accepts the request.

A receiver written in Python checks a request with :func:`verify` (pure
standard-library code, no store or network access): at least
one ``v1`` must match one of the receiver's secrets (compared in constant
time) and ``t`` must lie within ``tolerance_s`` of the receiver's clock,
which refuses a captured request replayed later. Deduplicate retries by the
``Idempotency-Key`` header (the run id), not by the signature: each attempt
is signed anew.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections.abc import Sequence

from scheduler.errors import SchedulerError

HEADER = "Scheduler-Signature"
"""Name of the signature header."""

SCHEME = "v1"
"""The signature scheme's key in the header (HMAC-SHA256)."""

TOLERANCE_S = 300.0
"""Default largest difference between ``t`` and the receiver's clock (5 minutes, as Stripe)."""


class SignatureError(SchedulerError):
    """The request's signature header is missing, malformed, too old or matches no secret."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``"<timestamp>." + body`` keyed with ``secret`` (UTF-8)."""
    mac = _keyed(secret).copy()
    mac.update(str(int(timestamp)).encode("ascii") + b"." + body)
    return mac.hexdigest()


@functools.lru_cache(maxsize=1024)
def _keyed(secret: str) -> hmac.HMAC:
    """An HMAC-SHA256 keyed with ``secret`` and fed nothing, copied for each message: the key
    is set up once per secret. Not ``hmac.digest``: it releases the GIL at every call, and a
    node's push thread then waited up to the 5 ms switch interval for it back whenever
    another thread was running (measured: 5 ms per call beside one busy thread, 3 µs for a
    copy, which holds the GIL for a small message)."""
    return hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha256)


def sign(body: bytes, secrets: Sequence[str], timestamp: int) -> str:
    """The header value ``t=<timestamp>,v1=<sig>[,v1=<sig>...]``, one ``v1`` per secret in the given order.

    ``secrets`` are the tenant's valid secrets, newest first; ``timestamp``
    is Unix seconds. Raises ValueError if ``secrets`` is empty.
    """
    if not secrets:
        raise ValueError("sign: at least one secret is needed")
    return ",".join([f"t={int(timestamp)}", *(f"{SCHEME}={signature(s, timestamp, body)}" for s in secrets)])


def parse(header: str) -> tuple[int, list[str]]:
    """``(t, [v1 signatures])`` of a header value; raises SignatureError if malformed.

    Unknown keys (a future scheme) are ignored; ``t`` must be a whole number
    and appear once, and there must be at least one ``v1``.
    """
    timestamp: int | None = None
    found: list[str] = []
    for item in (header or "").split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            if timestamp is not None or not value.isascii() or not value.isdigit():
                raise SignatureError("signature header: t must appear once, as whole Unix seconds")
            timestamp = int(value)
        elif key == SCHEME:
            found.append(value)
    if timestamp is None:
        raise SignatureError("signature header: no t=<unix seconds>")
    if not found:
        raise SignatureError(f"signature header: no {SCHEME}=<signature>")
    return timestamp, found


def verify(
    header: str | None,
    body: bytes | bytearray | str,
    secrets: Sequence[str],
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> int:
    """Check a received request's ``Scheduler-Signature`` header; return its ``t`` (Unix seconds).

    ``body`` is the raw request body as received, before any JSON
    decoding: bytes (or a bytearray), or a str, which is encoded as UTF-8
    (the engine's bodies are UTF-8 JSON, so a framework's decoded text gives
    the same bytes back); any other type raises TypeError. ``secrets`` the receiver's secrets for the tenant (any
    number, e.g. old and new during a rotation); ``now`` the receiver's Unix
    time in seconds (default ``time.time()``). Raises SignatureError when the
    header is missing or malformed, when ``|now − t| > tolerance_s`` (a
    replay or a skewed clock), or when no ``v1`` matches any secret. Every
    comparison is constant-time (:func:`hmac.compare_digest`).
    """
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif isinstance(body, bytearray):
        body = bytes(body)
    elif not isinstance(body, bytes):
        raise TypeError(f"verify: body must be the raw request body, bytes or str (got {type(body).__name__})")
    if not header:
        raise SignatureError(f"{HEADER} header missing")
    timestamp, found = parse(header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError(f"signature timestamp {timestamp} is outside the tolerance of {tolerance_s:g}s")
    matched = False
    for secret in secrets:
        expected = signature(secret, timestamp, body)
        for candidate in found:
            # No early exit: the time taken does not tell which secret or position matched.
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureError("no signature matches a secret of this receiver")
    return timestamp
