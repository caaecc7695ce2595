"""Connections and the node session.

Every node session sets ``lock_timeout``, ``statement_timeout`` and
``idle_in_transaction_session_timeout`` well below the lease TTL
(docs/design.md §2), so a frozen node's open transaction is aborted by the
store and cannot hold the partition rows' locks past its lease. The converse
(a store or proxy that goes silent while the node waits) is bounded on the
client: every node session is opened by :func:`node_connect`, with TCP
keepalives, ``tcp_user_timeout`` and the watchdog's bounds on each blocking
call (:mod:`scheduler.watchdog`). :class:`StoreSession` is the one node
session object (firing lanes, lease coordinators, retention, the health
probe): opened on first use, reopened after a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg.conninfo
from psycopg.rows import dict_row, tuple_row

from scheduler.clock import Clock, SystemClock
from scheduler.errors import StoreError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.dsn import check_dsn, connect_error, libpq_dsn, redact_dsn, redact_text, sqlalchemy_dialect
from scheduler.store.queries import Row
from scheduler.store.retry import run_transaction
from scheduler.watchdog import CallBounds, Watchdog, WatchedConnection
from scheduler.watchdog import shared as shared_watchdog

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

T = TypeVar("T")

PREPARE_THRESHOLD: int | None = None
"""psycopg's ``prepare_threshold`` of every engine session: ``None``, never
prepare a statement server-side. A prepared statement gets a *generic* plan
after five executions, and PostgreSQL keeps it until the table is analyzed
again; the engine repeats its statements over tables whose size swings by
orders of magnitude within seconds (``runs`` fills with a herd; a partial
index such as ``runs_push_idx`` is empty, then not). A generic plan made
while ``runs`` was empty was a sequential scan, and the push loop's poll
(``due_push_partitions``, 4 a second) and the settle loop's steps then read
every run at each call: about a third of the store's CPU during a
300,000-run herd (auto_explain, docs/performance.md "Delivery"). Planning
each statement costs well under a millisecond; the firing statements were
already never prepared (``FIRE_RUNS_PREPARE``) for the same reason."""


SESSION_TIME_ZONE = "UTC"
"""Every session's ``TimeZone``, whatever the server's default: the engine reads and
writes instants only, and psycopg decodes a ``timestamptz`` of a session in ``UTC``
as a datetime with :data:`datetime.UTC`, ~5x cheaper than one with a named zone's
``ZoneInfo`` (a Debian cluster's default is ``Etc/UTC``): 0.55 against 3.1 µs for a
row of four timestamps, and a worker's claim reads four per run (docs/performance.md,
"2026-12-02, night"). SQL that depends on the session's zone (none does; ``date_trunc
('second', …)`` is the same in every zone of whole-second offsets) would see UTC."""


def own_options(dsn: str) -> str:
    """The ``options`` the DSN carries, as libpq would find them: ``options=…`` in the DSN,
    else those of the service it names (``service=…``, else ``PGSERVICE``; see
    :func:`service_options`), else the ``PGOPTIONS`` environment variable; ``""`` if none.
    :func:`connect` sends them first and the engine's own after, so a DSN's ``-c
    search_path=…`` or ``-c work_mem=…`` reaches the server (libpq takes one ``options``
    value, and an explicit one replaces all of those) while the engine's settings win where
    both name one."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(libpq_dsn(dsn))
    except psycopg.ProgrammingError:
        params = {}  # libpq reports a malformed DSN itself, at connect
    if params.get("options"):
        return str(params["options"])
    service = params.get("service") or os.environ.get("PGSERVICE")
    found = service_options(str(service)) if service else None
    return found if found is not None else os.environ.get("PGOPTIONS", "")


SYSTEM_SERVICE_DIRS = ("/etc/postgresql-common", "/etc")
"""Where :func:`service_options` looks for the system-wide ``pg_service.conf`` when
``PGSYSCONFDIR`` is not set (Debian's libpq is built with the first)."""


def service_options(service: str) -> str | None:
    """The ``options`` line of ``service`` in libpq's connection service file, or None if the
    service or its ``options`` is not found there. Searched as libpq does: the user's file
    (``PGSERVICEFILE``, else ``~/.pg_service.conf``) first, then the system's
    (``$PGSYSCONFDIR/pg_service.conf``, else :data:`SYSTEM_SERVICE_DIRS`); the first file that
    has the service decides. The format is libpq's: ``[name]`` sections of ``key=value`` lines,
    ``#`` comments. Never raises (an unreadable file is skipped; libpq reports it at connect)."""
    user = os.environ.get("PGSERVICEFILE") or os.path.expanduser("~/.pg_service.conf")
    system_dirs = [os.environ["PGSYSCONFDIR"]] if os.environ.get("PGSYSCONFDIR") else SYSTEM_SERVICE_DIRS
    for path in (user, *(os.path.join(d, "pg_service.conf") for d in system_dirs)):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        section: str | None = None
        found = False
        options: str | None = None
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                found = found or section == service
                continue
            key, sep, value = line.partition("=")
            if sep and section == service and key.strip() == "options":
                options = value.strip()
        if found:
            return options
    return None


def session_options(dsn: str, **timeouts_s: float | None) -> str:
    """libpq's ``options`` of an engine session on ``dsn``: the DSN's own (:func:`own_options`),
    then ``TimeZone`` (:data:`SESSION_TIME_ZONE`), then each ``name=seconds`` of ``timeouts_s``
    that is not None as ``-c name=<milliseconds, at least 1>``."""
    options = [own_options(dsn), f"-c TimeZone={SESSION_TIME_ZONE}"]
    for guc, value in timeouts_s.items():
        if value is not None:
            options.append(f"-c {guc}={max(1, int(value * 1000))}")
    return " ".join(option for option in options if option)


def pin_time_zone(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn``'s session zone :data:`SESSION_TIME_ZONE` if the server reports another.

    The engine asks for it in every session's ``options`` (:func:`session_options`), but
    libpq also sends the ``PGTZ`` environment variable as a startup parameter of its own,
    which the server applies after them: with ``PGTZ`` set, a session read times in that
    zone (handlers got ``nominal_time`` in New York's zone, the API wrote ``+05:30``
    offsets). One ``SET`` then, on an autocommit connection; nothing is sent when the
    server already reports UTC (every session without ``PGTZ``). Raises ``psycopg.Error``
    if the ``SET`` fails."""
    if conn.info.parameter_status("TimeZone") != SESSION_TIME_ZONE:
        conn.execute(f"SET TimeZone TO '{SESSION_TIME_ZONE}'")


def connect(
    dsn: str,
    *,
    application_name: str = "scheduler",
    lock_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
    idle_in_transaction_timeout_s: float | None = None,
    connect_timeout_s: float = 5.0,
    watch: CallBounds | None = None,
    watchdog: Watchdog | None = None,
    **conninfo: Any,
) -> psycopg.Connection[Row]:
    """Open an autocommit connection with the node session settings.

    Timeouts are in seconds (sent to the store in milliseconds); ``None``
    leaves the store's default. Extra keyword arguments are libpq connection
    parameters (e.g. ``keepalives_idle``). Rows come back as dicts. With
    ``watch``, the connection is a :class:`~scheduler.watchdog.WatchedConnection`
    whose blocking calls ``watchdog`` (default: the process's,
    :func:`scheduler.watchdog.shared`) bounds by ``watch``. Raises
    :class:`ConfigError` for a DSN :func:`check_dsn` refuses (nothing is
    opened), :class:`StoreError` if the store cannot be reached: one line,
    ``cannot connect to the store at <DSN, password masked>: <host:port>:
    <reason>; ...`` naming every host a multi-host DSN lists
    (:func:`connect_error`), with the password and anything the driver
    echoed of it redacted. ``dsn`` is handed to libpq as written, so every
    form it accepts works here: several hosts (``h1:p1,h2:p2``,
    ``?host=h1,h2&port=p1,p2``, ``host=h1,h2 port=p1,p2``), tried in turn
    with ``target_session_attrs``. Statements are never prepared server-side
    (:data:`PREPARE_THRESHOLD`); the session's time zone is
    :data:`SESSION_TIME_ZONE`, and the DSN's own ``options`` are kept
    (:func:`own_options`).
    """
    check_dsn(dsn)
    options = session_options(
        dsn,
        lock_timeout=lock_timeout_s,
        statement_timeout=statement_timeout_s,
        idle_in_transaction_session_timeout=idle_in_transaction_timeout_s,
    )
    cls: type[psycopg.Connection[Any]] = psycopg.Connection if watch is None else WatchedConnection
    try:
        conn: psycopg.Connection[Row] = cls.connect(
            libpq_dsn(dsn),
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name,
            connect_timeout=max(1, int(connect_timeout_s)),
            options=options,
            **conninfo,
        )
        try:
            pin_time_zone(conn)
        except BaseException:
            conn.close()
            raise
    except psycopg.Error as exc:
        raise StoreError(
            f"cannot connect to the store at {redact_dsn(dsn)}: {redact_text(connect_error(exc, dsn), dsn)}",
            getattr(exc, "sqlstate", None),
        ) from exc
    conn.prepare_threshold = PREPARE_THRESHOLD
    if isinstance(conn, WatchedConnection) and watch is not None:
        conn.watch_with(watchdog or shared_watchdog(), watch, application_name)
    return conn


def sqlalchemy_engine(dsn: str, application_name: str = "scheduler-migrate") -> Engine:
    """A SQLAlchemy engine (no pool) on ``dsn`` for the migrations (``alembic/env.py``).

    Its dialect comes from :func:`~scheduler.store.sqlalchemy_dialect`; each
    of its connections is opened by :func:`connect` (libpq, from the DSN as
    written, so every form libpq accepts works: several hosts tried in turn,
    ``target_session_attrs``, keywords), then handed to SQLAlchemy as it
    expects one: not autocommit, rows as tuples. Raises :class:`ConfigError`
    for a DSN :func:`check_dsn` refuses (nothing is opened); opening a
    connection raises :class:`StoreError` as :func:`connect` does (every
    host's failure on one line, the password redacted).
    """
    from sqlalchemy import create_engine, pool

    def creator() -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] = connect(dsn, application_name=application_name)
        conn.autocommit = False
        conn.row_factory = tuple_row
        return conn

    return create_engine(sqlalchemy_dialect(dsn), creator=creator, poolclass=pool.NullPool)


def keepalive_params(settings: Settings) -> dict[str, int]:
    """libpq TCP parameters of a node session, from ``settings`` (see Settings' ``keepalive_*``).

    ``keepalives``/``keepalives_idle``/``keepalives_interval``/``keepalives_count``
    (whole seconds) and ``tcp_user_timeout`` (milliseconds): a peer that
    stops acknowledging is given up after about ``tcp_user_timeout_s``.
    """
    return {
        "keepalives": 1,
        "keepalives_idle": settings.keepalive_idle_s,
        "keepalives_interval": settings.keepalive_interval_s,
        "keepalives_count": settings.keepalive_count,
        "tcp_user_timeout": max(1, int(settings.effective_tcp_user_timeout_s * 1000)),
    }


def node_connect(
    settings: Settings,
    application_name: str,
    *,
    statement_timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
    watchdog: Watchdog | None = None,
) -> psycopg.Connection[Row]:
    """Open a node session: the one place the node's store connections are built.

    Every session of a node (firing lanes, lease loop, retention, health
    probe) carries, from ``settings``: ``lock_timeout``, ``statement_timeout``
    (``statement_timeout_s`` overrides it, e.g. the probe's 1 s) and
    ``idle_in_transaction_session_timeout``; TCP keepalives and
    ``tcp_user_timeout`` (:func:`keepalive_params`); and the watchdog's
    bounds on every blocking call (statement timeout + ``store_call_margin_s``
    to cancel, + 2 × margin to break the connection; see
    :mod:`scheduler.watchdog`). ``connect_timeout_s`` defaults to the
    ``tcp_user_timeout`` (at least 2 s, libpq's minimum). Raises
    :class:`StoreError` if the store cannot be reached.
    """
    statement = statement_timeout_s if statement_timeout_s is not None else settings.effective_statement_timeout_s
    if connect_timeout_s is None:
        connect_timeout_s = max(2.0, settings.effective_tcp_user_timeout_s)
    return connect(
        settings.dsn,
        application_name=application_name[:63],
        lock_timeout_s=settings.effective_lock_timeout_s,
        statement_timeout_s=statement,
        idle_in_transaction_timeout_s=settings.effective_idle_in_transaction_timeout_s,
        connect_timeout_s=connect_timeout_s,
        watch=CallBounds.after_statement_timeout(statement, settings.effective_store_call_margin_s),
        watchdog=watchdog,
        **keepalive_params(settings),
    )


def drops_connection(exc: BaseException) -> bool:
    """True if a session that met ``exc`` must be closed and opened again.

    A lost or unusable connection (``psycopg.OperationalError``, :class:`StoreError`),
    and a server that refuses writes as read-only (SQLSTATE 25006: a primary demoted to
    standby, or ``default_transaction_read_only`` turned on): it keeps the connection up
    and refuses every write, and only a new connection lets libpq pick the writable host of
    a multi-host DSN (``target_session_attrs=read-write``).
    """
    return isinstance(exc, (StoreError, psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction))


class StoreSession:
    """A node session: one autocommit connection of a node (:func:`node_connect`), opened on
    first use and reopened after a failure.

    The one node-session object: the lease coordinators (SQL and etcd, role
    ``lease``), the firing lanes (``fire``), retention and the health probe
    hold or extend it. The connection carries the node timeouts (lock,
    statement, idle in transaction), keepalives and the watchdog's bounds,
    and the application name ``scheduler-<role>:<node id>`` (or
    ``application_name``); ``statement_timeout_s`` and ``connect_timeout_s``
    override the settings' (:func:`node_connect`). ``clock`` (default the
    system clock) is the node's injected clock: its
    :meth:`~scheduler.clock.Clock.store_now_or_none` is the ``now`` every
    time-dependent query is sent (None in production: the store's
    ``now()``). ``metrics`` (optional) counts retries and store errors of
    :meth:`_tx`.
    """

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        *,
        role: str = "lease",
        application_name: str | None = None,
        statement_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._clock: Clock = clock or SystemClock()
        self._application_name = application_name or f"scheduler-{role}:{settings.node_id}"
        self._statement_timeout_s = statement_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.Connection[Row] | None = None

    def _connection(self) -> psycopg.Connection[Row]:
        """The open connection (opened now if there is none or it was closed); raises :class:`StoreError`."""
        if self._conn is None or self._conn.closed:
            self._conn = node_connect(
                self._settings,
                self._application_name,
                statement_timeout_s=self._statement_timeout_s,
                connect_timeout_s=self._connect_timeout_s,
            )
        return self._conn

    connection = _connection

    @property
    def open(self) -> bool:
        """True if the connection is open (it may still be broken: the next call finds out)."""
        return self._conn is not None and not self._conn.closed

    def _tx(self, body: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``body(conn)`` in one transaction, retried whole on 40001/40P01 (:func:`run_transaction`).

        A store error is counted (``metrics``) and re-raised; after a lost
        connection, a :class:`StoreError`, an error that closed it or a
        server that refused a write as read-only (:func:`drops_connection`),
        the session is closed, to be reopened by the next call.
        """
        try:
            conn = self._connection()
            return run_transaction(conn, body, on_retry=None if self._metrics is None else self._metrics.retry)
        except (psycopg.Error, StoreError) as exc:
            if self._metrics is not None:
                self._metrics.error(getattr(exc, "sqlstate", None))
            if drops_connection(exc) or (self._conn is not None and self._conn.closed):
                self.close()
            raise

    transaction = _tx

    def close(self) -> None:
        """Close the connection (if open); the next call opens a new one. Never raises a store error."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
