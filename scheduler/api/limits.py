"""Request limits of the HTTP API (docs/api.md, "Limits").

* :class:`BodyLimit`: an ASGI middleware refusing a body over the limit with
  413, on its ``Content-Length`` before reading and, for a streamed body
  (chunked, or a length that lies), as soon as the bytes read pass it;
* :class:`TokenBuckets`: token buckets by key (``rate_per_s`` tokens per
  second, at most ``burst``), optionally at most ``max_keys`` of them (the
  least recently used dropped first);
* :class:`RateLimiter`: each key's bucket; an empty bucket is a 429 with
  ``Retry-After`` (whole seconds, at least 1);
* :class:`AuthThrottle`: each client address's bucket of *failed*
  authentications (401s); once it is empty every request from that address
  is a 429 with ``Retry-After`` before its key is looked at, until a token is
  back. Other addresses are never affected. The address is the socket peer's,
  or the client's a trusted proxy forwards (``api_forwarded_allow_ips``,
  applied by uvicorn before the app sees the request); an IPv6 client is its
  /64 (one host's usual allocation).
* :func:`page_limit`: the ``limit`` of a list page, bounded.

Buckets live in the API process: a fleet of N API processes admits up to
N × each rate.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
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


MAX_AUTH_FAIL_CLIENTS = 50_000
"""Most client addresses :class:`AuthThrottle` keeps a bucket for (about 13 MB when full)."""


class TokenBuckets:
    """Token buckets by key: ``rate_per_s`` tokens per second, ``burst`` at most (a key never
    seen holds ``burst``). With ``max_keys``, at most that many buckets are kept: the least
    recently used is dropped (as if full) to make room. Thread-safe; ``clock`` is monotonic
    seconds (tests inject one)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        max_keys: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def _tokens(self, key: str, now: float) -> float:
        """``key``'s tokens at ``now`` (refilled since last seen); marks it most recently used."""
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        if key in self._buckets:
            self._buckets.move_to_end(key)
        return min(float(self.burst), tokens + max(0.0, now - last) * self.rate_per_s)

    def _store(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        if self.max_keys is not None and len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 if granted, else the seconds until one is available (> 0)."""
        now = self.clock()
        with self._lock:
            tokens = self._tokens(key, now)
            if tokens >= 1.0:
                self._store(key, tokens - 1.0, now)
                return 0.0
            self._store(key, tokens, now)
            return (1.0 - tokens) / self.rate_per_s

    def wait_s(self, key: str) -> float:
        """Seconds until ``key`` has a token (0.0: it has one now); takes nothing."""
        now = self.clock()
        with self._lock:
            if key not in self._buckets:
                return 0.0
            tokens = self._tokens(key, now)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate_per_s

    def __len__(self) -> int:
        """Buckets kept now."""
        with self._lock:
            return len(self._buckets)


def too_many(detail: str, wait_s: float) -> ApiError:
    """A 429 :class:`ApiError` with ``Retry-After``: ``wait_s`` rounded up to whole seconds, at least 1;
    ``detail`` is followed by ``; retry after N s``."""
    retry_after = max(1, math.ceil(wait_s))
    return ApiError(
        429, "Too Many Requests", f"{detail}; retry after {retry_after} s", headers={"Retry-After": str(retry_after)}
    )


class RateLimiter(TokenBuckets):
    """Per-key token buckets (one token per request): :meth:`check` refuses a request over the rate."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(rate_per_s, burst, clock=clock)

    def check(self, key: str) -> None:
        """Take a token for ``key`` or raise a 429 :class:`ApiError` with ``Retry-After`` (whole seconds ≥ 1)."""
        wait_s = self.take(key)
        if wait_s > 0:
            raise too_many(f"rate: this key may send {self.rate_per_s:g} requests/s (bursts of {self.burst})", wait_s)


class AuthThrottle:
    """Failed authentications per client address: ``burst`` at once, then ``rate_per_s``.

    :meth:`check` (before a request's key is looked at) raises a 429 while the
    address has no token; :meth:`failed` (after a 401) takes one. A request
    that authenticates takes nothing. At most ``max_clients`` addresses are
    kept (least recently used dropped first: an address dropped starts again
    with a full bucket). Thread-safe; ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        max_clients: int = MAX_AUTH_FAIL_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.buckets = TokenBuckets(rate_per_s, burst, max_keys=max_clients, clock=clock)

    @staticmethod
    def client_key(host: str | None) -> str:
        """The bucket of a client address: an IPv4 address as is (also when IPv4-mapped), an
        IPv6 address's /64, anything else (a unix socket, no address: None) as given."""
        if host is None:
            return ""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:
                return str(address.ipv4_mapped)
            return str(ipaddress.IPv6Network((address, 64), strict=False))
        return str(address)

    def wait_s(self, host: str | None) -> float:
        """Seconds until ``host`` may fail again (0.0: now)."""
        return self.buckets.wait_s(self.client_key(host))

    def check(self, host: str | None) -> None:
        """Raise a 429 :class:`ApiError` with ``Retry-After`` if ``host`` has no failure left now."""
        wait_s = self.wait_s(host)
        if wait_s > 0:
            raise too_many(
                f"auth: too many failed authentications from this address "
                f"({self.buckets.rate_per_s:g}/s, bursts of {self.buckets.burst})",
                wait_s,
            )

    def failed(self, host: str | None) -> None:
        """Count a failed authentication from ``host`` (a token taken, if one is left)."""
        self.buckets.take(self.client_key(host))

    def __len__(self) -> int:
        """Client addresses with a bucket kept now."""
        return len(self.buckets)


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
