"""zones.warm: a node computes ahead the transition tables of its schedules' zones."""

from __future__ import annotations

from datetime import UTC, datetime

from scheduler import zones

T = int(datetime(2031, 3, 4, tzinfo=UTC).timestamp())


def test_warm_fills_the_year_tables_a_plan_reads_and_skips_names_that_are_no_zone() -> None:
    zones._year.cache_clear()
    assert zones.warm(["Europe/Berlin", "no/such_zone", "CET", "Australia/Lord_Howe"], T) == 2
    assert zones._year.cache_info().currsize == 4  # two zones, this year and the next
    misses = zones._year.cache_info().misses
    berlin = zones.load_zone("Europe/Berlin")
    assert zones.utc_offset(berlin, T) == 3600
    assert zones.next_transition(berlin, T)[0] == int(datetime(2031, 3, 30, 1, tzinfo=UTC).timestamp())
    assert zones._year.cache_info().misses == misses  # answered from the warmed tables
