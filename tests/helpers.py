"""Helpers shared by test modules (the tests directory is on ``sys.path``: ``from helpers import ...``)."""

from __future__ import annotations

import time

from scheduler.clock import SystemClock
from scheduler.firing import Firer
from scheduler.lease import LeaseTable, SqlCoordinator
from scheduler.metrics import Metrics
from scheduler.settings import Settings


class OneNode:
    """A node's firing half, driven by hand: joined, holding all 1,024 leases.

    ``node_id`` names it in the store (runs, skips); ``overrides`` are Settings."""

    def __init__(self, dsn: str, node_id: str = "t1", **overrides) -> None:
        self.settings = Settings(dsn=dsn, node_id=node_id, **overrides).validated()
        self.metrics = Metrics()
        self.table = LeaseTable(SystemClock(), self.settings.safety_margin_s)
        self.coord = SqlCoordinator(self.settings, self.metrics)
        self.coord.join()
        sent = time.monotonic()
        grants = self.coord.claim(1024)
        assert len(grants) == 1024
        self.table.grant(grants, sent, self.settings.lease_ttl_s)
        self.firer = Firer(self.settings, self.table, SystemClock(), self.metrics)

    def epoch(self, partition_id: int) -> int:
        return self.table.held()[partition_id].epoch

    def close(self) -> None:
        self.firer.close()
        self.coord.close()
