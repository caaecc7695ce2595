"""Helpers shared by test modules (the tests directory is on ``sys.path``: ``from helpers import ...``).

One definition each: a helper two test modules need lives here, not in both.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import psycopg

from scheduler import store
from scheduler.clock import Clock, SystemClock
from scheduler.firing import Firer
from scheduler.lease import LeaseTable, SqlCoordinator
from scheduler.metrics import Metrics
from scheduler.settings import Settings

CRON_CASES_PATH = Path(__file__).resolve().parent / "data" / "cron-cases.json"
"""The cron/DST cases from public bug reports (the fields: tests/unit/test_cron_cases.py)."""


def cron_cases() -> list[dict]:
    """The cases of :data:`CRON_CASES_PATH`, in file order."""
    return json.loads(CRON_CASES_PATH.read_text("utf-8"))


def store_now(conn: psycopg.Connection) -> datetime:
    """The store's ``now()`` (aware): on an autocommit connection, the instant of this call."""
    return store.execute(conn, "store_now")[0]["store_now"]


class OneNode:
    """A node's firing half, driven by hand: joined, holding all 1,024 leases.

    ``node_id`` names it in the store (runs, skips); ``clock`` (default the
    system clock) is the lease table's and the firer's, and the leases'
    local deadlines count from its ``monotonic()``; ``overrides`` are
    Settings. ``close()`` closes the firer and the coordinator."""

    def __init__(self, dsn: str, node_id: str = "t1", clock: Clock | None = None, **overrides) -> None:
        self.settings = Settings(dsn=dsn, node_id=node_id, **overrides).validated()
        self.metrics = Metrics()
        self.clock = clock or SystemClock()
        self.table = LeaseTable(self.clock, self.settings.safety_margin_s)
        self.coord = SqlCoordinator(self.settings, self.metrics)
        self.coord.join()
        sent = self.clock.monotonic()
        grants = self.coord.claim(1024)
        assert len(grants) == 1024
        self.table.grant(grants, sent, self.settings.lease_ttl_s)
        self.firer = Firer(self.settings, self.table, self.clock, self.metrics)

    def epoch(self, partition_id: int) -> int:
        return self.table.held()[partition_id].epoch

    def close(self) -> None:
        self.firer.close()
        self.coord.close()
