"""The 40001/40P01 retry of a whole transaction (docs/design.md §7).

CockroachDB (and PostgreSQL at SERIALIZABLE) ask clients to retry a whole
transaction on SQLSTATE 40001 (serialization failure) and 40P01 (deadlock).
:func:`run_transaction` does so with bounded, jittered exponential backoff;
the decision is made on the SQLSTATE class, never on message text.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from scheduler import log
from scheduler.errors import StoreError
from scheduler.store.dsn import first_line
from scheduler.store.queries import is_probe_session

T = TypeVar("T")

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
"""Serialization failure and deadlock: retry the whole transaction."""

MAX_ATTEMPTS = 6
"""Attempts per transaction before :class:`StoreError` is raised."""

BACKOFF_BASE_S = 0.01
BACKOFF_MAX_S = 0.5


def is_retryable(exc: BaseException) -> bool:
    """True if ``exc`` is a store error whose SQLSTATE asks for a transaction retry."""
    return isinstance(exc, psycopg.Error) and getattr(exc, "sqlstate", None) in RETRYABLE_SQLSTATES


def run_transaction(
    conn: psycopg.Connection[Any],
    body: Callable[[psycopg.Connection], T],
    *,
    max_attempts: int = MAX_ATTEMPTS,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``body(conn)`` in one transaction, retrying it whole on 40001/40P01.

    ``body`` must be safe to run again (it is re-executed from the start).
    Backoff between attempts: full jitter over ``min(BACKOFF_MAX_S,
    BACKOFF_BASE_S × 2^attempt)`` seconds. ``on_retry(sqlstate)`` is called
    before each retry (for metrics). Raises :class:`StoreError` (from the
    last error) when attempts run out; non-retryable ``psycopg.Error``\\ s
    propagate unchanged.
    """
    return _retrying(conn, body, max_attempts, on_retry, sleep, in_transaction=True)


def _retrying(
    conn: psycopg.Connection[Any],
    body: Callable[[psycopg.Connection], T],
    max_attempts: int,
    on_retry: Callable[[str], None] | None,
    sleep: Callable[[float], None],
    *,
    in_transaction: bool,
) -> T:
    for attempt in range(max_attempts):
        try:
            if not in_transaction:
                return body(conn)
            with conn.transaction():
                return body(conn)
        except psycopg.Error as exc:
            if not is_retryable(exc) or conn.closed:
                raise
            if attempt == max_attempts - 1:
                what = "transaction" if in_transaction else "statement"
                message = f"{what} failed after {max_attempts} attempts: {first_line(exc)}"
                raise StoreError(message, exc.sqlstate) from exc
            if on_retry is not None:
                on_retry(exc.sqlstate or "")
            log.event("transaction_retry", logging.DEBUG, sqlstate=exc.sqlstate, attempt=attempt + 1)
            sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt)))
    raise AssertionError("unreachable")


def run_statement(
    conn: psycopg.Connection[Any],
    body: Callable[[psycopg.Connection], T],
    *,
    max_attempts: int = MAX_ATTEMPTS,
) -> T:
    """Run ``body(conn)``, ONE statement, atomically, retried as :func:`run_transaction`
    retries: on a probe session (:func:`scheduler.store.make_probe_session`) the
    statement is sent alone, in autocommit (one round trip; it is its own
    transaction); on any other connection inside ``BEGIN`` … ``COMMIT``
    (:func:`run_transaction`). ``body`` must send exactly one statement (more
    would commit one by one on a probe session) and be safe to run again.
    Raises as :func:`run_transaction`."""
    return _retrying(conn, body, max_attempts, None, time.sleep, in_transaction=not is_probe_session(conn))
