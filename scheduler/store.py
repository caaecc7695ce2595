"""The one module that talks to the SQL store.

SQL lives in ``scheduler/sql/queries.sql`` as named queries (``-- name:
verb_object`` headers), loaded once into :data:`QUERIES`; nothing else builds
SQL. Parameters are psycopg placeholders; arrays are bound as binary
(``%(x)b``) because psycopg otherwise sends list parameters as text, which
costs 2× on the hot path.

Connections: every node session sets ``lock_timeout``, ``statement_timeout``
and ``idle_in_transaction_session_timeout`` well below the lease TTL
(docs/design.md §2), so a frozen node's open transaction is aborted by the store
and cannot hold the partition rows' locks past its lease. The converse (a
store or proxy that goes silent while the node waits) is bounded on the
client: every node session is opened by :func:`node_connect`, with TCP
keepalives, ``tcp_user_timeout`` and the watchdog's bounds on each blocking
call (:mod:`scheduler.watchdog`).

Retries (docs/design.md §7): CockroachDB (and PostgreSQL at SERIALIZABLE) ask
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
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus, unquote, urlencode, urlsplit

import psycopg
from psycopg.rows import dict_row

from scheduler import log
from scheduler.errors import ConfigError, StoreError, StoreSetupError
from scheduler.settings import Settings
from scheduler.watchdog import CallBounds, Watchdog, WatchedConnection
from scheduler.watchdog import shared as shared_watchdog

T = TypeVar("T")
Row = dict[str, Any]
"""A result row of :func:`execute`: column name to value (the connections' ``dict_row``)."""

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


def _uri_userinfo(dsn: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, rest from the '@')`` of a URI DSN with user info, else None.

    The user info is taken up to the *last* ``@``: a password with an
    unescaped ``@``, ``/``, ``?`` or ``#`` is then masked whole, whichever way
    libpq or Python's urlsplit would split it.
    """
    scheme, sep, rest = dsn.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return None
    return scheme + sep, rest[:at], rest[at:]


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***`` (URI or key=value form)."""
    if "://" in dsn:
        parts = _uri_userinfo(dsn)
        if parts is not None and ":" in parts[1]:
            dsn = parts[0] + parts[1].split(":", 1)[0] + ":***" + parts[2]
        return re.sub(r"(password=)[^&]*", r"\1***", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


DSN_URI_AT_RULE = (
    "a URI may hold '@' only once, between the user info and the host: percent-encode "
    "@ : / ? # in the user name and password (e.g. @ as %40)"
)
"""The rule :func:`check_dsn` names for a URI libpq would split elsewhere than meant."""

_AUTHORITY_END = re.compile(r"[/?#]")


def check_dsn(dsn: str) -> None:
    """Refuse a DSN that cannot mean what it says, before anything connects with it.

    Called by every path that opens the store (:func:`connect`, so node
    sessions, the CLI and the health probe; :func:`sqlalchemy_url`, so
    migrations). A URI (``scheme://...``) whose authority holds more than one
    ``@``, or with an ``@`` after its authority (in the path, query or
    fragment), has a user name or password with an unescaped ``@`` (and then
    perhaps ``/ ? #``): libpq would take part of the password for the host
    or the database, and echo it in its errors. A DSN libpq cannot parse at
    all (``garbage``, a ``mysql://`` URI, an unknown keyword) is refused too.
    Raises :class:`ConfigError` (``dsn: <rule>``, exit status 2) that never
    holds the password; an empty ``dsn`` passes (callers say none is set).
    """
    if "://" in dsn:
        rest = dsn.split("://", 1)[1]
        end = _AUTHORITY_END.search(rest)
        authority, after = (rest, "") if end is None else (rest[: end.start()], rest[end.start() :])
        if authority.count("@") > 1 or "@" in after:
            raise ConfigError(f"dsn: {DSN_URI_AT_RULE}")
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(libpq_dsn(dsn))
    except psycopg.Error as exc:
        raise ConfigError(
            "dsn: must be a URI (postgresql://user:password@host:5432/dbname) or libpq keywords "
            f"(host=... dbname=...); libpq: {redact_text(_first_line(exc), dsn)}"
        ) from None


def dsn_secrets(dsn: str) -> list[str]:
    """The password(s) in ``dsn`` as written and percent-decoded (URI or key=value form).

    A URI password holding an unescaped ``@``, ``:``, ``/``, ``?`` or ``#``
    would be misparsed by libpq, whose errors would echo pieces of it (e.g.
    ``failed to resolve host 'SuperSecret42@127.0.0.1'`` for the password
    ``Pass@SuperSecret42``); :func:`check_dsn` refuses such a URI before
    libpq sees it, and as a second line of defence those pieces (at least
    :data:`scheduler.log.MIN_SECRET_CHARS` long) are secrets too. Callers
    register the result with :func:`scheduler.log.add_secret` so they are
    scrubbed from every log line and error message.
    """
    found: list[str] = []
    if "://" in dsn:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        raw = ([password] if password else []) + re.findall(r"[?&]password=([^&#]*)", dsn)
        parts = _uri_userinfo(dsn)
        if parts is not None and ":" in parts[1]:
            raw.append(parts[1].split(":", 1)[1])
        for secret in raw:
            found += [secret, unquote(secret)]
        for secret in raw:
            if re.search(r"[@:/?#]", secret):
                found += [piece for piece in re.split(r"[@:/?#]", secret) if len(piece) >= log.MIN_SECRET_CHARS]
    else:
        for match in re.findall(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn):
            found.append(match)
            if match.startswith("'") and match.endswith("'"):
                found.append(re.sub(r"\\(.)", r"\1", match[1:-1]))
    return [secret for secret in dict.fromkeys(found) if secret]


def secret_spellings(dsn: str) -> list[str]:
    """:func:`dsn_secrets`, each also percent-encoded as in a URL (``quote``, ``quote_plus``):
    the spellings a driver's or SQLAlchemy's error may echo (:func:`sqlalchemy_url` encodes them)."""
    found = dsn_secrets(dsn)
    return list(dict.fromkeys(found + [quote(s, safe="") for s in found] + [quote_plus(s) for s in found]))


def redact_text(text: str, dsn: str) -> str:
    """Return ``text`` (an error message) without ``dsn`` or any of its passwords.

    The DSN itself, wherever ``text`` echoes it, is replaced by
    :func:`redact_dsn`'s form; then every spelling of a password
    (:func:`secret_spellings`) at least :data:`scheduler.log.MIN_SECRET_CHARS`
    long is replaced by ``***``. A shorter one is left in free text, which it
    would mangle (``y`` in ``mysql``); it is still masked inside the DSN.
    """
    if dsn:
        text = text.replace(dsn, redact_dsn(dsn))
        for secret in sorted(secret_spellings(dsn), key=len, reverse=True):
            if len(secret) >= log.MIN_SECRET_CHARS:
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
    :func:`redact_dsn`). Raises :class:`ConfigError` (:func:`check_dsn`) for a
    DSN libpq would misparse or cannot parse.
    """
    check_dsn(dsn)
    for prefix, replacement in (
        ("postgresql://", "postgresql+psycopg://"),
        ("postgres://", "postgresql+psycopg://"),
        ("cockroachdb://", "cockroachdb+psycopg://"),
    ):
        if dsn.startswith(prefix):
            return replacement + dsn[len(prefix) :]
    if "://" in dsn:
        return dsn
    from psycopg.conninfo import conninfo_to_dict

    params = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}  # parses: check_dsn passed
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
    opened), :class:`StoreError` (with the password and anything the driver
    echoed of it redacted) if the store cannot be reached.
    """
    check_dsn(dsn)
    options = []
    for guc, value in (
        ("lock_timeout", lock_timeout_s),
        ("statement_timeout", statement_timeout_s),
        ("idle_in_transaction_session_timeout", idle_in_transaction_timeout_s),
    ):
        if value is not None:
            options.append(f"-c {guc}={max(1, int(value * 1000))}")
    cls: type[psycopg.Connection[Any]] = psycopg.Connection if watch is None else WatchedConnection
    try:
        conn: psycopg.Connection[Row] = cls.connect(
            libpq_dsn(dsn),
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name,
            connect_timeout=max(1, int(connect_timeout_s)),
            options=" ".join(options) or None,
            **conninfo,
        )
    except psycopg.Error as exc:
        raise StoreError(
            f"cannot connect to the store at {redact_dsn(dsn)}: {redact_text(_first_line(exc), dsn)}",
            getattr(exc, "sqlstate", None),
        ) from exc
    if isinstance(conn, WatchedConnection) and watch is not None:
        conn.watch = (watchdog or shared_watchdog(), watch, application_name)
    return conn


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


SETUP_SQLSTATES = {"28000": "authentication", "28P01": "authentication", "3D000": "database"}
"""SQLSTATEs of a misconfigured store (a query's error; CockroachDB reports a
missing database on the first query)."""

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
)
"""A failed *connection* carries no SQLSTATE (libpq keeps the server's error
to itself), so these are recognised by libpq's and the server's (English)
messages; anything else counts as transient and is retried."""

SETUP_HINTS = {
    "authentication": "check the DSN's user and password (in a URI, percent-encode @ : / ? # % in the "
    "password, e.g. @ as %40)",
    "database": "create the database, then run `scheduler db upgrade`",
    "host": "a host name cannot hold an '@': check the DSN's host (a URI password must percent-encode '@' as %40)",
    "setting": "a DSN setting has a value libpq refuses: fix the one it names",
}


def setup_problem(exc: BaseException) -> str | None:
    """``"authentication"``, ``"database"``, ``"host"`` or ``"setting"`` if ``exc`` (a failed
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
        line = redact_text(_first_line(exc), dsn)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_retryable(exc: BaseException) -> bool:
    """True if ``exc`` is a store error whose SQLSTATE asks for a transaction retry."""
    return isinstance(exc, psycopg.Error) and getattr(exc, "sqlstate", None) in RETRYABLE_SQLSTATES


def run_transaction(
    conn: psycopg.Connection[Any],
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


def execute(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None = None, *, prepare: bool | None = None
) -> list[Row]:
    """Execute the named query and return its rows (``[]`` if it returns none).

    ``prepare`` is psycopg's: ``None`` prepares server-side after a few
    executions, ``False`` never (see ``FIRE_RUNS_PREPARE`` in firing.py).
    """
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params, prepare=prepare)
        rows: list[Row] = cur.fetchall() if cur.description is not None else []
        return rows


def now(conn: psycopg.Connection[Any], pinned: datetime | None = None) -> datetime:
    """The store's clock (aware): ``pinned`` if given, else the store's ``now()``.

    ``pinned`` is a clock's store pin (:meth:`scheduler.clock.Clock.store_now_or_none`,
    None in production); on an autocommit connection ``now()`` is the
    instant of this call, in a transaction its start.
    """
    instant: datetime = execute(conn, "store_now", {"now": pinned})[0]["store_now"]
    return instant


def execute_rowcount(conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None = None) -> int:
    """Execute the named query and return the number of rows it affected."""
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params)
        return cur.rowcount
