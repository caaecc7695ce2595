"""The documented SQL twin of the partition hash (scheduler/partition.py) on the store."""

from __future__ import annotations

import random
import uuid

from scheduler import partition
from scheduler.partition import partition_of

KNOWN_ZERO_UUID_PARTITION = 469  # pinned in tests/unit/test_partition.py


def documented_sql_expression() -> str:
    """The SQL expression as written in scheduler/partition.py's docstring."""
    doc = partition.__doc__ or ""
    block = doc.split("The same value in SQL", 1)[1].split("Python's", 1)[0]
    lines = [line.strip() for line in block.splitlines()[1:] if line.strip()]
    expression = " ".join(lines)
    assert expression.startswith("get_byte(sha256(uuid_send(job_id)), 6)"), expression
    return expression


def test_sql_expression_from_docstring_matches_python(conn) -> None:
    rng = random.Random(99)
    ids = [uuid.UUID(int=0)] + [uuid.UUID(int=rng.getrandbits(128)) for _ in range(300)]
    expression = documented_sql_expression().replace("%", "%%")  # psycopg placeholder escaping
    rows = conn.execute(
        f"SELECT job_id, {expression} AS pid FROM unnest(%s::uuid[]) AS t (job_id)",  # noqa: S608 (test-only, constant text)
        (ids,),
    ).fetchall()
    assert len(rows) == len(ids)
    got = {row["job_id"]: row["pid"] for row in rows}
    assert got == {job_id: partition_of(job_id) for job_id in ids}
    assert got[uuid.UUID(int=0)] == KNOWN_ZERO_UUID_PARTITION
