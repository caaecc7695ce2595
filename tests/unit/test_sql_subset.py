"""The project's SQL stays in the PostgreSQL/CockroachDB common subset (docs/design.md §7).

Scans every named query of ``scheduler/sql/queries.sql`` and of the bench's
``bench/sql/queries.sql``, and every string
constant of ``alembic/versions/*.py`` (the SQL the migrations execute; module
docstrings are prose and left out) for constructs CockroachDB lacks or runs
differently, and the engine's own Python for test-only database cloning.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench.queries import QUERIES as BENCH_QUERIES
from scheduler.store import QUERIES

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = sorted((REPO / "alembic" / "versions").glob("*.py"))

SKIP_LOCKED_ALLOWED = {"claim_partitions", "claim_runs", "claim_push"}
"""Queries allowed FOR UPDATE SKIP LOCKED: only to spread claimers over rows
(the outer WHERE re-checks, so correctness never depends on it)."""

FORBIDDEN = [
    (re.compile(r"\bpg_(try_)?advisory", re.I), "advisory locks (always succeed on CockroachDB)"),
    (re.compile(r"\bLISTEN\b|\bUNLISTEN\b|\bNOTIFY\b|\bpg_notify\b", re.I), "LISTEN/NOTIFY (poll instead)"),
    (re.compile(r"\bclock_timestamp\s*\(", re.I), "clock_timestamp() (use now())"),
    (re.compile(r"\bcluster_logical_timestamp\s*\(", re.I), "cluster_logical_timestamp() (CockroachDB only)"),
    (re.compile(r"^\s*UPSERT\b|;\s*UPSERT\b", re.I | re.M), "UPSERT (use INSERT ... ON CONFLICT (cols))"),
    (re.compile(r"\bON\s+CONFLICT\s+(?!\()", re.I), "ON CONFLICT without named conflict columns"),
    (re.compile(r"\bON\s+CONFLICT\s+ON\s+CONSTRAINT\b", re.I), "ON CONFLICT ON CONSTRAINT"),
    (re.compile(r"\bCREATE\s+DATABASE\b[^;]*\bTEMPLATE\b", re.I), "CREATE DATABASE ... TEMPLATE"),
    (re.compile(r"\bctid\b", re.I), "ctid (no such column on CockroachDB)"),
    (re.compile(r"\bSERIAL\b|\bnextval\s*\(", re.I), "sequences (ids are UUIDs; no reliance on sequence order)"),
]
SKIP_LOCKED = re.compile(r"\bSKIP\s+LOCKED\b", re.I)


def migration_sql(path: Path) -> list[str]:
    """String constants of a migration module, its docstring excluded."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstring = ast.get_docstring(tree, clean=False)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != docstring
    ]


def sources() -> list[tuple[str, str]]:
    out = [(f"queries.sql:{name}", sql) for name, sql in QUERIES.items()]
    out += [(f"bench/sql/queries.sql:{name}", sql) for name, sql in BENCH_QUERIES.items()]
    for path in MIGRATIONS:
        out += [(f"alembic/versions/{path.name}", text) for text in migration_sql(path)]
    return out


def violations(label: str, sql: str) -> list[str]:
    found = [f"{label}: {why}" for pattern, why in FORBIDDEN if pattern.search(sql)]
    name = label.removeprefix("queries.sql:")
    if SKIP_LOCKED.search(sql) and name not in SKIP_LOCKED_ALLOWED:
        found.append(f"{label}: SKIP LOCKED outside {sorted(SKIP_LOCKED_ALLOWED)}")
    return found


def test_scan_covers_the_project_sql():
    labels = [label for label, _ in sources()]
    assert len(QUERIES) >= 30 and "fire_runs" in QUERIES and "prune_runs" in QUERIES
    assert len(MIGRATIONS) >= 10
    assert any(label.startswith("alembic/versions/0008_runs.py") for label in labels)
    assert "bench/sql/queries.sql:herd_stats" in labels and "herd_stats" not in QUERIES


def test_project_sql_is_in_the_common_subset():
    problems = [problem for label, sql in sources() for problem in violations(label, sql)]
    assert problems == []


def test_skip_locked_is_documented_as_spreading_work():
    for name in SKIP_LOCKED_ALLOWED:
        assert SKIP_LOCKED.search(QUERIES[name])
    text = (REPO / "scheduler" / "sql" / "queries.sql").read_text(encoding="utf-8")
    for name in sorted(SKIP_LOCKED_ALLOWED):
        start = text.index(f"-- name: {name}\n")
        header = text[start : text.index("\n\n", start)].split("\nWITH ")[0].split("\nUPDATE ")[0]
        assert "SKIP LOCKED" in header and "spreads" in header, name


@pytest.mark.parametrize(
    "sql, why",
    [
        ("SELECT pg_advisory_xact_lock(1)", "advisory"),
        ("SELECT pg_try_advisory_lock(1)", "advisory"),
        ("LISTEN jobs", "LISTEN"),
        ("NOTIFY jobs, 'x'", "LISTEN"),
        ("SELECT clock_timestamp()", "clock_timestamp"),
        ("SELECT cluster_logical_timestamp()", "cluster_logical_timestamp"),
        ("UPSERT INTO t (a) VALUES (1)", "UPSERT"),
        ("INSERT INTO t (a) VALUES (1) ON CONFLICT DO NOTHING", "named conflict columns"),
        ("INSERT INTO t (a) VALUES (1) ON CONFLICT ON CONSTRAINT t_pkey DO NOTHING", "ON CONSTRAINT"),
        ("CREATE DATABASE x TEMPLATE y", "TEMPLATE"),
        ("DELETE FROM runs WHERE ctid IN (SELECT ctid FROM runs LIMIT 10)", "ctid"),
        ("SELECT 1 FROM jobs FOR UPDATE SKIP LOCKED", "SKIP LOCKED"),
    ],
)
def test_the_scan_catches_each_construct(sql, why):
    found = violations("queries.sql:example", sql)
    assert any(why in problem for problem in found), found


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t (a) VALUES (1) ON CONFLICT (a) DO NOTHING",
        "SELECT now()",
        "SELECT 1 -- mentions nothing forbidden",
    ],
)
def test_the_scan_accepts_the_subset(sql):
    assert violations("queries.sql:example", sql) == []


def test_no_template_cloning_outside_tests():
    """CREATE DATABASE ... TEMPLATE is a test-harness device (scripts/test, tests/fixtures.py)."""
    pattern = FORBIDDEN[7][0]
    offenders = []
    for folder in ("scheduler", "alembic", "bench"):
        for path in (REPO / folder).rglob("*.py"):
            for text in migration_sql(path):
                if pattern.search(text):
                    offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
