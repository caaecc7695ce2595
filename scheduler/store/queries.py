"""The named queries: ``scheduler/sql/queries.sql`` parsed once into :data:`QUERIES`, and how they run.

SQL lives in ``scheduler/sql/queries.sql`` as named queries (``-- name:
verb_object`` headers, then comment lines documenting it); nothing else
builds SQL. Parameters are psycopg placeholders; arrays are bound as binary
(``%(x)b``) because psycopg otherwise sends list parameters as text, which
costs 2× on the hot path. :func:`load_queries` also reads other packages'
query files (``bench/sql/queries.sql``: the bench's own queries).
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Generator, Iterator
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg
from psycopg.rows import tuple_row

Row = dict[str, Any]
"""A result row of :func:`execute`: column name to value (the connections' ``dict_row``)."""


def load_queries(package: str = "scheduler", path: str = "sql/queries.sql") -> dict[str, str]:
    """Parse ``path`` inside ``package`` (default ``scheduler/sql/queries.sql``) into ``{name: sql}``.

    Each query starts with a line ``-- name: <verb_object>``; the comment
    lines that follow document it in the file and are dropped from the SQL
    sent (so placeholders in prose are never bound). A trailing ``;`` is
    stripped. Raises ``ValueError`` on a duplicate name.
    """
    text = resources.files(package).joinpath(path).read_text()
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if name is not None:
            body = "\n".join(lines).strip().rstrip(";").strip()
            if name in queries:
                raise ValueError(f"duplicate query name {name!r} in {package}/{path}")
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


def execute(
    conn: psycopg.Connection[Any],
    name: str,
    params: dict[str, Any] | None = None,
    *,
    prepare: bool | None = None,
    queries: dict[str, str] | None = None,
    row_factory: Any = None,
    binary: bool = False,
) -> list[Any]:
    """Execute the named query and return its rows (``[]`` if it returns none).

    ``prepare`` is psycopg's: ``None`` prepares server-side after a few
    executions, ``False`` never (see ``FIRE_RUNS_PREPARE`` in
    :mod:`scheduler.firing.limits`). ``queries``: where ``name`` is looked up
    (default :data:`QUERIES`; the bench passes its own). ``row_factory``:
    psycopg's, for this statement only (default: the connection's, a dict
    per row); the hot paths that read a row per run pass one that builds
    their own objects (a dict per row costs more than the rest of the work).
    ``binary``: ask for the result columns in PostgreSQL's binary format
    (the same Python values, decoded from fixed-width fields instead of
    parsed from text): for the statements that return a row per run (a
    claim of up to 1,000 runs: 6.95 → 3.86 µs of client CPU per row,
    docs/performance.md, "2026-12-04, afternoon").
    """
    with conn.cursor() if row_factory is None else conn.cursor(row_factory=row_factory) as cur:
        cur.execute((QUERIES if queries is None else queries)[name], params, prepare=prepare, binary=binary)
        rows: list[Any] = cur.fetchall() if cur.description is not None else []
        return rows


def execute_within(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None, timeout_s: float
) -> list[Row]:
    """:func:`execute` in its own transaction whose statements may run at most
    ``timeout_s`` seconds (``SET LOCAL statement_timeout``, at least 1 ms):
    for optional work that must not outlast a deadline (the firer's
    look-ahead before the next tick). Raises ``psycopg.errors.QueryCanceled``
    past it, as every other store error."""
    with conn.transaction():
        limit_statements(conn, timeout_s)
        return execute(conn, name, params)


def limit_statements(conn: psycopg.Connection[Any], timeout_s: float) -> None:
    """Let the statements of the rest of ``conn``'s current transaction run at most
    ``timeout_s`` seconds each (``SET LOCAL statement_timeout``, at least 1 ms; the
    session's own timeout returns with the transaction's end). Raises what the store raises."""
    conn.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")


PROBE_SETTINGS = ("enable_hashjoin", "enable_mergejoin", "enable_seqscan", "enable_bitmapscan")
"""The planner settings a probing statement runs with turned off (see :func:`execute_probing`)."""
PROBE_JOINS_SQL = "; ".join(f"SET LOCAL {name} = off" for name in PROBE_SETTINGS)
"""What :func:`execute_probing` sends first on PostgreSQL (one round trip)."""


def execute_probing(
    conn: psycopg.Connection[Any],
    name: str,
    params: dict[str, Any] | None = None,
    *,
    row_factory: Any = None,
    binary: bool = False,
) -> list[Any]:
    """:func:`execute` inside the caller's transaction, ``runs`` reached by index probes only (PostgreSQL).

    For a claim (``claim_runs``, ``claim_push``), a batch of
    heartbeats, acks or nacks (``heartbeat_runs``, ``ack_runs``,
    ``nack_runs``), and a worker's ready probe (``tenants_with_pending_runs``,
    one ``LATERAL … LIMIT 1`` index probe per tenant): a claim locks up to 1,000
    picked runs, then updates them; the update must find each by one
    primary-key probe, so a claim costs the same whatever ``runs`` holds.
    PostgreSQL's planner, whose cost model assumes uncached random reads
    (``random_page_cost`` 4), hashed the whole table instead whenever
    ``runs`` held under ~300,000 rows, most of them pending (the minutes
    after a herd): every claim then read every pending run, and the drain
    slowed as its backlog grew (tests/integration/test_store_plans.py).
    ``SET LOCAL`` turns hash joins, merge joins, sequential scans and bitmap
    scans off for the rest of the caller's transaction (its
    :func:`run_transaction` body), which leaves the planner one sane plan: a
    nested loop from the picked runs into ``runs_pkey`` (for a batch: from
    its pairs), and every "first N in index order" read an ordered index scan
    that stops after N (a bitmap scan reads every match, then sorts: a
    worker's next-due probe, ``tenants_next_due``, planned with the
    statistics of a smaller ``jobs``, read all 20,000 jobs of a tenant for
    one answer; tests/integration/test_store_plans.py). Only for
    statements whose every table has the index the probe needs, and where
    ``runs`` is not matched by a partial index whose statistics may be
    stale: the batch statements test ``coalesce(state, '') = 'leased'``,
    which no partial index matches (written ``state = 'leased'``, it
    matched ``runs_inflight_idx``, and forced into nested loops a stale
    estimate of one leased run made each pair scan every leased run; the
    claim's pick and the ready probe do read ``runs_pending_idx``, but as a
    range of one tenant's entries cut by a LIMIT, which no estimate can
    lengthen). CockroachDB (it
    reports ``crdb_version`` at connect) has none of these settings and
    plans such joins as lookup joins: nothing is sent there. ``row_factory``
    and ``binary`` as in :func:`execute`. Raises what :func:`execute` raises."""
    if not conn.info.parameter_status("crdb_version") and conn not in _PROBE_SESSIONS:
        conn.execute(PROBE_JOINS_SQL)
    return execute(conn, name, params, row_factory=row_factory, binary=binary)


PROBE_SESSION_SQL = "; ".join(f"SET {name} = off" for name in PROBE_SETTINGS)
"""What :func:`make_probe_session` sends once on PostgreSQL (:data:`PROBE_SETTINGS` for the whole session)."""

_PROBE_SESSIONS: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def make_probe_session(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn`` (an autocommit connection that runs nothing but
    :func:`execute_probing` statements and plain index probes: a worker's
    claim, ack and heartbeat lanes) a *probe session*: the join settings of
    :func:`execute_probing` are set once for the whole session, and
    :func:`is_probe_session` tells :func:`scheduler.store.run_statement` to
    send each statement alone, in autocommit.

    Why: a claim or a batch of acks is one statement, yet sent as a
    transaction it took four round trips (``BEGIN``, the ``SET LOCAL`` statements,
    the statement, ``COMMIT``); alone, one. On two cores shared by the
    store, the node and four workers, every round trip waits for the other
    process to be scheduled: in the 300,000-run herd the many small claims
    of the first seconds (one per small tenant) were paced by those waits.
    Measured run for run against the build before (docs/performance.md,
    "2026-12-03"): small tenants' dispatch p99 1.94–2.56 s against
    2.37–3.23 s; last ack the same to 2 s shorter. Nothing is sent on CockroachDB
    (no such settings; its implicit transactions are retried by the server).
    Raises ``psycopg.Error`` if the settings cannot be sent."""
    if not conn.autocommit:
        raise ValueError("a probe session must be an autocommit connection")
    if not conn.info.parameter_status("crdb_version"):
        conn.execute(PROBE_SESSION_SQL)
    _PROBE_SESSIONS.add(conn)


def is_probe_session(conn: psycopg.Connection[Any]) -> bool:
    """True if :func:`make_probe_session` was called on ``conn``."""
    return conn in _PROBE_SESSIONS


@contextlib.contextmanager
def stream(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any], size: int
) -> Generator[Iterator[tuple[Any, ...]], None, None]:
    """A context giving the named query's rows as tuples (column order of its SELECT), fetched ``size`` at a time.

    ``with store.stream(conn, name, params, size) as rows: for row in rows: ...``.
    Uses psycopg's streaming (single-row mode, ``size`` rows per network
    chunk): the caller works on the first rows while the store is still
    sending. The iterator is psycopg's own (no wrapper per row) and tuples,
    not dicts: a dict per row costs more than the rest of the per-row work in
    a herd. The connection is busy until the context ends (its cursor is
    closed then). Raises ``psycopg.Error`` on a store error.
    """
    with conn.cursor(row_factory=tuple_row) as cur:
        yield cur.stream(QUERIES[name], params, size=size)


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


class FrozenArray:
    """A list parameter dumped to PostgreSQL's binary array format once, then
    sent as those bytes by every statement that takes it.

    For a parameter that travels unchanged with many statements (a herd's
    plans: up to tens of thousands of entries with each of its ~60 chunks),
    where psycopg would dump the list again each time (~11 ms for 20,000
    keys and 20,000 timestamps). ``element`` is the SQL type of the entries
    (``"int8"``, ``"timestamptz"``, ...; ``None`` entries are NULLs). Bind it
    with a binary placeholder (``%(x)b``). Raises ``KeyError`` for an
    unknown type name.
    """

    __slots__ = ("data", "oid", "size")

    def __init__(self, values: list[Any], element: str) -> None:
        oid = psycopg.adapters.types[element].array_oid
        transformer = psycopg.adapt.Transformer()
        transformer.set_dumper_types([oid], psycopg.pq.Format.BINARY)
        (data,) = transformer.dump_sequence([values], [psycopg.adapt.PyFormat.BINARY])
        assert data is not None  # a list is never NULL
        self.data = bytes(data)
        self.oid = oid
        self.size = len(values)


class _FrozenArrayDumper(psycopg.adapt.Dumper):
    """Sends a :class:`FrozenArray`'s bytes with its array type."""

    format = psycopg.pq.Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return obj.data  # type: ignore[no-any-return]

    def get_key(self, obj: Any, format: psycopg.adapt.PyFormat) -> Any:
        return (FrozenArray, obj.oid)

    def upgrade(self, obj: Any, format: psycopg.adapt.PyFormat) -> psycopg.adapt.Dumper:
        dumper = _FrozenArrayDumper(FrozenArray)
        dumper.oid = obj.oid
        return dumper


psycopg.adapters.register_dumper(FrozenArray, _FrozenArrayDumper)
