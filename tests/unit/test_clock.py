"""Injected clocks and the pinned store clock (scheduler/clock.py, sql/queries.sql).

The production clock never pins the store's clock; a ManualClock's pin moves
with its local time. Every named query that takes the pin reads the store's
clock only through ``coalesce(%(now)s::timestamptz, ...)``, so a pinned
instant reaches every comparison and every written timestamp of that query.
"""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from bench.queries import QUERIES as BENCH_QUERIES
from scheduler.clock import ManualClock, SystemClock
from scheduler.store import QUERIES as ENGINE_QUERIES

QUERIES = {**ENGINE_QUERIES, **BENCH_QUERIES}
"""The engine's named queries and the bench's (bench/sql/queries.sql): both are checked."""

AT = datetime(2030, 1, 1, tzinfo=UTC)

STORE_CLOCK = re.compile(
    r"\b(now|statement_timestamp|transaction_timestamp)\s*\(\s*\)"
    r"|\b(current_timestamp|localtimestamp)\b",
    re.I,
)
PINNED = re.compile(r"coalesce\(%\(now\)s::timestamptz, (now|statement_timestamp)\(\)\)")

BARE_CLOCK_ALLOWED = {
    "set_store_meta": "updated_at of a metadata row: a record, compared with nothing",
    "recent_lag": "the demo's live view of the last seconds of real time",
    "count_owned_partitions": "bench measurement against real time",
    "count_orphans_among": "bench measurement against real time",
    "redrive_runs": "an operator's redrive (runs redrive): the run is available from the store's real now",
}
"""Queries that read the store's clock without taking the pin, and why."""


def test_the_system_clock_never_pins_the_store_clock() -> None:
    assert SystemClock().store_now_or_none() is None


def test_a_manual_clock_pins_nothing_unless_asked() -> None:
    clock = ManualClock()
    clock.advance(5.0)
    assert clock.store_now_or_none() is None


def test_a_manual_clocks_store_pin_moves_with_its_local_time() -> None:
    clock = ManualClock(start_s=100.0, store_at=AT)
    assert clock.store_now_or_none() == AT
    clock.advance(2.5)
    assert (clock.monotonic(), clock.store_now_or_none()) == (102.5, AT + timedelta(seconds=2.5))
    clock.wait(threading.Event(), 0.5)
    assert (clock.monotonic(), clock.store_now_or_none()) == (103.0, AT + timedelta(seconds=3))
    clock.pin_store(AT)
    assert (clock.monotonic(), clock.store_now_or_none()) == (103.0, AT)
    clock.pin_store(None)
    clock.advance(1.0)
    assert clock.store_now_or_none() is None


def test_a_naive_store_pin_is_refused() -> None:
    with pytest.raises(ValueError, match="store_at must be an aware datetime"):
        ManualClock(store_at=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="store_at must be an aware datetime"):
        ManualClock().pin_store(datetime(2030, 1, 1))


def test_a_query_taking_the_pin_reads_the_store_clock_only_through_it() -> None:
    pinned = {name: sql for name, sql in QUERIES.items() if PINNED.search(sql)}
    assert {
        "select_due_jobs",
        "herd_heads",
        "fire_runs",
        "fire_group",
        "claim_partitions",
        "claim_partitions_at_epoch",
        "renew_leases",
        "upsert_heartbeat",
        "list_live_nodes",
        "prune_nodes",
        "partition_status",
        "node_status",
        "store_now",
    } <= set(pinned)
    for name, sql in pinned.items():
        rest = PINNED.sub("", sql)
        assert not STORE_CLOCK.search(rest), name
        assert "%(now)s" not in rest, name  # the pin is only ever a fallback's first choice


def test_every_other_query_reading_the_store_clock_is_one_that_need_not_be_pinned() -> None:
    bare = {name for name, sql in QUERIES.items() if not PINNED.search(sql) and STORE_CLOCK.search(sql)}
    assert bare <= set(BARE_CLOCK_ALLOWED)
