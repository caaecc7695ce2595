"""One validated settings object for a node (CONTRIBUTING.md rule 7).

Every field carries its unit in its name; defaults are the named constants
below and come from docs/design.md §2 and §6. The CLI exposes each field as a flag
and as an environment variable ``SCHEDULER_<FIELD>`` (upper case), e.g.
``--lease-ttl-s`` / ``SCHEDULER_LEASE_TTL_S``, and reads an optional TOML
config file (``--config FILE`` / ``SCHEDULER_CONFIG``) whose keys are the
field names. Precedence, highest first: flag, environment, file, default
(:func:`resolve`, which also reports where each value came from for
``scheduler config show``).

Derived store timeouts: a paused node can hold the partition rows' share
locks taken by its firing transaction, so every node session sets
``lock_timeout``, ``statement_timeout`` and
``idle_in_transaction_session_timeout`` well below the lease TTL
(docs/design.md §2): by default 20 %, 40 % and 40 % of the TTL. The store then aborts a
frozen node's transaction and a takeover proceeds.

Client-side bounds (the store can go silent: a hung pooler or proxy, a
vanished host): every node session also sets TCP keepalives and
``tcp_user_timeout`` (default 50 % of the TTL), and the node's watchdog
(:mod:`scheduler.watchdog`) cancels a store call in which the store has been
silent past ``statement_timeout`` + ``store_call_margin_s`` and breaks its
connection past ``statement_timeout`` + 2 × ``store_call_margin_s`` (default margin:
20 % of the TTL, at least 0.5 s). ``/healthz`` fails when a loop has made
no progress for ``loop_stall_s`` (default: the TTL); a stop signal ends the
process within ``stop_timeout_s`` whatever its threads are doing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import socket
import tomllib
import typing
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.delivery.ssrf import AddressPolicy
from scheduler.errors import ConfigError, ValidationError

LEASE_TTL_S = 10.0
"""Lease time-to-live (docs/design.md §2)."""
RENEW_INTERVAL_S = 3.0
"""Lease renewal and heartbeat period (docs/design.md §2)."""
POLL_INTERVAL_S = 1.0
"""Membership / free-partition poll period (docs/design.md §2)."""
TICK_INTERVAL_S = 1.0
"""Firing tick period (docs/design.md §4)."""
SAFETY_MARGIN_S = 1.0
"""Stop firing this long before the lease expires by the node's monotonic
clock if renewals fail (docs/design.md §2: at least 0.5 s, CockroachDB's default
maximum clock offset)."""
MAX_RETENTION_S = 100 * 365 * 86_400
"""Longest retention / ``runs prune --older-than`` (100 years): a cutoff further
back leaves the store's date range (and means "keep everything": leave
retention unset)."""
MAX_FLEET_TIMING_S = 86_400
"""Longest lease TTL, renew, poll and tick interval (seconds, inclusive), for a node's
settings and for the fleet timings ``status`` and ``verify`` take (CLI and admin API
alike). The store timeouts derived from the TTL (0.2-0.5 of it) are PostgreSQL
settings in milliseconds that stop at 2^31 - 1 ms (24.8 days): a node with a TTL of
1e8 s never connected and retried for ever; and a waiting loop's timeout past
~1e9 s overflows. A day is already a failover no one wants."""
MAX_RATE_PER_S = 100_000.0
"""Per-node firing budget in runs/s; high enough that a node on a 2-core box
is capacity-bound (docs/design.md §5)."""
NODE_PRUNE_AFTER_S = 3600.0
"""Heartbeat rows older than this are deleted."""
METRICS_HOST = "127.0.0.1"
"""Interface of the metrics/health endpoint: loopback unless asked (containers bind 0.0.0.0)."""
RETENTION_BATCH_ROWS = 1000
"""Rows one retention DELETE removes at most."""
RETENTION_BATCH_INTERVAL_S = 1.0
"""The node's retention loop runs at most one batch per this many seconds."""
COORDINATORS = ("sql", "etcd")
"""Ownership coordinators (docs/design.md §2): lease rows in the store, or etcd leases."""
STOP_TIMEOUT_S = 10.0
"""After SIGTERM/SIGINT the node exits within this many seconds: gracefully
if it can, else with status 1 (``stop_deadline_passed``)."""
KEEPALIVE_COUNT = 3
"""Unanswered TCP keepalive probes before the kernel drops a node session."""
ETCD_PREFIX = "/scheduler/"
"""Key prefix of one fleet's membership and partition keys in etcd."""
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
PUSH_CONCURRENCY = 64
"""Push attempts one node runs at once (docs/delivery.md, "Push")."""
PUSH_PER_HOST = 8
"""Push attempts one node runs at once against one target host."""
MAX_PUSH_CONCURRENCY = 10_000
"""Largest ``push_concurrency`` / ``push_per_host`` accepted."""
API_HOST = "127.0.0.1"
"""Interface of the tenant HTTP API (``scheduler api``, ``node --api-port``): loopback unless asked."""
API_RATE_PER_S = 50.0
"""Per-key request rate of the HTTP API's token bucket (requests/s; docs/api.md, "Limits")."""
API_BURST = 100
"""Per-key bucket size of the HTTP API: requests a key may send at once after being idle."""
API_AUTH_FAIL_RATE_PER_S = 1.0
"""Failed authentications (401s) per second one client address may keep making (docs/api.md, "Limits")."""
API_AUTH_FAIL_BURST = 20
"""Failed authentications one client address may make at once before it is answered 429."""
API_POOL_SIZE = 8
"""Store connections the HTTP API's pool holds at most (one per request in flight)."""
MAX_API_POOL_SIZE = 200
"""Largest ``api_pool_size`` accepted."""
MAX_API_BODY_BYTES = 1_048_576
"""Largest HTTP API request body (1 MiB): 413 beyond (docs/api.md, "Limits")."""
API_PAGE_SIZE = 100
"""Items of a list page of the HTTP API unless the request asks for another ``limit``."""
MAX_API_PAGE_SIZE = 500
"""Largest ``limit`` of a list page of the HTTP API."""
SOURCES = ("flag", "env", "file", "default")
"""Where an effective setting came from, highest precedence first."""


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
    metrics_host: str = METRICS_HOST
    metrics_port: int | None = None
    log_format: str = "text"
    log_level: str = "info"
    retention_s: float | None = None
    retention_batch_rows: int = RETENTION_BATCH_ROWS
    retention_batch_interval_s: float = RETENTION_BATCH_INTERVAL_S
    tcp_user_timeout_s: float | None = None
    store_call_margin_s: float | None = None
    loop_stall_s: float | None = None
    stop_timeout_s: float = STOP_TIMEOUT_S
    coordinator: str = "sql"
    etcd_endpoints: str = ""
    etcd_prefix: str = ETCD_PREFIX
    push_allow: str = ""
    push_concurrency: int = PUSH_CONCURRENCY
    push_per_host: int = PUSH_PER_HOST
    api_host: str = API_HOST
    api_port: int | None = None
    api_rate_per_s: float = API_RATE_PER_S
    api_burst: int = API_BURST
    api_pool_size: int = API_POOL_SIZE
    api_auth_fail_rate_per_s: float = API_AUTH_FAIL_RATE_PER_S
    api_auth_fail_burst: int = API_AUTH_FAIL_BURST
    api_forwarded_allow_ips: str = ""

    @property
    def api(self) -> ApiSettings:
        """The HTTP API's settings (:class:`ApiSettings`) taken from the ``api_*`` fields."""
        return ApiSettings(
            rate_per_s=self.api_rate_per_s,
            burst=self.api_burst,
            pool_size=self.api_pool_size,
            push_allow=self.push_allow,
            auth_fail_rate_per_s=self.api_auth_fail_rate_per_s,
            auth_fail_burst=self.api_auth_fail_burst,
            forwarded_allow_ips=self.api_forwarded_allow_ips,
        )

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
    def effective_tcp_user_timeout_s(self) -> float:
        """libpq ``tcp_user_timeout`` of node sessions (default 50 % of the TTL): transmitted
        data left unacknowledged this long ends the connection."""
        return self.tcp_user_timeout_s if self.tcp_user_timeout_s is not None else self.lease_ttl_s * 0.5

    @property
    def keepalive_idle_s(self) -> int:
        """TCP keepalive idle time of node sessions: 20 % of the TTL, whole seconds, at least 1."""
        return max(1, round(self.lease_ttl_s * 0.2))

    @property
    def keepalive_interval_s(self) -> int:
        """TCP keepalive probe interval of node sessions: 10 % of the TTL, whole seconds, at least 1."""
        return max(1, round(self.lease_ttl_s * 0.1))

    @property
    def keepalive_count(self) -> int:
        """Unanswered keepalive probes before a node session is dropped (:data:`KEEPALIVE_COUNT`)."""
        return KEEPALIVE_COUNT

    @property
    def effective_store_call_margin_s(self) -> float:
        """The watchdog's margin (default 20 % of the TTL, at least 0.5 s): a store call is
        cancelled past statement_timeout + margin, its connection broken past + 2 × margin."""
        if self.store_call_margin_s is not None:
            return self.store_call_margin_s
        return max(0.5, self.lease_ttl_s * 0.2)

    @property
    def effective_loop_stall_s(self) -> float:
        """``/healthz`` fails when the lease or firing loop has completed neither an
        iteration nor a store call for this long (default: the lease TTL, or two
        ticks if that is longer)."""
        if self.loop_stall_s is not None:
            return self.loop_stall_s
        return max(self.lease_ttl_s, 2 * self.tick_interval_s)

    @property
    def responsive_s(self) -> float:
        """Heartbeat age under which a node counts when shares are computed.

        ``min(lease_ttl_s, renew_interval_s + 2 × poll_interval_s)``: a
        healthy node heartbeats every ``renew_interval_s``; one that missed its
        beat by two polls is dead or frozen as far as dividing work goes (its
        leases still protect what it holds until they expire). See
        :meth:`scheduler.coordination.sql.SqlCoordinator.live_nodes`.
        """
        return min(self.lease_ttl_s, self.renew_interval_s + 2 * self.poll_interval_s)

    @property
    def push_policy(self) -> AddressPolicy:
        """The SSRF allowlist of push targets (``push_allow``: comma-separated networks
        beyond the public internet, e.g. ``10.0.0.0/8``; see :mod:`scheduler.delivery.ssrf`).
        Raises ValidationError for an entry that is not a network."""
        return AddressPolicy.parse(self.push_allow)

    @property
    def tick_budget(self) -> int:
        """Runs one tick may fire: ``max_rate_per_s × tick_interval_s`` (≥ 1)."""
        return max(1, int(self.max_rate_per_s * self.tick_interval_s))

    def validated(self) -> Settings:
        """Return self with ``node_id`` filled in; raise ConfigError if invalid."""
        self.check()
        node_id = self.node_id or default_node_id()
        return dataclasses.replace(self, node_id=node_id)

    def check(self) -> None:
        """Raise ConfigError naming every setting involved if a value or a combination is invalid."""
        positive = (
            "lease_ttl_s",
            "renew_interval_s",
            "poll_interval_s",
            "tick_interval_s",
            "max_rate_per_s",
            "node_prune_after_s",
            "retention_batch_interval_s",
            "stop_timeout_s",
            "api_rate_per_s",
            "api_auth_fail_rate_per_s",
        )
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ConfigError(f"{name}: must be a finite number > 0 (got {value!r})")
        for name in ("lease_ttl_s", "renew_interval_s", "poll_interval_s", "tick_interval_s"):
            value = getattr(self, name)
            if value > MAX_FLEET_TIMING_S:
                raise ConfigError(f"{name}: must be at most {MAX_FLEET_TIMING_S} seconds (a day) (got {value!r})")
        if self.retention_s is not None and not (
            isinstance(self.retention_s, (int, float)) and 0 < self.retention_s < math.inf
        ):
            raise ConfigError(
                f"retention_s: must be a finite number of seconds > 0, or unset (got {self.retention_s!r})"
            )
        if self.retention_s is not None and self.retention_s > MAX_RETENTION_S:
            raise ConfigError(
                f"retention_s: must be at most {MAX_RETENTION_S} seconds (100 years), or unset "
                f"(got {self.retention_s!r})"
            )
        if not (isinstance(self.retention_batch_rows, int) and 1 <= self.retention_batch_rows <= 100_000):
            raise ConfigError(
                f"retention_batch_rows: must be a whole number from 1 to 100000 (got {self.retention_batch_rows!r})"
            )
        if self.metrics_port is not None and not (
            isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535
        ):
            raise ConfigError(
                f"metrics_port: must be a TCP port 0-65535 (0: any free port), or unset (got {self.metrics_port!r})"
            )
        if not self.metrics_host:
            raise ConfigError("metrics_host must not be empty (e.g. 127.0.0.1, or 0.0.0.0 in a container)")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format: must be one of {', '.join(LOG_FORMATS)} (got {self.log_format!r})")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level: must be one of {', '.join(LOG_LEVELS)} (got {self.log_level!r})")
        if self.coordinator not in COORDINATORS:
            raise ConfigError(f"coordinator: must be one of {', '.join(COORDINATORS)} (got {self.coordinator!r})")
        if self.coordinator == "etcd" and not self.etcd_endpoints.strip():
            raise ConfigError(
                "etcd_endpoints: coordinator etcd needs host:port[,host:port] "
                "(--etcd-endpoints / SCHEDULER_ETCD_ENDPOINTS)"
            )
        if self.coordinator == "etcd" and not self.etcd_prefix.startswith("/"):
            raise ConfigError(f"etcd_prefix must start with '/' (got {self.etcd_prefix!r})")
        if self.safety_margin_s < 0.5:
            raise ConfigError(
                f"safety_margin_s: must be >= 0.5 (CockroachDB's max clock offset; got {self.safety_margin_s!r})"
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
        for name in (
            "effective_lock_timeout_s",
            "effective_statement_timeout_s",
            "effective_idle_in_transaction_timeout_s",
        ):
            value = getattr(self, name)
            if not 0 < value < self.lease_ttl_s:
                raise ConfigError(
                    f"{name.removeprefix('effective_')} ({value}) must be > 0 and below lease_ttl_s "
                    f"({self.lease_ttl_s}) so a frozen node cannot block a takeover"
                )
        for name in ("tcp_user_timeout_s", "store_call_margin_s", "loop_stall_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(f"{name}: must be a finite number of seconds > 0, or unset (got {value!r})")
        if not self.effective_loop_stall_s > max(self.tick_interval_s, self.poll_interval_s):
            raise ConfigError(
                f"loop_stall_s ({self.effective_loop_stall_s}) must be above tick_interval_s "
                f"({self.tick_interval_s}) and poll_interval_s ({self.poll_interval_s}), or an idle loop "
                f"would count as stalled"
            )
        if not self.effective_tcp_user_timeout_s < self.lease_ttl_s:
            raise ConfigError(
                f"tcp_user_timeout_s ({self.effective_tcp_user_timeout_s}) must be below lease_ttl_s "
                f"({self.lease_ttl_s}) so a dead connection is given up before the lease expires"
            )
        for name in ("push_concurrency", "push_per_host"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PUSH_CONCURRENCY):
                raise ConfigError(f"{name}: must be a whole number from 1 to {MAX_PUSH_CONCURRENCY} (got {value!r})")
        if self.api_port is not None and not (isinstance(self.api_port, int) and 0 <= self.api_port <= 65535):
            raise ConfigError(
                f"api_port: must be a TCP port 0-65535 (0: any free port), or unset (got {self.api_port!r})"
            )
        if not self.api_host:
            raise ConfigError("api_host must not be empty (e.g. 127.0.0.1, or 0.0.0.0 behind a TLS proxy)")
        self.api.check()  # and push_allow, which the API shares
        if len(self.node_id) > 200 or not self.node_id.isprintable() or any(c.isspace() for c in self.node_id):
            # Written to runs, leases and every log line: a newline would split a log line.
            raise ConfigError(
                "node_id: must be 1-200 printable characters without spaces (letters, digits, . _ - : etc.)"
                f" (got {self.node_id!r})"
            )


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    """Limits of the tenant HTTP API (docs/api.md, "Limits"); :attr:`Settings.api` builds
    it from the ``api_*`` settings (flags, ``SCHEDULER_API_*``, the config file).

    ``rate_per_s`` (requests/s) and ``burst`` (requests) shape each key's token
    bucket; ``pool_size`` bounds the store connections; ``max_body_bytes``,
    ``page_size`` and ``max_page_size`` bound requests and list pages.
    ``push_allow`` is the node setting of that name: the networks beyond the
    public internet a schedule's URL target may reach, checked when a
    schedule is saved (``PUT``, ``apply``), as ``jobs add --push-allow``.
    ``auth_fail_rate_per_s`` (401s/s) and ``auth_fail_burst`` shape each client
    address's bucket of failed authentications (429 beyond).
    ``forwarded_allow_ips``: comma-separated addresses or networks of proxies
    whose ``X-Forwarded-For``/``-Proto`` are believed (uvicorn's
    ``forwarded_allow_ips``; ``*``: any); empty (default): none, the socket
    peer is the client. :meth:`check` raises ConfigError naming the setting.
    """

    rate_per_s: float = API_RATE_PER_S
    burst: int = API_BURST
    pool_size: int = API_POOL_SIZE
    max_body_bytes: int = MAX_API_BODY_BYTES
    page_size: int = API_PAGE_SIZE
    max_page_size: int = MAX_API_PAGE_SIZE
    push_allow: str = ""
    auth_fail_rate_per_s: float = API_AUTH_FAIL_RATE_PER_S
    auth_fail_burst: int = API_AUTH_FAIL_BURST
    forwarded_allow_ips: str = ""

    def check(self) -> ApiSettings:
        """Return self; raise ConfigError (naming the ``api_*`` setting) for a value out of range."""
        for name, value in (
            ("api_rate_per_s", self.rate_per_s),
            ("api_auth_fail_rate_per_s", self.auth_fail_rate_per_s),
        ):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
                raise ConfigError(f"{name}: must be a finite number > 0 (got {value!r})")
        for name, value, hi in (
            ("api_burst", self.burst, 1_000_000),
            ("api_auth_fail_burst", self.auth_fail_burst, 1_000_000),
            ("api_pool_size", self.pool_size, MAX_API_POOL_SIZE),
            ("api_max_body_bytes", self.max_body_bytes, 1 << 30),
            ("api_max_page_size", self.max_page_size, 100_000),
            ("api_page_size", self.page_size, self.max_page_size),
        ):
            if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= hi):
                raise ConfigError(f"{name}: must be a whole number from 1 to {hi} (got {value!r})")
        try:
            AddressPolicy.parse(self.push_allow)
        except ValidationError as exc:
            raise ConfigError(str(exc)) from None
        for entry in str(self.forwarded_allow_ips).split(","):
            try:
                if entry.strip() not in ("", "*"):
                    ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ConfigError(
                    "api_forwarded_allow_ips: must be comma-separated IP addresses or networks of trusted proxies, "
                    f"or * (got {self.forwarded_allow_ips!r})"
                ) from None
        return self


def field_types() -> dict[str, type]:
    """``{field: scalar type}`` (``float``, ``int`` or ``str``; ``X | None`` → ``X``)."""
    hints = typing.get_type_hints(Settings)
    out: dict[str, type] = {}
    for field in dataclasses.fields(Settings):
        hint = hints[field.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        out[field.name] = args[0] if args else hint
    return out


def _coerce(name: str, kind: type, value: Any, origin: str) -> Any:
    """Check a config-file value's type (TOML gives typed values); ints are fine for floats."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    expected = {float: "a number", int: "a whole number", str: "a string"}[kind]
    raise ConfigError(f"{name}: must be {expected} (got {value!r}); set by {name} in {origin}")


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file whose keys are Settings field names.

    Raises ConfigError (naming the file and the key) if the file cannot be
    read or parsed, has an unknown key, or a value of the wrong type.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    types = field_types()
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in types:
            raise ConfigError(
                f"config: unknown setting {key!r} in {path} (keys are the setting names, e.g. lease_ttl_s)"
            )
        out[key] = _coerce(key, types[key], value, str(path))
    return out


def resolve(
    flags: Mapping[str, Any], env: Mapping[str, Any], file_values: Mapping[str, Any]
) -> tuple[Settings, dict[str, str]]:
    """Merge setting values by precedence: flag > env > file > default.

    Each mapping holds only the values given at that level (already typed).
    Returns the (unvalidated) :class:`Settings` and ``{field: source}`` with
    source one of :data:`SOURCES`.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field in dataclasses.fields(Settings):
        for source, level in (("flag", flags), ("env", env), ("file", file_values)):
            if level.get(field.name) is not None:
                values[field.name] = level[field.name]
                sources[field.name] = source
                break
        else:
            sources[field.name] = "default"
    return Settings(**values), sources


def env_dsn() -> str:
    """Return ``SCHEDULER_DSN`` or an empty string."""
    return os.environ.get("SCHEDULER_DSN", "")
