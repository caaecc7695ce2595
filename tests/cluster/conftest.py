"""Fixtures of the cluster tests (see ``harness.py``).

``cluster``
    a :class:`harness.Cluster` on a fresh database (``pg_dsn``) with the
    ``conn`` fixture as its store connection; every node process it spawned
    is SIGKILLed at teardown, pass or fail, and the tail of each node's log
    is printed (pytest shows it for a failed test).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from harness import Cluster  # noqa: E402


@pytest.fixture
def cluster(pg_dsn: str, conn: psycopg.Connection, tmp_path: Path) -> Iterator[Cluster]:
    """Node processes of one test on a fresh database; all killed at teardown."""
    group = Cluster(pg_dsn, conn, tmp_path)
    try:
        yield group
    finally:
        group.teardown()

