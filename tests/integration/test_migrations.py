"""Schema migrations (alembic/versions/0001..): apply, round-trip, re-run.

Driven through alembic's Python API with the repo's ``alembic.ini`` and the
DSN as the ``sqlalchemy.url`` option (``alembic/env.py`` hands it to libpq), like ``scheduler db upgrade``.
Schemas are compared as catalog snapshots (columns, constraints, indexes,
partition row count), so "equals head" means "same DDL as the template that
``scripts/test`` migrated".
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command
from scheduler.store import connect, sqlalchemy_engine

REPO = Path(__file__).resolve().parents[2]
VERSIONS = REPO / "alembic" / "versions"
PARTITIONS = 1024
TABLES = {"partitions", "leases", "nodes", "tenants", "jobs", "runs", "skips"}
PARTITIONED_TABLES = ("jobs", "runs", "skips")


def alembic_config(dsn: str) -> Config:
    cfg = Config(str(REPO / "alembic.ini"))
    # ConfigParser interpolates '%': escape it (URL-encoded passwords).
    cfg.set_main_option("sqlalchemy.url", dsn.replace("%", "%%"))
    return cfg


def revisions() -> list[str]:
    """Revision ids, base first."""
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused@localhost/unused"))
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def current_versions(dsn: str) -> list[str]:
    with connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass('public.alembic_version') IS NOT NULL AS e").fetchone()["e"]
        if not exists:
            return []
        return [r["version_num"] for r in conn.execute("SELECT version_num FROM alembic_version")]


def snapshot(dsn: str) -> dict[str, list]:
    """Catalog snapshot of schema ``public`` (alembic_version excluded) + partition rows."""
    with connect(dsn) as conn:
        tables = conn.execute(
            """
            SELECT c.relname, c.relkind, c.relpersistence
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
              AND c.relname <> 'alembic_version'
            ORDER BY 1
            """
        ).fetchall()
        columns = conn.execute(
            """
            SELECT c.relname,
                   -- the column's place among live ones (a dropped and re-added
                   -- column takes a new attnum, but the same place)
                   row_number() OVER (PARTITION BY c.relname ORDER BY a.attnum) AS place,
                   a.attname, format_type(a.atttypid, a.atttypmod) AS type,
                   a.attnotnull, pg_get_expr(d.adbin, d.adrelid) AS default
            FROM pg_attribute a
            JOIN pg_class c ON c.oid = a.attrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND a.attnum > 0
              AND NOT a.attisdropped AND c.relname <> 'alembic_version'
            ORDER BY 1, a.attnum
            """
        ).fetchall()
        constraints = conn.execute(
            """
            SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid) AS def
            FROM pg_constraint k
            JOIN pg_class c ON c.oid = k.conrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relname <> 'alembic_version'
            ORDER BY 1, 2
            """
        ).fetchall()
        indexes = conn.execute(
            """
            SELECT tablename, indexname, indexdef FROM pg_indexes
            WHERE schemaname = 'public' AND tablename <> 'alembic_version'
            ORDER BY 1, 2
            """
        ).fetchall()
        partition_rows = []
        if any(t["relname"] == "partitions" for t in tables):
            partition_rows = conn.execute(
                "SELECT count(*) AS n, count(DISTINCT partition_id) AS distinct_ids, "
                "min(partition_id) AS lo, max(partition_id) AS hi FROM partitions"
            ).fetchall()
    return {
        "tables": tables,
        "columns": columns,
        "constraints": constraints,
        "indexes": indexes,
        "partition_rows": partition_rows,
    }


def primary_key_columns(conn: psycopg.Connection, table: str) -> list[str]:
    rows = conn.execute(
        """
        SELECT a.attname
        FROM pg_index i
        CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = %s::regclass AND i.indisprimary
        ORDER BY k.pos
        """,
        (table,),
    ).fetchall()
    return [r["attname"] for r in rows]


# --- the revision files ---------------------------------------------------------


def test_revisions_form_one_linear_chain() -> None:
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused@localhost/unused"))
    assert len(script.get_heads()) == 1, f"several heads: {script.get_heads()}"
    revs = revisions()
    assert len(revs) >= 9
    assert revs[:9] == [f"{i:04d}" for i in range(1, 10)]
    files = sorted(p.name for p in VERSIONS.glob("[0-9]*.py"))
    assert [name[:4] for name in files] == revs, "each revision NNNN lives in versions/NNNN_*.py"


_CREATE = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?(TABLE|INDEX|SEQUENCE|SCHEMA|EXTENSION|VIEW)\s+(?:CONCURRENTLY\s+)?(?!IF\s+NOT\s+EXISTS)",
    re.IGNORECASE,
)
_ADD_COLUMN = re.compile(r"\bADD\s+COLUMN\s+(?!IF\s+NOT\s+EXISTS)", re.IGNORECASE)
_DROP = re.compile(
    r"\bDROP\s+(TABLE|INDEX|SEQUENCE|SCHEMA|EXTENSION|VIEW|COLUMN)\s+(?:CONCURRENTLY\s+)?(?!IF\s+EXISTS)", re.IGNORECASE
)


@pytest.mark.parametrize("path", sorted(VERSIONS.glob("[0-9]*.py")), ids=lambda p: p.name)
def test_revision_ddl_is_guarded(path: Path) -> None:
    """Every CREATE says IF NOT EXISTS and every DROP says IF EXISTS (re-runnable DDL)."""
    source = path.read_text()
    body = source.split('"""', 2)[-1]  # skip the module docstring
    problems = [m.group(0).strip() for rx in (_CREATE, _ADD_COLUMN, _DROP) for m in rx.finditer(body)]
    for call in re.findall(r"op\.(?:create|drop)_\w+\([^)]*\)", body, re.DOTALL):
        guard = "if_not_exists=True" if ".create_" in call else "if_exists=True"
        if guard not in call:
            problems.append(call)
    assert not problems, f"{path.name}: unguarded DDL: {problems}"


# --- applying them ------------------------------------------------------------------


def test_upgrade_from_empty_applies_every_revision_and_equals_head(empty_pg_dsn: str, pg_dsn: str) -> None:
    cfg = alembic_config(empty_pg_dsn)
    assert current_versions(empty_pg_dsn) == []
    for rev in revisions():
        command.upgrade(cfg, rev)
        assert current_versions(empty_pg_dsn) == [rev]

    with connect(empty_pg_dsn) as conn:
        tables = {r["tablename"] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert TABLES <= tables
        stats = conn.execute(
            "SELECT count(*) AS n, count(DISTINCT partition_id) AS ids, min(partition_id) AS lo,"
            " max(partition_id) AS hi, count(*) FILTER (WHERE owner_epoch = 0 AND owner_node IS NULL)"
            " AS fresh FROM partitions"
        ).fetchone()
        assert stats == {"n": PARTITIONS, "ids": PARTITIONS, "lo": 0, "hi": PARTITIONS - 1, "fresh": PARTITIONS}
        leases = conn.execute(
            "SELECT count(*) AS n, count(*) FILTER (WHERE owner_epoch = 0 AND owner_node IS NULL"
            " AND lease_expires_at IS NULL) AS free FROM leases"
        ).fetchone()
        assert leases == {"n": PARTITIONS, "free": PARTITIONS}
        for table in PARTITIONED_TABLES:
            pk = primary_key_columns(conn, table)
            assert pk and pk[0] == "partition_id", f"{table} primary key {pk} must start with partition_id"

    # The step-by-step upgrade gives exactly the schema scripts/test's template got.
    assert snapshot(empty_pg_dsn) == snapshot(pg_dsn)


def test_template_is_at_head(pg_dsn: str) -> None:
    assert current_versions(pg_dsn) == [revisions()[-1]]


def test_downgrade_to_base_then_upgrade_round_trips(pg_dsn: str) -> None:
    cfg = alembic_config(pg_dsn)
    head = snapshot(pg_dsn)
    command.downgrade(cfg, "base")
    assert current_versions(pg_dsn) == []
    base = snapshot(pg_dsn)
    assert base["tables"] == [] and base["indexes"] == [], f"left behind at base: {base}"
    command.upgrade(cfg, "head")
    assert snapshot(pg_dsn) == head
    assert current_versions(pg_dsn) == [revisions()[-1]]


def test_each_revision_downgrades_and_reapplies(empty_pg_dsn: str) -> None:
    """Stairway: for every revision, up → down one → up again gives the same schema."""
    cfg = alembic_config(empty_pg_dsn)
    previous = snapshot(empty_pg_dsn)
    for rev in revisions():
        command.upgrade(cfg, rev)
        after = snapshot(empty_pg_dsn)
        command.downgrade(cfg, "-1")
        assert snapshot(empty_pg_dsn) == previous, f"downgrade of {rev} did not restore the previous schema"
        command.upgrade(cfg, rev)
        assert snapshot(empty_pg_dsn) == after, f"re-applying {rev} gave a different schema"
        previous = after


def test_upgrade_head_twice_is_a_noop(pg_dsn: str) -> None:
    cfg = alembic_config(pg_dsn)
    before = snapshot(pg_dsn)
    command.upgrade(cfg, "head")
    command.upgrade(cfg, "head")
    assert snapshot(pg_dsn) == before
    assert current_versions(pg_dsn) == [revisions()[-1]]


def test_every_revision_reruns_over_an_existing_schema(pg_dsn: str) -> None:
    """Forget the version (stamp base) and re-run every upgrade over the live schema.

    Each revision's DDL must be IF NOT EXISTS and its data steps idempotent:
    nothing fails, nothing changes, and existing partition leases are kept.
    """
    cfg = alembic_config(pg_dsn)
    with connect(pg_dsn) as conn:
        conn.execute("UPDATE partitions SET owner_node = 'n1', owner_epoch = 7 WHERE partition_id = 3")
        conn.execute(
            "UPDATE leases SET owner_node = 'n1', owner_epoch = 7,"
            " lease_expires_at = '2030-01-01T00:00:00Z' WHERE partition_id = 3"
        )
    before = snapshot(pg_dsn)
    command.stamp(cfg, "base")
    assert current_versions(pg_dsn) == []
    command.upgrade(cfg, "head")
    assert snapshot(pg_dsn) == before
    assert current_versions(pg_dsn) == [revisions()[-1]]
    with connect(pg_dsn) as conn:
        row = conn.execute("SELECT owner_node, owner_epoch FROM partitions WHERE partition_id = 3").fetchone()
        lease = conn.execute(
            "SELECT owner_node, owner_epoch, lease_expires_at::text AS until FROM leases WHERE partition_id = 3"
        ).fetchone()
    assert row == {"owner_node": "n1", "owner_epoch": 7}
    assert lease == {"owner_node": "n1", "owner_epoch": 7, "until": "2030-01-01 00:00:00+00"}


def test_downgrading_past_the_leases_table_hands_leases_back_to_the_partition_rows(pg_dsn: str) -> None:
    """Below 0016 the lease lives in partitions' own columns again: a released
    lease must read free there (not owned with no expiry), a held one held."""
    with connect(pg_dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute("UPDATE partitions SET owner_node = 'n1', owner_epoch = 4 WHERE partition_id IN (1, 2)")
        conn.execute(
            "UPDATE leases SET owner_node = 'n1', owner_epoch = 4,"
            " lease_expires_at = '2030-01-01T00:00:00Z' WHERE partition_id = 1"
        )
        conn.execute("UPDATE leases SET owner_node = NULL, owner_epoch = 4 WHERE partition_id = 2")
    command.downgrade(alembic_config(pg_dsn), "0015")
    with connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT partition_id, owner_node, owner_epoch, lease_expires_at::text AS until"
            " FROM partitions WHERE partition_id IN (1, 2) ORDER BY 1"
        ).fetchall()
        leases = conn.execute("SELECT count(*) AS n FROM leases").fetchone()["n"]
    assert rows == [
        {"partition_id": 1, "owner_node": "n1", "owner_epoch": 4, "until": "2030-01-01 00:00:00+00"},
        {"partition_id": 2, "owner_node": None, "owner_epoch": 4, "until": None},
    ]
    assert leases == 0


def test_the_schedule_key_step_gives_existing_jobs_their_keys_in_batches(pg_dsn: str) -> None:
    """Jobs written before revision 0018 (no key column) get the key of their
    spec at 0019, in batches (4 rows here); a stored spec that no longer
    validates keeps no key (it fires per timer), a deleted job is not touched,
    one schedules row per distinct spec; re-running the step changes nothing."""
    import importlib.util
    import uuid

    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    from scheduler.identity import SPEC_COLUMNS, identity_of
    from scheduler.partition import partition_of

    cfg = alembic_config(pg_dsn)
    command.downgrade(cfg, "0017")
    exprs = ["0 0 * * 0", "0 0 * * 7", "*/5 * * * *", "30 2 * * 1-5", "0 0 31 2 *"]  # the last never fires
    zones = ["Europe/Berlin"] * 20 + ["Mars/Olympus", "EST"]  # two stored zones the engine refuses
    with connect(pg_dsn) as conn:
        conn.execute("INSERT INTO tenants (tenant) VALUES ('acme') ON CONFLICT (tenant) DO NOTHING")
        for i in range(23):
            job_id = uuid.uuid4()
            conn.execute(
                "INSERT INTO jobs (partition_id, job_id, tenant, kind, cron_expr, cron_dialect, tz, deleted_at)"
                " VALUES (%s, %s, 'acme', 'cron', %s, 'unix', %s, %s)",
                (
                    partition_of(job_id),
                    job_id,
                    exprs[i % 5],
                    zones[i] if i < len(zones) else "Europe/Berlin",
                    "2030-01-01T00:00:00Z" if i == 22 else None,
                ),
            )
    command.upgrade(cfg, "0018")
    spec = importlib.util.spec_from_file_location("fill_schedule_keys", VERSIONS / "0019_fill_schedule_keys.py")
    assert spec and spec.loader
    fill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fill)
    fill.BATCH = 4
    engine = sqlalchemy_engine(pg_dsn)
    for _ in range(2):  # the second run finds nothing to do
        with engine.connect() as connection:
            with Operations.context(MigrationContext.configure(connection)):
                fill.upgrade()
    engine.dispose()
    command.stamp(cfg, "0019")
    command.upgrade(cfg, "head")

    with connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT schedule_key, deleted_at, {', '.join(SPEC_COLUMNS)} FROM jobs").fetchall()
        stored = conn.execute("SELECT schedule_key, canonical FROM schedules").fetchall()
    live = [r for r in rows if r["deleted_at"] is None]
    assert len(live) == 22
    for row in live:
        if row["cron_expr"] == "0 0 31 2 *" or row["tz"] in ("Mars/Olympus", "EST"):
            assert row["schedule_key"] is None
        else:
            assert row["schedule_key"] == identity_of(row).key
    assert [r["schedule_key"] for r in rows if r["deleted_at"] is not None] == [None]
    assert {r["schedule_key"]: r["canonical"] for r in stored} == {
        identity_of(r).key: identity_of(r).canonical for r in live if r["schedule_key"] is not None
    }
    assert len(stored) == 3  # 0 0 * * 0 and 0 0 * * 7 are one schedule
