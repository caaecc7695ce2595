"""Is the store usable? The one classification of a store's problems (misconfigured, behind, transient)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg

from scheduler.errors import StoreError, StoreSetupError
from scheduler.settings import Settings
from scheduler.store.dsn import first_line, redact_text
from scheduler.store.queries import Row, execute
from scheduler.store.session import node_connect
from scheduler.watchdog import Watchdog

SETUP_SQLSTATES = {
    "28000": "authentication",
    "28P01": "authentication",
    "3D000": "database",
    "42501": "privileges",
}
"""SQLSTATEs of a misconfigured store (a query's error; CockroachDB reports a
missing database on the first query; 42501: the role may log in but was granted
nothing on the tables)."""

SETUP_MESSAGES = (
    (
        "authentication",
        re.compile(
            r"password authentication failed|authentication failed for user"
            r"|no pg_hba\.conf entry|role \"[^\"]*\" does not exist"
            r"|password is required|server requested .* password",
            re.IGNORECASE,
        ),
    ),
    ("database", re.compile(r"database \"[^\"]*\" does not exist", re.IGNORECASE)),
    ("host", re.compile(r"(?:failed to resolve host|could not translate host name) [\"'][^\"']*@")),
    # libpq refusing a parameter's value (port 99999, sslmode=bogus, ...) before any network traffic
    ("setting", re.compile(r"invalid (?:port number|integer value|[a-z_]+ value)", re.IGNORECASE)),
    # the server refusing the DSN's options (options=-cfoo, -c work_mem=bogus, -c no_such=1)
    (
        "setting",
        re.compile(
            r"-c \S+ requires a value|invalid value for parameter|unrecognized configuration parameter",
            re.IGNORECASE,
        ),
    ),
)
"""A failed *connection* carries no SQLSTATE (libpq keeps the server's error
to itself), so these are recognised by libpq's and the server's (English)
messages; anything else counts as transient and is retried."""

SETUP_HINTS = {
    "authentication": "check the DSN's user and password (in a URI, percent-encode @ : / ? # % in the "
    "password, e.g. @ as %40)",
    "database": "create the database, then run `scheduler db upgrade`",
    "host": "a host name cannot hold an '@': check the DSN's host (a URI password must percent-encode '@' as %40)",
    "setting": "a setting of the DSN (or of PGOPTIONS, PGSSLMODE and the other PG* environment variables) "
    "has a value libpq or the server refuses: fix the one it names",
    "privileges": "the DSN's role lacks privileges on the scheduler's tables: grant them "
    '(docs/operations.md, "Deploy") or use the role that owns them',
}


def setup_problem(exc: BaseException) -> str | None:
    """``"authentication"``, ``"database"``, ``"host"``, ``"setting"`` or ``"privileges"`` if ``exc`` (a failed
    connection or query, or a :class:`StoreError` caused by one) shows a
    misconfigured store that retrying cannot fix; None for anything else
    (a refused connection, a timeout: transient)."""
    cause = exc.__cause__ if isinstance(exc, StoreError) and exc.__cause__ is not None else exc
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate in SETUP_SQLSTATES:
        return SETUP_SQLSTATES[sqlstate]
    if isinstance(cause, psycopg.OperationalError) or isinstance(exc, StoreError):
        text = str(cause)
        for problem, pattern in SETUP_MESSAGES:
            if pattern.search(text):
                return problem
    return None


def check_schema(conn: psycopg.Connection[Any], revisions: tuple[str, frozenset[str]] | None) -> None:
    """Raise :class:`StoreSetupError` if the store's schema is missing or behind.

    ``revisions`` is ``(head, known revisions)`` of the migration scripts
    (:func:`scheduler.migrate.script_revisions`); with None only a missing
    schema is detected. A recorded revision this code does not know is newer
    than the code (a rolling upgrade): accepted. Other store errors propagate.
    """
    hint = "run `scheduler db upgrade` first"
    try:
        found = {row["version_num"] for row in execute(conn, "select_schema_version")}
    except psycopg.errors.UndefinedTable:
        raise StoreSetupError(f"store: the schema is missing (no alembic_version table); {hint}") from None
    if not found:
        raise StoreSetupError(f"store: the schema is missing (alembic_version is empty); {hint}")
    if revisions is None:
        return
    head, known = revisions
    if head not in found and found <= known:
        raise StoreSetupError(
            f"store: the schema is at revision {', '.join(sorted(found))}, behind this version's {head}; {hint}"
        )


def open_usable(
    opener: Callable[[], psycopg.Connection[Row]],
    dsn: str,
    revisions: tuple[str, frozenset[str]] | None = None,
    *,
    schema: bool = True,
) -> psycopg.Connection[Row]:
    """Open a session with ``opener()`` and check the store can be used; return the open session.

    The one classification of a store's problems, shared by the node's
    start-up check (:func:`check_node_store`) and every CLI command:
    :class:`StoreSetupError` (with the fix in its message; exit status 2) if
    it is misconfigured: authentication refused, database absent (see
    :func:`setup_problem`) or, with ``schema``, the schema missing or behind
    ``revisions`` (:func:`check_schema`; a newer one is accepted).
    :class:`ConfigError` for a DSN :func:`check_dsn` refuses;
    :class:`StoreError` (password redacted; exit status 1) if the store
    cannot be reached or the check failed otherwise: transient. ``dsn`` is
    the one ``opener`` uses (to redact errors).
    """
    try:
        conn = opener()
    except StoreError as exc:
        problem = setup_problem(exc)
        if problem is not None:
            raise StoreSetupError(f"store: {exc}; {SETUP_HINTS[problem]}") from None
        raise
    if not schema:
        return conn
    try:
        check_schema(conn, revisions)
    except StoreSetupError:
        conn.close()
        raise
    except psycopg.Error as exc:
        conn.close()
        line = redact_text(first_line(exc), dsn)
        problem = setup_problem(exc)
        if problem is not None:
            raise StoreSetupError(f"store: {line}; {SETUP_HINTS[problem]}") from None
        raise StoreError(f"store: {line}", exc.sqlstate) from None
    return conn


def check_node_store(
    settings: Settings, revisions: tuple[str, frozenset[str]] | None, watchdog: Watchdog | None = None
) -> str | None:
    """The node's start-up check of its store: None if usable.

    Opens a node session (:func:`node_connect`) and checks it as
    :func:`open_usable` does. Returns a one-line reason (password redacted)
    if the store cannot be reached now (refused, timed out: the caller
    retries); raises :class:`StoreSetupError` with the fix in its message if
    it is misconfigured (authentication refused, database absent, schema
    missing or behind), :class:`ConfigError` for a DSN :func:`check_dsn`
    refuses.
    """
    try:
        conn = open_usable(
            lambda: node_connect(settings, f"scheduler-check:{settings.node_id}", watchdog=watchdog),
            settings.dsn,
            revisions,
        )
    except StoreError as exc:
        return str(exc)
    conn.close()
    return None
