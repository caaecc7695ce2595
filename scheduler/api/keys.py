"""API keys of the tenant HTTP API (table ``api_keys``; docs/api.md, "Keys").

A token is ``tk_<key_id>_<secret>``: ``key_id`` is 16 random hex characters
(the public part, shown by ``keys list``), ``secret`` the URL-safe base64
(43 characters, no padding) of 32 random bytes. The store keeps only the
SHA-256 of the 32 secret bytes: the secret has 256 bits of entropy, so a
fast hash is the standard choice (as for GitHub or Stripe tokens) and a
slow password hash would only cost every request. Hashes are compared with
:func:`hmac.compare_digest`.

Roles: ``admin`` (no tenant: manages tenants, keys, status, verify),
``tenant`` (its tenant's schedules and runs), ``worker`` (claims and acks its
tenant's runs). :func:`create` returns the token once; it cannot be read
back. :func:`revoke` takes effect within :data:`CACHE_TTL_S` (the
:class:`KeyVerifier`'s cache) in every API process.

Tokens and hashes never appear in logs, errors or ``list`` output.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import logging
import re
import secrets as _random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Literal

import psycopg

from scheduler import log, store
from scheduler.errors import ConflictError, NotFoundError, StoreError, ValidationError, clip
from scheduler.spec import validate_tenant

ROLES = ("admin", "tenant", "worker")
"""Roles a key can have."""

Role = Literal["admin", "tenant", "worker"]

PREFIX = "tk_"
"""Every token starts with this (recognizable in a secret scanner or a config file)."""

CACHE_TTL_S = 1.0
"""How long a :class:`KeyVerifier` reuses a key row it read: a revocation is honoured within this."""

KNOWN_GOOD_S = 600.0
"""How long a key that authenticated stays *known good* to a :class:`KeyVerifier`
(seconds): while a client address is over its budget of failed authentications
(:class:`scheduler.api.limits.AuthThrottle`), a known-good key is still checked and
served, every other request from that address refused unread (docs/api.md, Limits)."""

MAX_KNOWN_GOOD = 100_000
"""Most known-good keys one verifier remembers (the set starts again empty past it)."""

TOUCH_INTERVAL_S = 60.0
"""``last_used_at`` is written at most once per key per this many seconds."""

MAX_NAME_CHARS = 200
"""Longest key name."""

_TOKEN_RE = re.compile(r"tk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_KEY_ID_RE = re.compile(r"[0-9a-f]{16}")
_INSERT_TRIES = 5


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request authenticated as: the key's id, tenant (None only for admin) and role."""

    key_id: str
    tenant: str | None
    role: Role


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def secret_hash(secret: bytes) -> bytes:
    """SHA-256 of the 32 secret bytes (what ``api_keys.secret_hash`` holds)."""
    return hashlib.sha256(secret).digest()


def parse_token(token: str) -> tuple[str, bytes] | None:
    """``(key_id, secret bytes)`` of a well-formed token, else None (never raises).

    Well-formed: ``tk_`` + 16 lower-case hex + ``_`` + the canonical unpadded
    URL-safe base64 of 32 bytes (a variant spelling of the same bytes is refused).
    """
    match = _TOKEN_RE.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        return None
    key_id, text = match.groups()
    raw = base64.urlsafe_b64decode(text + "=")
    if len(raw) != 32 or _encode(raw) != text:
        return None
    return key_id, raw


def _check_role_tenant(role: str, tenant: str | None) -> None:
    if role not in ROLES:
        raise ValidationError("role", f"must be one of {', '.join(ROLES)}", role)
    if role == "admin" and tenant is not None:
        raise ValidationError("tenant", "must be omitted for an admin key (admin keys belong to no tenant)", tenant)
    if role != "admin":
        if tenant is None:
            raise ValidationError("tenant", f"is required for a {role} key")
        validate_tenant(tenant)


def check_name(name: str | None) -> str | None:
    """``name`` if None or 1-200 printable characters; raises ValidationError (field ``name``)."""
    if name is None:
        return None
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise ValidationError("name", f"must be 1-{MAX_NAME_CHARS} printable characters", name)
    return name


def check_key_id(key_id: str) -> str:
    """``key_id`` if it is 16 lower-case hex characters; raises ValidationError (field ``key_id``)."""
    if not isinstance(key_id, str) or not _KEY_ID_RE.fullmatch(key_id):
        raise ValidationError("key_id", "must be 16 lower-case hex characters (the middle of tk_<key_id>_...)", key_id)
    return key_id


def create(
    conn: psycopg.Connection,
    tenant: str | None,
    role: str,
    name: str | None = None,
    now: datetime | None = None,
) -> tuple[str, dict[str, Any]]:
    """Create a key; return ``(token, row)``. The token is shown once and never stored.

    ``row``: ``key_id``, ``tenant``, ``role``, ``name``, ``created_at``,
    ``revoked_at`` (None), ``last_used_at`` (None). ``tenant`` must be None for
    ``admin`` and an existing tenant otherwise. ``now``: the store clock's pin
    (tests); None is the store's ``now()``. One transaction, retried on
    40001/40P01. Raises ValidationError (role, tenant, name) or NotFoundError
    (no such tenant), nothing written.
    """
    _check_role_tenant(role, tenant)
    check_name(name)
    raw = _random.token_bytes(32)

    def body(c: psycopg.Connection) -> dict[str, Any]:
        if tenant is not None and not store.execute(c, "tenant_exists", {"tenant": tenant}):
            raise NotFoundError(f"tenant: no tenant {clip(tenant)}", hint="create it with {tenants_add}")
        for _ in range(_INSERT_TRIES):
            params = {
                "key_id": _random.token_hex(8),
                "tenant": tenant,
                "role": role,
                "name": name,
                "secret_hash": secret_hash(raw),
                "now": now,
            }
            rows = store.execute(c, "insert_api_key", params)
            if rows:
                return rows[0]
        raise ConflictError("key_id: random key ids collided repeatedly; try again")

    row = store.run_transaction(conn, body)
    return f"{PREFIX}{row['key_id']}_{_encode(raw)}", row


def list_keys(
    conn: psycopg.Connection, tenant: str | None = None, *, after: str | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """Keys by ``key_id`` (never the secret or its hash): ``key_id``, ``tenant``, ``role``,
    ``name``, ``created_at``, ``revoked_at``, ``last_used_at``; only ``tenant``'s if given;
    those after key id ``after``; at most ``limit`` rows."""
    if tenant is not None:
        validate_tenant(tenant)
    return store.execute(conn, "list_api_keys", {"tenant": tenant, "after": after, "limit": limit})


def revoke(conn: psycopg.Connection, key_id: str, now: datetime | None = None) -> dict[str, Any]:
    """Revoke ``key_id`` (again: a no-op keeping the first time); return its row as :func:`list_keys`.

    Raises ValidationError (malformed id) or NotFoundError (no such key).
    API processes refuse the key within :data:`CACHE_TTL_S`.
    """
    check_key_id(key_id)
    rows = store.run_transaction(conn, lambda c: store.execute(c, "revoke_api_key", {"key_id": key_id, "now": now}))
    if not rows:
        raise NotFoundError(f"key_id: no key {clip(key_id)}")
    return rows[0]


def authenticate(conn: psycopg.Connection, token: str) -> Principal | None:
    """The :class:`Principal` of ``token``, or None if it is malformed, unknown, revoked or
    wrong. Reads one row (autocommit); writes nothing."""
    return KeyVerifier(ttl_s=0.0, touch_interval_s=None).verify(lambda: _Borrowed(conn), token)


class _Borrowed(AbstractContextManager[psycopg.Connection]):
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> psycopg.Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        return None


class KeyVerifier:
    """Checks tokens against ``api_keys``, reusing each key row for ``ttl_s`` seconds.

    Thread-safe (the API's handlers run in a thread pool). A cached row (or
    a cached "no such key") is used for at most ``ttl_s`` seconds by the
    monotonic ``clock``, so a revocation takes effect within that; the secret
    is checked against the hash on every request. ``last_used_at`` is written
    at most once per ``touch_interval_s`` per key (None: never).
    """

    def __init__(
        self,
        ttl_s: float = CACHE_TTL_S,
        touch_interval_s: float | None = TOUCH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.touch_interval_s = touch_interval_s
        self.clock = clock
        self._rows: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._good: dict[str, float] = {}
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(
        self, connection: Callable[[], AbstractContextManager[psycopg.Connection]], token: str
    ) -> Principal | None:
        """The :class:`Principal` of ``token`` or None (malformed, unknown, revoked, wrong secret).

        ``connection()`` gives a connection (a context manager) when the
        store must be read or ``last_used_at`` written. Raises store errors of the read; the
        ``last_used_at`` write is best effort (a failure is logged, ``api_key_touch_failed``).
        """
        parsed = parse_token(token)
        if parsed is None:
            return None
        key_id, raw = parsed
        now = self.clock()
        with self._lock:
            cached = self._rows.get(key_id)
        if cached is not None and 0 <= now - cached[0] < self.ttl_s:
            row = cached[1]
        else:
            with connection() as conn:
                rows = store.execute(conn, "get_api_key", {"key_id": key_id})
            row = rows[0] if rows else None
            with self._lock:
                if len(self._rows) > 100_000:
                    self._rows.clear()
                self._rows[key_id] = (now, row)
        if row is None or row["revoked_at"] is not None:
            return None
        if not hmac.compare_digest(secret_hash(raw), bytes(row["secret_hash"])):
            return None
        with self._lock:
            if len(self._good) >= MAX_KNOWN_GOOD:
                self._good.clear()
            self._good[key_id] = now
        self._touch(connection, key_id, now)
        return Principal(key_id=key_id, tenant=row["tenant"], role=row["role"])

    def known_good(self, token: str | None) -> bool:
        """Whether ``token`` names a key that authenticated through this verifier within
        :data:`KNOWN_GOOD_S` seconds. Reads nothing and checks no secret (:meth:`verify`
        still must): it only says whether a request is worth checking while its address
        is throttled."""
        parsed = parse_token(token) if token is not None else None
        if parsed is None:
            return False
        with self._lock:
            seen = self._good.get(parsed[0])
        return seen is not None and 0 <= self.clock() - seen < KNOWN_GOOD_S

    def forget(self, key_id: str) -> None:
        """Drop ``key_id``'s cached row: the next request reads the store (a revocation made by
        this process is honoured at once)."""
        with self._lock:
            self._rows.pop(key_id, None)

    def _touch(
        self, connection: Callable[[], AbstractContextManager[psycopg.Connection]], key_id: str, now: float
    ) -> None:
        if self.touch_interval_s is None:
            return
        with self._lock:
            last = self._touched.get(key_id)
            if last is not None and now - last < self.touch_interval_s:
                return
            self._touched[key_id] = now
        # Best effort: a store that cannot take the write now (read-only after a failover,
        # unreachable for a moment) must not fail a request whose key checked out.
        try:
            with connection() as conn:
                store.run_transaction(
                    conn, lambda c: store.execute(c, "touch_api_key", {"key_id": key_id, "now": None})
                )
        except (psycopg.Error, StoreError) as exc:
            log.event("api_key_touch_failed", logging.INFO, key_id=key_id, error=store.first_line(exc))
