"""Retention without a store: duration parsing and the walk's partition chunks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler import retention
from scheduler.errors import ValidationError
from scheduler.retention import PARTITIONS_PER_STATEMENT, TABLES, PruneWalk, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("7d", 604_800),
        ("12h", 43_200),
        ("30m", 1_800),
        ("45s", 45),
        ("1d12h", 129_600),
        ("3600", 3_600),
        ("0.5", 0.5),
        ("1.5h", 5_400),
        (" 2D ", 172_800),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "0", "-1", "7w", "d", "7 d", "1h-1m", "inf", "nan", "7d junk", "999999999d", "99999999999999999d", "1e300"],
)
def test_parse_duration_refuses(text):
    with pytest.raises(ValidationError, match="older_than"):
        parse_duration(text)


def test_walk_visits_every_partition_once_per_table_in_bounded_chunks(monkeypatch):
    """With nothing to delete, each chunk of each table takes exactly one statement."""
    calls = []

    def fake_execute(conn, name, params):
        calls.append((name, list(params["partition_ids"]), params["after_pid"]))
        return []

    monkeypatch.setattr(retention.store, "run_transaction", lambda conn, body, on_retry=None: body(conn))
    monkeypatch.setattr(retention.store, "execute", fake_execute)
    walk = PruneWalk(range(1024), datetime(2030, 1, 1, tzinfo=UTC), 10)
    while not walk.done:
        walk.step(conn=None)
    chunks = 1024 // PARTITIONS_PER_STATEMENT
    assert [name for name, _, _ in calls] == [query for _, query in TABLES for _ in range(chunks)]
    for _, query in TABLES:
        covered = [pid for name, pids, _ in calls if name == query for pid in pids]
        assert covered == list(range(1024))
    assert all(len(pids) <= PARTITIONS_PER_STATEMENT for _, pids, _ in calls)
    assert all(after is None for _, _, after in calls)
    assert walk.report.batches == len(calls)


def test_a_retention_batch_that_crashes_does_not_end_the_loop(monkeypatch):
    """A bug in one batch is logged and counted; the loop goes on (a dead retention
    thread would silently stop pruning while the node keeps running)."""
    from scheduler.clock import ManualClock
    from scheduler.metrics import Metrics
    from scheduler.settings import Settings

    settings = Settings(dsn="postgresql://unused", node_id="r", retention_s=60.0).validated()
    clock = ManualClock()
    loop = retention.RetentionLoop(settings, lambda: [1, 2], clock, Metrics())
    calls = []

    def boom():
        calls.append(1)
        raise OverflowError("date value out of range")

    monkeypatch.setattr(loop, "_connection", boom)
    assert loop.run_once() == 0
    assert loop.run_once() == 0  # the crashed pass is retried after a pass interval, not at once
    assert len(calls) == 1
    clock.advance(retention.PASS_INTERVAL_S)
    assert loop.run_once() == 0
    assert len(calls) == 2
