"""Per-tenant signing secrets of pushed requests (table ``tenant_secrets``; docs/delivery.md, "Push").

A secret is ``whsec_`` followed by 43 URL-safe characters (32 random bytes,
:func:`secrets.token_urlsafe`). Secrets are numbered per tenant (``secret_id``
1, 2, ...) and valid until their ``expires_at`` (NULL: until the next
rotation). The push loop signs every request with *each* valid secret of the
run's tenant, newest first (:mod:`scheduler.delivery.signing`).

* :func:`rotate` (``scheduler tenants secret rotate T [--grace 24h]``) adds a
  new secret and limits every other valid one to ``now + grace``; the new value
  is returned once (the CLI prints it to stdout, never to the log) and can
  never be read back.
* :func:`list_secrets` (``scheduler tenants secret list T``) shows ids and
  times, never values.
* :func:`signing_secrets` is the push loop's read. A tenant with no valid
  secret when one of its runs is pushed gets one created then (so every
  request is signed), which nobody has seen: rotate to obtain a secret to
  configure the receiver with (the unseen one stays valid for the grace).
  Run ``rotate`` before a tenant's first HTTP job to have the receiver ready.

Secret values never appear in logs, errors or ``list`` output.
"""

from __future__ import annotations

import math
import secrets as _random
from collections.abc import Iterable
from datetime import datetime

import psycopg

from scheduler import store
from scheduler.errors import ConflictError, NotFoundError, ValidationError, clip

PREFIX = "whsec_"
"""Every secret starts with this (recognizable in a receiver's configuration)."""

DEFAULT_GRACE_S = 86_400.0
"""How long the previous secrets stay valid after a rotation (24 h)."""

MAX_GRACE_S = 30 * 86_400.0
"""Longest grace a rotation accepts (30 days)."""

_INSERT_TRIES = 5


def new_secret() -> str:
    """A fresh secret: :data:`PREFIX` + ``secrets.token_urlsafe(32)``."""
    return PREFIX + _random.token_urlsafe(32)


_GRACE_RULE = f"must be a duration >= 0 such as 24h, 30m, 0 or seconds, at most {int(MAX_GRACE_S // 86_400)}d"


def parse_grace(text: str) -> float:
    """Seconds of a rotation's grace typed as ``24h``, ``30m``, ``1d``, ``0`` or plain
    seconds (:func:`scheduler.retention.duration_seconds`), from 0 to :data:`MAX_GRACE_S`.
    Raises ValidationError (field ``grace``) echoing ``text`` as typed."""
    from scheduler.retention import duration_seconds

    seconds = duration_seconds(text)
    if seconds is None or not math.isfinite(seconds) or not 0 <= seconds:
        raise ValidationError("grace", _GRACE_RULE, text)
    if seconds > MAX_GRACE_S:
        raise ValidationError("grace", f"must be from 0 to {int(MAX_GRACE_S // 86_400)}d", text)
    return seconds


def check_grace(grace_s: float) -> float:
    """``grace_s`` if it is a number of seconds from 0 to :data:`MAX_GRACE_S`; raises ValidationError (``grace``)."""
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not math.isfinite(grace_s):
        raise ValidationError("grace", "must be a duration such as 24h, 30m or seconds", grace_s)
    if not 0 <= grace_s <= MAX_GRACE_S:
        raise ValidationError("grace", f"must be from 0 to {int(MAX_GRACE_S // 86_400)}d", grace_s)
    return float(grace_s)


def _require_tenant(conn: psycopg.Connection, tenant: str, lock: bool = False) -> None:
    """Raise NotFoundError unless ``tenant`` exists; ``lock``: hold its row until commit."""
    if not store.execute(conn, "lock_tenant" if lock else "tenant_exists", {"tenant": tenant}):
        raise NotFoundError(f"tenant: no tenant {clip(tenant)}")


def _insert(
    conn: psycopg.Connection, tenant: str, secret: str, now: datetime | None, only_if_none: bool
) -> dict | None:
    """Insert ``secret`` as the tenant's next id; the row (id, created_at) or None (only_if_none and one exists).

    A concurrent insert of the same id (ON CONFLICT DO NOTHING returns no
    row) is answered by trying again with the next id, inside the caller's
    transaction (read committed sees the other's commit). Raises
    ConflictError after :data:`_INSERT_TRIES` such collisions.
    """
    params = {"tenant": tenant, "secret": secret, "now": now, "only_if_none": only_if_none}
    for _ in range(_INSERT_TRIES):
        rows = store.execute(conn, "insert_tenant_secret", params)
        if rows:
            return rows[0]
        if only_if_none and valid_secrets(conn, [tenant], now).get(tenant):
            return None
    raise ConflictError(f"tenant: concurrent secret rotations of {clip(tenant)}; try again")


def rotate(
    conn: psycopg.Connection, tenant: str, grace_s: float = DEFAULT_GRACE_S, now: datetime | None = None
) -> tuple[int, str, datetime, int]:
    """Add a new signing secret for ``tenant``; return ``(secret_id, secret, created_at, limited)``.

    Every other secret valid at store time ``now`` (None: the store's
    ``now()``; tests pin it) stays valid until ``now + grace_s`` seconds
    (one expiring earlier keeps its expiry; ``grace_s`` 0 ends them at once);
    ``limited`` counts the secrets whose validity was so cut (0 for a
    tenant's first secret, nothing before it to limit).
    One transaction, retried on 40001/40P01. Raises ValidationError for a
    bad ``grace_s``, NotFoundError for an unknown tenant (nothing written).
    The caller shows the secret once; it cannot be read back.
    """
    grace = check_grace(grace_s)
    secret = new_secret()

    def body(c: psycopg.Connection) -> tuple[dict, int]:
        _require_tenant(c, tenant, lock=True)  # one rotation of a tenant at a time
        limited = store.execute(c, "limit_tenant_secrets", {"tenant": tenant, "now": now, "grace_s": grace})
        row = _insert(c, tenant, secret, now, only_if_none=False)
        assert row is not None
        return row, len(limited)

    row, limited = store.run_transaction(conn, body)
    return row["secret_id"], secret, row["created_at"], limited


def list_secrets(conn: psycopg.Connection, tenant: str, now: datetime | None = None) -> list[dict]:
    """``tenant``'s secrets without values, newest first: ``secret_id``, ``created_at``, ``expires_at``
    (None: until the next rotation), ``valid`` (at store time ``now``). Raises NotFoundError."""

    def body(c: psycopg.Connection) -> list[dict]:
        _require_tenant(c, tenant)
        return store.execute(c, "list_tenant_secrets", {"tenant": tenant, "now": now})

    return store.run_transaction(conn, body)


def valid_secrets(
    conn: psycopg.Connection, tenants: Iterable[str], now: datetime | None = None
) -> dict[str, list[str]]:
    """``{tenant: [secret, ...]}`` of the secrets valid at ``now`` (None: store now), newest first.

    Tenants without a valid secret are absent. Runs in the caller's
    transaction (or autocommit).
    """
    out: dict[str, list[str]] = {}
    for row in store.execute(conn, "valid_tenant_secrets", {"tenants": sorted(set(tenants)), "now": now}):
        out.setdefault(row["tenant"], []).append(row["secret"])
    return out


def signing_secrets(
    conn: psycopg.Connection, tenants: Iterable[str], now: datetime | None = None
) -> dict[str, list[str]]:
    """The push loop's read: :func:`valid_secrets` of ``tenants``, creating a first secret for
    each tenant that has none valid (see the module doc). Every tenant given is in the answer.

    One transaction, retried on 40001/40P01; raises store errors.
    """
    wanted = sorted(set(tenants))

    def body(c: psycopg.Connection) -> dict[str, list[str]]:
        found = valid_secrets(c, wanted, now)
        missing = [t for t in wanted if t not in found]
        for tenant in missing:
            _insert(c, tenant, new_secret(), now, only_if_none=True)
        if missing:
            found.update(valid_secrets(c, missing, now))
        return found

    return store.run_transaction(conn, body)
