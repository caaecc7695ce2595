"""Alembic environment: runs the schema migrations against the configured store.

The DSN comes from (first found): the ``sqlalchemy.url`` main option (set by
``scheduler db upgrade``), ``-x dsn=...``, or ``SCHEDULER_DSN``. It is a libpq
DSN in any form libpq accepts (a URI, keywords, several hosts with
``target_session_attrs``; a SQLAlchemy driver suffix such as
``postgresql+psycopg://`` is dropped): SQLAlchemy gets only the dialect
(``postgresql+psycopg``, or ``cockroachdb+psycopg`` for a ``cockroachdb://``
URL, through ``sqlalchemy-cockroachdb``) and connections libpq opened from
the DSN as written (:func:`scheduler.store.sqlalchemy_engine`).
Each revision runs in its own transaction (``transaction_per_migration``):
CockroachDB does not like several schema changes in one transaction.
"""

from __future__ import annotations

import os

from alembic import context
from scheduler.store import sqlalchemy_dialect, sqlalchemy_engine

config = context.config


def _dsn() -> str:
    dsn = config.get_main_option("sqlalchemy.url")
    if not dsn:
        dsn = context.get_x_argument(as_dictionary=True).get("dsn") or os.environ.get("SCHEDULER_DSN")
    if not dsn:
        raise SystemExit("no store configured: set SCHEDULER_DSN or pass -x dsn=postgresql://...")
    return dsn


def run_migrations_offline() -> None:
    context.configure(url=sqlalchemy_dialect(_dsn()), literal_binds=True, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sqlalchemy_engine(_dsn())
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
