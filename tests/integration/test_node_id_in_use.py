"""A node started with the id of a live node says so (scheduler/coordination/sql.py, join)."""

from __future__ import annotations

from helpers import json_log_records

from scheduler.coordination.sql import SqlCoordinator
from scheduler.metrics import Metrics
from scheduler.settings import Settings


def joined_logging(pg_dsn: str, node_id: str) -> tuple[SqlCoordinator, list[dict]]:
    with json_log_records() as records:
        coord = SqlCoordinator(Settings(dsn=pg_dsn, node_id=node_id).validated(), Metrics())
        coord.join()
    return coord, records


def test_a_second_process_with_a_live_nodes_id_warns_the_first_does_not(pg_dsn) -> None:
    # Trial: the second `scheduler node --node-id n4` logged nothing for 25 s (a silent standby).
    first, first_records = joined_logging(pg_dsn, "n4")
    other, other_records = joined_logging(pg_dsn, "n5")
    second, second_records = joined_logging(pg_dsn, "n4")
    try:
        assert [r["event"] for r in first_records + other_records] == []
        (warning,) = [r for r in second_records if r["event"] == "node_id_in_use"]
        assert (warning["level"], warning["node"]) == ("warning", "n4")
        assert "takes over only what that one lets expire" in warning["why"]
    finally:
        for coord in (first, other, second):
            coord.close()
