"""One validated settings object for a node (STYLE.md rule 7).

Every field carries its unit in its name; defaults are the named constants
below and come from DESIGN.md §2 and §6. The CLI exposes each field as a flag
and as an environment variable ``SCHEDULER_<FIELD>`` (upper case), e.g.
``--lease-ttl-s`` / ``SCHEDULER_LEASE_TTL_S``.

Derived store timeouts: a paused node can hold the partition rows' share
locks taken by its firing transaction, so every node session sets
``lock_timeout``, ``statement_timeout`` and
``idle_in_transaction_session_timeout`` well below the lease TTL (DESIGN.md
§2): by default 20 %, 40 % and 40 % of the TTL. The store then aborts a
frozen node's transaction and a takeover proceeds.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid

from scheduler.errors import ConfigError

LEASE_TTL_S = 10.0
"""Lease time-to-live (DESIGN.md §2)."""
RENEW_INTERVAL_S = 3.0
"""Lease renewal and heartbeat period (DESIGN.md §2)."""
POLL_INTERVAL_S = 1.0
"""Membership / free-partition poll period (DESIGN.md §2)."""
TICK_INTERVAL_S = 1.0
"""Firing tick period (DESIGN.md §4)."""
SAFETY_MARGIN_S = 1.0
"""Stop firing this long before the lease expires by the node's monotonic
clock if renewals fail (DESIGN.md §2: at least 0.5 s, CockroachDB's default
maximum clock offset)."""
MAX_RATE_PER_S = 100_000.0
"""Per-node firing budget in runs/s; high enough that a node on a 2-core box
is capacity-bound (DESIGN.md §5)."""
NODE_PRUNE_AFTER_S = 3600.0
"""Heartbeat rows older than this are deleted."""


def default_node_id() -> str:
    """Return ``<hostname>-<6 hex chars>``: unique per process start."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Node settings. All durations in seconds, rates in runs per second.

    Raises :class:`~scheduler.errors.ConfigError` from :meth:`validated` when
    a value or a combination is invalid; the message names every setting
    involved.
    """

    dsn: str = ""
    node_id: str = ""
    lease_ttl_s: float = LEASE_TTL_S
    renew_interval_s: float = RENEW_INTERVAL_S
    poll_interval_s: float = POLL_INTERVAL_S
    tick_interval_s: float = TICK_INTERVAL_S
    safety_margin_s: float = SAFETY_MARGIN_S
    max_rate_per_s: float = MAX_RATE_PER_S
    node_prune_after_s: float = NODE_PRUNE_AFTER_S
    lock_timeout_s: float | None = None
    statement_timeout_s: float | None = None
    idle_in_transaction_timeout_s: float | None = None

    @property
    def effective_lock_timeout_s(self) -> float:
        """``lock_timeout`` for node sessions (default 20 % of the TTL)."""
        return self.lock_timeout_s if self.lock_timeout_s is not None else self.lease_ttl_s * 0.2

    @property
    def effective_statement_timeout_s(self) -> float:
        """``statement_timeout`` for node sessions (default 40 % of the TTL)."""
        return self.statement_timeout_s if self.statement_timeout_s is not None else self.lease_ttl_s * 0.4

    @property
    def effective_idle_in_transaction_timeout_s(self) -> float:
        """``idle_in_transaction_session_timeout`` (default 40 % of the TTL)."""
        if self.idle_in_transaction_timeout_s is not None:
            return self.idle_in_transaction_timeout_s
        return self.lease_ttl_s * 0.4

    @property
    def tick_budget(self) -> int:
        """Runs one tick may fire: ``max_rate_per_s × tick_interval_s`` (≥ 1)."""
        return max(1, int(self.max_rate_per_s * self.tick_interval_s))

    def validated(self) -> Settings:
        """Return self with ``node_id`` filled in; raise ConfigError if invalid."""
        positive = (
            "lease_ttl_s",
            "renew_interval_s",
            "poll_interval_s",
            "tick_interval_s",
            "max_rate_per_s",
            "node_prune_after_s",
        )
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ConfigError(f"{name} must be a finite number > 0 (got {value!r})")
        if self.safety_margin_s < 0.5:
            raise ConfigError(
                f"safety_margin_s must be >= 0.5 (CockroachDB's max clock offset; got {self.safety_margin_s!r})"
            )
        if self.renew_interval_s >= self.lease_ttl_s:
            raise ConfigError(
                f"renew_interval_s ({self.renew_interval_s}) must be less than lease_ttl_s ({self.lease_ttl_s})"
            )
        if self.renew_interval_s + self.safety_margin_s >= self.lease_ttl_s:
            raise ConfigError(
                f"renew_interval_s ({self.renew_interval_s}) + safety_margin_s ({self.safety_margin_s}) "
                f"must be less than lease_ttl_s ({self.lease_ttl_s}), or a healthy lease would stop firing"
            )
        for name in ("effective_lock_timeout_s", "effective_statement_timeout_s",
                     "effective_idle_in_transaction_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < self.lease_ttl_s:
                raise ConfigError(
                    f"{name.removeprefix('effective_')} ({value}) must be > 0 and below lease_ttl_s "
                    f"({self.lease_ttl_s}) so a frozen node cannot block a takeover"
                )
        node_id = self.node_id or default_node_id()
        if len(node_id) > 200:
            raise ConfigError("node_id must be at most 200 characters")
        return dataclasses.replace(self, node_id=node_id)


def env_dsn() -> str:
    """Return ``SCHEDULER_DSN`` or an empty string."""
    return os.environ.get("SCHEDULER_DSN", "")
