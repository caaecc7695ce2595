"""The bench's own named queries (``bench/sql/queries.sql``): measurements the engine never runs.

Loaded with the engine's loader (:func:`scheduler.store.load_queries`) and
run with :func:`scheduler.store.execute`; the engine's queries stay in
``scheduler/sql/queries.sql``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from scheduler import store

QUERIES: dict[str, str] = store.load_queries("bench", "sql/queries.sql")


def execute(conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None = None) -> list[store.Row]:
    """Execute the bench query ``name`` and return its rows (``[]`` if it returns none)."""
    return store.execute(conn, name, params, queries=QUERIES)
