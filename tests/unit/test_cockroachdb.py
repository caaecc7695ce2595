"""CockroachDB URLs: the SQLAlchemy dialect, and alembic's env.py.

No CockroachDB server runs here: these tests build engines and run alembic
in offline (``--sql``) mode, which picks the dialect from the URL without
connecting. They need the ``cockroachdb`` extra (``sqlalchemy-cockroachdb``),
which ``.ci/run`` installs; without it they fail with the install command.
"""

from __future__ import annotations

import importlib.util
import io

import pytest
from alembic.runtime.migration import MigrationContext

from alembic import command
from scheduler.errors import ConfigError
from scheduler.migrate import alembic_config
from scheduler.store import libpq_dsn, sqlalchemy_dialect, sqlalchemy_engine

CRDB = "cockroachdb://root@crdb-1:26257/scheduler?sslmode=disable"


@pytest.fixture
def cockroach_dialect_installed() -> None:
    if importlib.util.find_spec("sqlalchemy_cockroachdb") is None:
        pytest.fail("sqlalchemy-cockroachdb is not installed: .venv/bin/pip install -e '.[cockroachdb]'", pytrace=False)


@pytest.mark.parametrize(
    "dsn, url",
    [
        ("postgresql://u:p@h:5432/db", "postgresql+psycopg://"),
        ("postgres://u@h/db", "postgresql+psycopg://"),
        ("postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write", "postgresql+psycopg://"),
        ("host=h1,h2 port=5432,5433 dbname=db user=u password='p@ss word'", "postgresql+psycopg://"),
        ("cockroachdb://root@h:26257/db?sslmode=disable", "cockroachdb+psycopg://"),
        ("cockroachdb+psycopg://root@h:26257/db", "cockroachdb+psycopg://"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://"),
    ],
)
def test_sqlalchemy_gets_the_dialect_only(dsn, url):
    """The DSN itself goes to libpq (store.sqlalchemy_engine): the URL holds no host, user or password."""
    assert sqlalchemy_dialect(dsn) == url


def test_a_dsn_libpq_cannot_parse_is_a_bad_setting():
    with pytest.raises(ConfigError, match="dsn: must be a URI") as caught:  # a bad setting: exit status 2
        sqlalchemy_dialect("host=h password=Secret1234 dbname")
    assert "Secret1234" not in str(caught.value)


@pytest.mark.parametrize("dsn", ["cockroachdb://root@h:26257/db", "cockroachdb+psycopg://root@h:26257/db"])
def test_nodes_open_cockroachdb_urls_with_libpq(dsn):
    assert libpq_dsn(dsn) == "postgresql://root@h:26257/db"


@pytest.mark.parametrize("dsn", [CRDB, "cockroachdb+psycopg://root@crdb-1:26257/scheduler"])
def test_engine_uses_the_cockroachdb_dialect_without_connecting(cockroach_dialect_installed, dsn):
    engine = sqlalchemy_engine(dsn)
    assert (engine.dialect.name, engine.dialect.driver) == ("cockroachdb", "psycopg")
    engine.dispose()


def test_alembic_env_picks_the_cockroachdb_dialect(cockroach_dialect_installed, monkeypatch):
    """alembic/env.py with a cockroachdb:// URL: offline upgrade renders every revision with that dialect."""
    seen = []
    original = MigrationContext.run_migrations

    def spy(self, **kwargs):
        seen.append((self.dialect.name, self.dialect.driver))
        return original(self, **kwargs)

    monkeypatch.setattr(MigrationContext, "run_migrations", spy)
    config = alembic_config(CRDB)
    config.output_buffer = io.StringIO()
    command.upgrade(config, "head", sql=True)
    assert seen == [("cockroachdb", "psycopg")]
    script = config.output_buffer.getvalue()
    for table in ("partitions", "nodes", "tenants", "jobs", "runs", "skips"):
        assert f"CREATE TABLE IF NOT EXISTS {table}" in script
    assert "generate_series(0, 1023)" in script  # the data step, apart from DDL
