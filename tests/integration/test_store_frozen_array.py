"""store.FrozenArray: a list parameter dumped once and sent as the same bytes by many statements."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from scheduler.store import FrozenArray


def test_a_frozen_array_reads_back_as_the_list_it_was_made_of_every_time(conn: psycopg.Connection) -> None:
    keys = [2**63 - 1, -(2**63), 0, 42]
    nexts = [datetime(2030, 1, 1, tzinfo=UTC), None, datetime(2031, 1, 1, tzinfo=UTC), None]
    frozen_keys, frozen_nexts = FrozenArray(keys, "int8"), FrozenArray(nexts, "timestamptz")
    for _ in range(7):  # past psycopg's prepare threshold too
        row = conn.execute(
            "SELECT %(k)b::int8[] AS k, %(n)b::timestamptz[] AS n", {"k": frozen_keys, "n": frozen_nexts}
        ).fetchone()
        assert (row["k"], row["n"]) == (keys, nexts)
    # Small numbers stay int8, and a list of NULLs keeps its element type.
    row = conn.execute(
        "SELECT %(k)b AS k, pg_typeof(%(k)b)::text AS kt, %(n)b AS n, pg_typeof(%(n)b)::text AS nt",
        {"k": FrozenArray([1, 2], "int8"), "n": FrozenArray([None, None], "timestamptz")},
    ).fetchone()
    assert row == {"k": [1, 2], "kt": "bigint[]", "n": [None, None], "nt": "timestamp with time zone[]"}
    assert FrozenArray([], "int8").size == 0
    with pytest.raises(KeyError):
        FrozenArray([1], "no such type")
