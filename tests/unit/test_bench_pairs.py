"""The bench's herd pairs (bench/pairs.py): K distinct (expression, zone) pairs due at one
instant, skewed popularity, deterministic for a seed; and the bench's own herd kept as it was."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

import pytest

from bench import pairs
from bench.load import cron_spec
from scheduler import oracle
from scheduler.identity import identity_of
from scheduler.schedule import CronSchedule
from scheduler.zones import load_zone

T = datetime(2026, 12, 1, 17, 23, tzinfo=UTC)
"""A Tuesday; minute 23 (not a multiple of 5: the bench's own herd has 26 pairs)."""

FALL_BACK = datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
"""01:30 EST in New York, the second 01:30 of that night (EDT ended at 06:00Z)."""


@pytest.fixture(scope="module")
def pairs_at_t() -> list[tuple[str, str]]:
    return pairs.distinct_pairs(T, 400)


def fires_only_at(expr: str, zone: str, t: datetime) -> bool:
    """The independent oracle's slots of the minute around ``t`` are exactly ``[t]``."""
    return oracle.cron_slots(expr, "unix", zone, t - timedelta(seconds=59), t + timedelta(seconds=60)) == [t]


def test_k_pairs_with_k_distinct_schedule_keys(pairs_at_t):
    assert len(pairs_at_t) == 400
    keys = {identity_of(cron_spec(expr, zone)).key for expr, zone in pairs_at_t}
    assert len(keys) == 400


def test_every_pair_fires_at_t(pairs_at_t):
    assert [p for p in pairs_at_t if not fires_only_at(*p, T)] == []


def test_pairs_span_every_zone_and_many_expressions():
    got = pairs.distinct_pairs(T, 5_000)
    assert {zone for _, zone in got} == set(pairs.usable_zones())
    assert len({expr for expr, _ in got}) > 1_000


def test_pairs_hold_the_families_of_a_real_service(pairs_at_t):
    # A few families of a real service, each in the generated herd (UTC: 17:23 on Tuesday 1 December).
    for expr in ("23 17 * * *", "23 * * * *", "23 17 * * 1-5", "23 17 1 * *", "23 17 * * 2", "23 5,17 * * *"):
        assert (expr, "UTC") in pairs_at_t


def test_most_common_pairs_first(pairs_at_t):
    assert pairs_at_t[0] == ("23 17 * * *", "UTC")
    # Rank score 2 (zone rank × variant rank): UTC hourly and New York daily, in seeded order.
    assert set(pairs_at_t[1:3]) == {("23 * * * *", "UTC"), ("23 12 * * *", "America/New_York")}


def test_deterministic_for_a_seed():
    assert pairs.distinct_pairs(T, 300, seed=5) == pairs.distinct_pairs(T, 300, seed=5)
    assert pairs.distinct_pairs(T, 300, seed=5) != pairs.distinct_pairs(T, 300, seed=6)
    counts = pairs.popularity(300, 3_000)
    assert pairs.assign(counts, seed=5) == pairs.assign(counts, seed=5)
    assert pairs.assign(counts, seed=5) != pairs.assign(counts, seed=6)


def test_a_wall_time_repeated_by_dst_is_left_out():
    # In New York 01:30 happens twice that night; a fixed-time expression fires at
    # the first (05:30Z) only, so `30 1 * * *` there is no pair of a herd at 06:30Z.
    assert not fires_only_at("30 1 * * *", "America/New_York", FALL_BACK)
    got = pairs.distinct_pairs(FALL_BACK, 400)
    assert len(got) == 400
    assert ("30 1 * * *", "America/New_York") not in got
    assert ("30 * * * *", "America/New_York") in got  # a wildcard hour fires at both
    assert [p for p in got if not fires_only_at(*p, FALL_BACK)] == []


def test_popularity_exact_small_case():
    # 95 timers beyond one each, shared 1 : 1/2 : 1/3 : 1/4 : 1/5, rounded down
    # (41, 20, 13, 10, 8), the 3 left over to the first three.
    assert pairs.popularity(5, 100) == [43, 22, 15, 11, 9]


def test_popularity_is_skewed_and_covers_every_pair():
    counts = pairs.popularity(5_000, 300_000)
    assert sum(counts) == 300_000
    assert min(counts) >= 1
    assert counts == sorted(counts, reverse=True)
    assert counts[0] > 1_000 * statistics.median(counts)
    assert (counts[0], statistics.median(counts), counts[-1]) == (32_439, 14, 7)


def test_assign_gives_each_pair_its_count():
    counts = pairs.popularity(50, 1_000)
    order = pairs.assign(counts)
    assert len(order) == 1_000
    assert [order.count(r) for r in range(50)] == counts


def test_bench_own_herd_is_kept_for_none_and_26():
    own = pairs.herd_expressions(T)
    assert len(own) == 26
    for k in (None, pairs.BENCH_HERD_K):
        got, pair_of = pairs.herd_plan(T, 100, k)
        assert got == own
        assert pair_of == [i % 26 for i in range(100)]


def test_other_k_uses_the_generator_and_popularity():
    got, pair_of = pairs.herd_plan(T, 1_000, 40)
    assert got == pairs.distinct_pairs(T, 40)
    assert pair_of == pairs.assign(pairs.popularity(40, 1_000))


@pytest.mark.parametrize("k", [None, 40])
def test_a_herd_on_a_whole_second_prefixes_that_second(k):
    """The tests' herds: due at T + 37 s, the minute's pairs with 37 as the seconds field."""
    t = T + timedelta(seconds=37)
    got, pair_of = pairs.herd_plan(t, 1_000, k, on_second=True)
    minute, minute_of = pairs.herd_plan(T, 1_000, k)
    assert got == [(f"37 {expr}", zone) for expr, zone in minute]
    assert pair_of == minute_of
    for expr, zone in got:
        schedule = CronSchedule(expr, zone, "seconds")
        assert schedule.next_after(T) == t
        assert schedule.next_after(t) > t + timedelta(seconds=59)


def test_usable_zones_are_the_ones_the_engine_accepts():
    zones = pairs.usable_zones()
    legacy = {"EST", "MST", "HST", "EST5EDT", "CST6CDT", "MST7MDT", "PST8PDT", "CET", "MET", "EET", "WET", "Factory"}
    assert not set(zones) & legacy
    assert {"UTC", "Etc/UTC", "Europe/Berlin", "US/Pacific", "Asia/Kathmandu"} <= set(zones)
    for zone in zones:
        load_zone(zone)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        pairs.distinct_pairs(T, 0)
    with pytest.raises(ValueError, match="need 1 to 5"):
        pairs.popularity(10, 5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["herd", "--jobs", "1000", "--distinct-schedules", "26,5000"], "5000: each K must be at most --jobs (1,000)"),
        (["herd", "--distinct-schedules", "40001"], "40001: each K must be at most --jobs (300,000) and 40,000"),
        (["herd", "--distinct-schedules", "0"], "'0': each count must be >= 1"),
        (["herd", "--distinct-schedules", "26,,500"], "'26,,500': a comma-separated list of whole numbers"),
        (["herd", "--distinct-schedules", "\u0666"], "a comma-separated list of whole numbers in ASCII digits"),
        (["herd", "--jobs", "\u0666"], "a whole number in ASCII digits"),
        (["herd", "--jobs", "99999999999999999999999"], "not in the range 1<=x<=50000000"),
        (["herd", "--max-rate", "nan"], "'nan': a finite number"),
        (["herd", "--max-rate", "inf"], "'inf': a finite number"),
        (["steady", "--rate", "1e3"], "a whole number in ASCII digits"),
        (["compare", "--herd-jobs", "100", "--distinct-schedules", "200"], "200: each K must be at most --herd-jobs"),
    ],
)
def test_the_cli_refuses_bad_counts_and_rates_before_touching_the_store(args, message):
    from click.testing import CliRunner

    from bench.__main__ import cli

    # An address nothing listens on: refused before any connection is tried.
    result = CliRunner().invoke(cli, [args[0], "--dsn", "postgresql://nobody@127.0.0.1:9/none", *args[1:]])
    assert result.exit_code == 2
    assert message in result.output
