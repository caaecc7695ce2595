"""Alembic environment: runs the schema migrations against the configured store.

The URL comes from (first found): the ``sqlalchemy.url`` main option (set by
``scheduler db upgrade``), ``-x dsn=...``, or ``SCHEDULER_DSN``. A libpq DSN
(``postgresql://``, ``postgres://``) is driven through psycopg 3; a
``cockroachdb://`` URL through ``sqlalchemy-cockroachdb``'s psycopg dialect.
Each revision runs in its own transaction (``transaction_per_migration``):
CockroachDB does not like several schema changes in one transaction.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine, pool

from alembic import context
from scheduler.store import sqlalchemy_url

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        url = context.get_x_argument(as_dictionary=True).get("dsn") or os.environ.get("SCHEDULER_DSN")
    if not url:
        raise SystemExit("no store configured: set SCHEDULER_DSN or pass -x dsn=postgresql://...")
    return sqlalchemy_url(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
