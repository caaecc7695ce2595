"""Request limits of the HTTP API (docs/api.md, "Limits").

* :class:`BodyLimit`: an ASGI middleware refusing a body over the limit with
  413, on its ``Content-Length`` before reading and, for a streamed body
  (chunked, or a length that lies), as soon as the bytes read pass it;
* :class:`RateLimiter`: each key's token bucket (``rate_per_s`` tokens per
  second, at most ``burst``); an empty bucket is a 429 with ``Retry-After``
  (whole seconds, at least 1). Buckets live in the API process: a fleet of
  N API processes admits up to N × the rate per key.
* :func:`page_limit`: the ``limit`` of a list page, bounded.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.api.errors import ApiError, PayloadTooLarge, problem


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (Content-Length or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value.decode("latin-1").strip())
                except ValueError:
                    declared = None
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413, f"body: must be at most {self.max_bytes} bytes", field="body", headers={"Connection": "close"}
        )
        await response(scope, receive, send)


class RateLimiter:
    """Per-key token buckets: ``rate_per_s`` tokens per second, ``burst`` at most, one per request.

    Thread-safe. ``clock`` is monotonic seconds (tests inject one).
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 if granted, else the seconds until one is available (> 0)."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - last) * self.rate_per_s)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate_per_s

    def check(self, key: str) -> None:
        """Take a token for ``key`` or raise a 429 :class:`ApiError` with ``Retry-After`` (whole seconds ≥ 1)."""
        wait_s = self.take(key)
        if wait_s > 0:
            retry_after = max(1, math.ceil(wait_s))
            raise ApiError(
                429,
                "Too Many Requests",
                f"rate: this key may send {self.rate_per_s:g} requests/s (bursts of {self.burst}); "
                f"retry after {retry_after} s",
                headers={"Retry-After": str(retry_after)},
            )


def page_limit(limit: Any, default: int, maximum: int) -> int:
    """The ``limit`` of a list page: ``default`` when None, else a whole number from 1 to ``maximum``.

    Raises ValidationError (field ``limit``) in the CLI's words.
    """
    from scheduler.spec import parse_whole

    if limit is None:
        return default
    return parse_whole(
        "limit", limit, minimum=1, maximum=maximum, rule=f"must be a whole number from 1 to {maximum} in ASCII digits"
    )
