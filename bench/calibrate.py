"""The machine's speed at fixed work, timed before a benchmark: figures of two days compare
only once each says how fast the machine was.

Why: on this 2-core VM the same build (f00fba9) fired the 300,000-run herd
among 5 M jobs in 4.9–5.8 s one night and in 10.3 s two days later, with
the store's CPU per run doubled (docs/performance.md, "2026-12-03,
evening"): the machine, not the code. A benchmark's figures therefore come
with three timings of work that never changes (:func:`calibrate`):

- ``python_ms``: a pure-Python loop shaped like the engine's per-run work
  (small tuples and dicts, a sort, string formatting), in this process;
- ``store_scan_ms``: the store hashing 2,000,000 generated integers (one
  backend's CPU, no table);
- ``store_insert_ms``: the store inserting 200,000 rows into a temporary
  table with a primary key (B-tree inserts, as firing and claiming do),
  rolled back.

Each is the best (lowest) of :data:`REPEATS` tries, in milliseconds, so a
moment of other load is filtered out; lower is faster. Taken on a quiet
machine (``bench deliver`` takes them before it loads anything), two
runs' ratio of each timing is the ratio of the machine's speeds; a
benchmark figure that moved with them moved with the machine.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

import psycopg

REPEATS = 3
"""Tries of each timing; the best is kept."""

PYTHON_ITEMS = 100_000
"""Items the Python loop makes, sorts and formats (the cyclic garbage collector off meanwhile:
its passes over the young objects made the timing vary by a quarter)."""

STORE_SCAN_SQL = "SELECT sum(hashint4(g)::int8) FROM generate_series(1, 2000000) AS g"
"""CPU of one store backend on no table."""

STORE_INSERT_SQL = (
    "CREATE TEMPORARY TABLE bench_calibrate (k int8 PRIMARY KEY, v text) ON COMMIT DROP; "
    "INSERT INTO bench_calibrate SELECT g, md5(g::text) FROM generate_series(1, 200000) AS g"
)
"""Heap and B-tree inserts of one store backend, in a transaction rolled back."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The three timings of :func:`calibrate`, milliseconds, best of :data:`REPEATS`."""

    python_ms: float
    store_scan_ms: float
    store_insert_ms: float


def python_work(n: int = PYTHON_ITEMS) -> int:
    """The fixed Python work: ``n`` small tuples and dicts made, sorted and formatted, the cyclic
    garbage collector off; returns a checksum (so nothing is optimized away)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        rows = [(i * 7919 % n, {"job": i, "tenant": f"t{i % 51}"}) for i in range(n)]
        rows.sort(key=lambda row: row[0])
        return sum(len(f"{key}:{row['tenant']}:{row['job']}") for key, row in rows)
    finally:
        if enabled:
            gc.enable()


def best_ms(work: Callable[[], Any], repeats: int = REPEATS) -> float:
    """The lowest wall time of ``repeats`` calls of ``work``, in milliseconds."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best * 1000.0


def _rolled_back(conn: psycopg.Connection[Any], sql: str) -> None:
    with conn.transaction(force_rollback=True):
        conn.execute(sql)


def calibrate(dsn: str, repeats: int = REPEATS) -> Calibration:
    """Time the fixed work on this machine and the store at ``dsn`` (one connection, closed after;
    nothing is left in the store). Raises ``psycopg.Error`` if the store cannot be used."""
    python_ms = best_ms(python_work, repeats)
    with psycopg.connect(dsn) as conn:
        scan_ms = best_ms(lambda: _rolled_back(conn, STORE_SCAN_SQL), repeats)
        insert_ms = best_ms(lambda: _rolled_back(conn, STORE_INSERT_SQL), repeats)
    return Calibration(round(python_ms, 1), round(scan_ms, 1), round(insert_ms, 1))


def describe(c: Calibration) -> str:
    """One line for a benchmark's report."""
    return (
        f"machine (fixed work, best of {REPEATS}, lower is faster): python {c.python_ms:.0f} ms, "
        f"store scan {c.store_scan_ms:.0f} ms, store insert {c.store_insert_ms:.0f} ms"
    )


__all__ = ["Calibration", "best_ms", "calibrate", "describe", "python_work"]
