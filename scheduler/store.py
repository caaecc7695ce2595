"""The one module that talks to the SQL store.

SQL lives in ``scheduler/sql/queries.sql`` as named queries (``-- name:
verb_object`` headers), loaded once into :data:`QUERIES`; nothing else builds
SQL. Parameters are psycopg placeholders; arrays are bound as binary
(``%(x)b``) because psycopg otherwise sends list parameters as text, which
costs 2× on the hot path.

Connections: every node session sets ``lock_timeout``, ``statement_timeout``
and ``idle_in_transaction_session_timeout`` well below the lease TTL
(DESIGN.md §2), so a frozen node's open transaction is aborted by the store
and cannot hold the partition rows' locks past its lease.

Retries (DESIGN.md §7): CockroachDB (and PostgreSQL at SERIALIZABLE) ask
clients to retry a whole transaction on SQLSTATE 40001 (serialization
failure) and 40P01 (deadlock). :func:`run_transaction` does so with bounded,
jittered exponential backoff; the decision is made on the SQLSTATE class,
never on message text.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from importlib import resources
from typing import TypeVar
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

from scheduler import log
from scheduler.errors import StoreError

T = TypeVar("T")

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
"""Serialization failure and deadlock: retry the whole transaction."""

MAX_ATTEMPTS = 6
"""Attempts per transaction before :class:`StoreError` is raised."""

BACKOFF_BASE_S = 0.01
BACKOFF_MAX_S = 0.5


def load_queries() -> dict[str, str]:
    """Parse ``sql/queries.sql`` into ``{name: sql}``.

    Each query starts with a line ``-- name: <verb_object>``; the comment
    lines that follow document it in the file and are dropped from the SQL
    sent (so placeholders in prose are never bound). A trailing ``;`` is
    stripped. Raises ``ValueError`` on a duplicate name.
    """
    text = resources.files("scheduler").joinpath("sql/queries.sql").read_text()
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if name is not None:
            body = "\n".join(lines).strip().rstrip(";").strip()
            if name in queries:
                raise ValueError(f"duplicate query name {name!r} in queries.sql")
            queries[name] = body

    for line in text.splitlines():
        match = re.match(r"--\s*name:\s*(\w+)\s*$", line)
        if match:
            flush()
            name, lines = match.group(1), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    flush()
    return queries


QUERIES: dict[str, str] = load_queries()


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***`` (URI or key=value form)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password is not None:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
            dsn = urlunsplit(parts._replace(netloc=netloc))
        return re.sub(r"(password=)[^&]*", r"\1***", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def dsn_secrets(dsn: str) -> list[str]:
    """The password(s) in ``dsn`` as written and percent-decoded (URI or key=value form).

    Callers register them with :func:`scheduler.log.add_secret` so they are
    scrubbed from every log line and error message.
    """
    found: list[str] = []
    if "://" in dsn:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        raw = ([password] if password else []) + re.findall(r"[?&]password=([^&#]*)", dsn)
        for secret in raw:
            found += [secret, unquote(secret)]
    else:
        for match in re.findall(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn):
            found.append(match)
            if match.startswith("'") and match.endswith("'"):
                found.append(re.sub(r"\\(.)", r"\1", match[1:-1]))
    return [secret for secret in dict.fromkeys(found) if secret]


def redact_text(text: str, dsn: str) -> str:
    """Return ``text`` (an error message) without ``dsn`` or any of its passwords."""
    if dsn:
        text = text.replace(dsn, redact_dsn(dsn))
        for secret in sorted(dsn_secrets(dsn), key=len, reverse=True):
            text = text.replace(secret, "***")
    return text


def sqlalchemy_url(dsn: str) -> str:
    """Map a libpq DSN to a SQLAlchemy URL driven by psycopg 3.

    ``postgresql://``/``postgres://`` → ``postgresql+psycopg://``;
    ``cockroachdb://`` → ``cockroachdb+psycopg://`` (needs the
    ``sqlalchemy-cockroachdb`` package). URLs that already name a driver are
    returned unchanged. A key=value DSN (``host=db dbname=scheduler
    user=u password=p``) becomes ``postgresql+psycopg://u:p@db/scheduler``
    (user and password percent-encoded; a socket directory or several hosts,
    and every other keyword, as query parameters psycopg receives as they
    are). The result holds the password: never print it (see
    :func:`redact_dsn`). Raises :class:`StoreError` (password redacted) for a
    DSN that is neither a URI nor valid libpq keywords.
    """
    for prefix, replacement in (
        ("postgresql://", "postgresql+psycopg://"),
        ("postgres://", "postgresql+psycopg://"),
        ("cockroachdb://", "cockroachdb+psycopg://"),
    ):
        if dsn.startswith(prefix):
            return replacement + dsn[len(prefix):]
    if "://" in dsn:
        return dsn
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    except psycopg.Error as exc:
        raise StoreError(f"the store DSN is neither a URI (postgresql://user:pass@host:port/db) nor valid "
                         f"libpq keywords (host=... dbname=...): {redact_text(_first_line(exc), dsn)}") from None
    user, password, dbname = params.pop("user", None), params.pop("password", None), params.pop("dbname", None)
    host = port = None
    if "host" in params and not params["host"].startswith("/") and "," not in params["host"]:
        host = params.pop("host")
        if params.get("port", "").isdigit():
            port = params.pop("port")
    auth = "" if user is None else quote(user, safe="") + ("" if password is None else ":" + quote(password, safe=""))
    netloc = (f"{auth}@" if auth else "") + (host or "") + ("" if port is None else f":{port}")
    query = urlencode(params, quote_via=quote)
    return f"postgresql+psycopg://{netloc}/{quote(dbname or '', safe='')}" + (f"?{query}" if query else "")


def libpq_dsn(dsn: str) -> str:
    """Return a DSN psycopg can open (strips SQLAlchemy driver suffixes)."""
    return re.sub(r"^(postgresql|cockroachdb)\+\w+://", "postgresql://", dsn).replace(
        "cockroachdb://", "postgresql://", 1
    )


def connect(
    dsn: str,
    *,
    application_name: str = "scheduler",
    lock_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
    idle_in_transaction_timeout_s: float | None = None,
    connect_timeout_s: float = 5.0,
    **conninfo: object,
) -> psycopg.Connection:
    """Open an autocommit connection with the node session settings.

    Timeouts are in seconds (sent to the store in milliseconds); ``None``
    leaves the store's default. Extra keyword arguments are libpq connection
    parameters (e.g. ``keepalives_idle``). Rows come back as dicts. Raises
    :class:`StoreError` (with the password redacted) if the store cannot be
    reached.
    """
    options = []
    for guc, value in (
        ("lock_timeout", lock_timeout_s),
        ("statement_timeout", statement_timeout_s),
        ("idle_in_transaction_session_timeout", idle_in_transaction_timeout_s),
    ):
        if value is not None:
            options.append(f"-c {guc}={max(1, int(value * 1000))}")
    try:
        return psycopg.connect(
            libpq_dsn(dsn),
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name,
            connect_timeout=max(1, int(connect_timeout_s)),
            options=" ".join(options) or None,
            **conninfo,
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to the store at {redact_dsn(dsn)}: "
                         f"{redact_text(_first_line(exc), dsn)}",
                         getattr(exc, "sqlstate", None)) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_retryable(exc: BaseException) -> bool:
    """True if ``exc`` is a store error whose SQLSTATE asks for a transaction retry."""
    return isinstance(exc, psycopg.Error) and getattr(exc, "sqlstate", None) in RETRYABLE_SQLSTATES


def run_transaction(
    conn: psycopg.Connection,
    body: Callable[[psycopg.Connection], T],
    *,
    max_attempts: int = MAX_ATTEMPTS,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``body(conn)`` in one transaction, retrying it whole on 40001/40P01.

    ``body`` must be safe to run again (it is re-executed from the start).
    Backoff between attempts: full jitter over ``min(BACKOFF_MAX_S,
    BACKOFF_BASE_S × 2^attempt)`` seconds. ``on_retry(sqlstate)`` is called
    before each retry (for metrics). Raises :class:`StoreError` (from the
    last error) when attempts run out; non-retryable ``psycopg.Error``\\ s
    propagate unchanged.
    """
    for attempt in range(max_attempts):
        try:
            with conn.transaction():
                return body(conn)
        except psycopg.Error as exc:
            if not is_retryable(exc) or conn.closed:
                raise
            if attempt == max_attempts - 1:
                raise StoreError(
                    f"transaction failed after {max_attempts} attempts: {_first_line(exc)}", exc.sqlstate
                ) from exc
            if on_retry is not None:
                on_retry(exc.sqlstate or "")
            log.event("transaction_retry", logging.DEBUG, sqlstate=exc.sqlstate, attempt=attempt + 1)
            sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt)))
    raise AssertionError("unreachable")


def execute(conn: psycopg.Connection, name: str, params: dict | None = None, *,
            prepare: bool | None = None) -> list[dict]:
    """Execute the named query and return its rows (``[]`` if it returns none).

    ``prepare`` is psycopg's: ``None`` prepares server-side after a few
    executions, ``False`` never (see ``FIRE_RUNS_PREPARE`` in firing.py).
    """
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params, prepare=prepare)
        return cur.fetchall() if cur.description is not None else []


def execute_rowcount(conn: psycopg.Connection, name: str, params: dict | None = None) -> int:
    """Execute the named query and return the number of rows it affected."""
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params)
        return cur.rowcount
