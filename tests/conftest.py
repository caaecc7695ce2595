"""Suite-wide pytest set-up.

Run the suite with ``scripts/test [pytest args]``: it starts a throwaway
PostgreSQL cluster, migrates the template database once and exports the
``SCHEDULER_TEST_PG_*`` variables the fixtures read. The PostgreSQL fixtures
(``pg_server``, ``pg_dsn``, ``conn``, ``pg_dsn_factory``, ``empty_pg_dsn``)
live in ``tests/fixtures.py``; see its docstring. A test that requests one
without the cluster FAILS with a message naming ``scripts/test`` (nothing is
skipped silently); tests that request none (``tests/unit``) need no database.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The etcd tests use gRPC (aetcd) in this process, and the cluster tests then fork it to start
# node processes (subprocess with a preexec_fn). gRPC's fork handlers, run in the child while
# other threads were inside gRPC, aborted the child ("epoll_wait error: Bad file descriptor",
# status -6: a CI failure). The child only execs: it needs no gRPC, so no fork handlers. Set
# before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Import the fixtures module by path whatever pytest's import mode is.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from fixtures import (  # noqa: E402,F401  (re-exported: pytest finds fixtures here)
    PgServer,
    conn,
    empty_pg_dsn,
    pg_dsn,
    pg_dsn_factory,
    pg_server,
    relay,
)


@pytest.fixture(autouse=True)
def _isolated_log_secrets() -> Iterator[None]:
    """Secrets a test registers (every CLI call with a DSN registers its password,
    e.g. compose's ``scheduler``) are forgotten after it: otherwise later tests'
    messages are scrubbed of words that were only another test's password."""
    from scheduler import log

    with log._secrets_lock:
        saved = set(log._secrets)
    yield
    with log._secrets_lock:
        log._secrets.clear()
        log._secrets.update(saved)
