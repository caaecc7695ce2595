"""The one room that talks to the SQL store.

Nothing outside this package opens a connection, sends a transaction's
``BEGIN``/``COMMIT`` or names a psycopg cursor; callers run named queries
(:func:`execute`, :func:`stream`) on sessions and pipelines built here. Its
modules:

* :mod:`~scheduler.store.dsn`: check a DSN before connecting, redact its
  password, name its SQLAlchemy dialect (migrations), describe a failed
  connection (:func:`connect_error`: every host of a multi-host DSN).
* :mod:`~scheduler.store.session`: :func:`connect`, :func:`sqlalchemy_engine`
  (the migrations' connections, opened by :func:`connect`), :func:`node_connect`
  (the one builder of a node's sessions: timeouts, keepalives, the
  watchdog's bounds) and :class:`StoreSession` (a node session opened on
  first use, reopened after a failure; its transactions retried).
* :mod:`~scheduler.store.queries`: the named queries of
  ``scheduler/sql/queries.sql`` (:data:`QUERIES`) and how they run
  (:func:`execute`, :func:`execute_probing`, :func:`execute_rowcount`,
  :func:`stream`, :func:`now`).
* :mod:`~scheduler.store.retry`: the 40001/40P01 retry of a whole
  transaction (:func:`run_transaction`, docs/design.md §7).
* :mod:`~scheduler.store.pipeline`: a firing tick's write lanes in pipeline
  mode (:class:`Pipeline`: BEGIN; statement; COMMIT per chunk, round robin;
  the outcomes collected for the caller to count).
* :mod:`~scheduler.store.check`: is the store usable (authentication,
  database, schema revision), for the node's start-up check and every CLI
  command.

Every name below is re-exported here: callers write ``store.execute(...)``
(and tests patch ``store.execute``).
"""

from __future__ import annotations

from scheduler.store.check import (
    SETUP_HINTS,
    SETUP_MESSAGES,
    SETUP_SQLSTATES,
    check_node_store,
    check_schema,
    open_usable,
    setup_problem,
)
from scheduler.store.dsn import (
    DSN_URI_AT_RULE,
    check_dsn,
    connect_error,
    dsn_secrets,
    first_line,
    libpq_dsn,
    redact_dsn,
    redact_text,
    secret_spellings,
    sqlalchemy_dialect,
)
from scheduler.store.pipeline import Pipeline, Sent, resend
from scheduler.store.queries import (
    QUERIES,
    FrozenArray,
    Row,
    execute,
    execute_probing,
    execute_rowcount,
    execute_within,
    is_probe_session,
    limit_statements,
    load_queries,
    make_probe_session,
    now,
    stream,
)
from scheduler.store.retry import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    MAX_ATTEMPTS,
    RETRYABLE_SQLSTATES,
    is_retryable,
    run_statement,
    run_transaction,
)
from scheduler.store.session import (
    StoreSession,
    connect,
    drops_connection,
    keepalive_params,
    node_connect,
    pin_time_zone,
    session_options,
    sqlalchemy_engine,
)

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_MAX_S",
    "DSN_URI_AT_RULE",
    "MAX_ATTEMPTS",
    "QUERIES",
    "RETRYABLE_SQLSTATES",
    "SETUP_HINTS",
    "SETUP_MESSAGES",
    "SETUP_SQLSTATES",
    "Pipeline",
    "FrozenArray",
    "Row",
    "Sent",
    "StoreSession",
    "check_dsn",
    "check_node_store",
    "check_schema",
    "connect",
    "drops_connection",
    "connect_error",
    "dsn_secrets",
    "execute",
    "execute_probing",
    "execute_rowcount",
    "execute_within",
    "is_probe_session",
    "limit_statements",
    "make_probe_session",
    "first_line",
    "is_retryable",
    "keepalive_params",
    "libpq_dsn",
    "load_queries",
    "node_connect",
    "now",
    "open_usable",
    "redact_dsn",
    "redact_text",
    "resend",
    "run_statement",
    "run_transaction",
    "secret_spellings",
    "pin_time_zone",
    "session_options",
    "setup_problem",
    "sqlalchemy_dialect",
    "sqlalchemy_engine",
    "stream",
]
