"""Schedule identity (scheduler/identity.py): equal specs share a key, different ones never do."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.identity import CANONICAL_VERSION, SPEC_COLUMNS, identity_of
from scheduler.schedule import CronSchedule

STARTS = (
    datetime(2026, 3, 7, 12, tzinfo=UTC),  # the weekend before US DST starts
    datetime(2026, 10, 24, 12, tzinfo=UTC),  # before the EU DST end
    datetime(2028, 2, 27, 0, tzinfo=UTC),  # a leap February
)
ZONES = (
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "US/Eastern",
    "Asia/Kolkata",
    "Asia/Calcutta",
    "Australia/Lord_Howe",
)
"""Zones, with two pairs that are links of each other (US/Eastern, Asia/Calcutta)."""


def cron(expr: str, tz: str = "UTC", dialect: str = "unix", **policy) -> dict:
    row = {
        "kind": "cron",
        "cron_expr": expr,
        "cron_dialect": dialect,
        "tz": tz,
        "interval_s": None,
        "anchor_at": None,
        "fire_at": None,
        "misfire": "all",
        "catchup_window_s": 86_400,
        "misfire_grace_s": 60,
        "jitter_s": 0,
    }
    row.update(policy)
    assert set(row) == set(SPEC_COLUMNS)
    return row


def fires(row: dict, count: int = 30) -> list[datetime]:
    """The next ``count`` fires after each of :data:`STARTS` (DST changes and a leap day inside)."""
    schedule = CronSchedule(row["cron_expr"], row["tz"], row["cron_dialect"])
    out = []
    for start in STARTS:
        t = start
        for _ in range(count):
            t = schedule.next_after(t)
            if t is None:
                break
            out.append(t)
    return out


@pytest.mark.parametrize(
    "spellings",
    [
        ["0 0 * * 0", "0 0 * * 7", "0 0 * * SUN", "0 0 * * sun", "  0  0 * *   0 "],
        ["0 0 * * *", "@daily", "@midnight", "0 0 1-31 * *", "0 0 * 1-12 *", "0 0 * * 0-7", "0 0 ? * *"],
        ["*/15 9-17 * * MON-FRI", "*/15 9-17 * * 1-5", "*/15 9-17 * * 5,4,3,2,1"],
        ["0 12 1 JAN,JUL *", "0 12 1 1,7 *", "0 12 1 7,1 *"],
        ["0 9 * * 5#3", "0 9 * * FRI#3"],
        ["0 0 * * 0L", "0 0 * * 7L"],
    ],
)
def test_spellings_of_one_schedule_share_a_key(spellings: list[str]) -> None:
    keys = {identity_of(cron(expr)).key for expr in spellings}
    assert len(keys) == 1, spellings
    assert len({tuple(fires(cron(expr))) for expr in spellings}) == 1


def test_a_wildcard_minute_and_its_list_differ_by_their_dst_policy() -> None:
    """``*/15`` and ``0/15`` name the same minutes, but only an expression with no
    wildcard in minute and hour is a fixed time of day, which DST treats
    differently (scheduler/cron.py): not one schedule."""
    assert identity_of(cron("*/15 9 * * *")) != identity_of(cron("0/15 9 * * *"))


def test_the_dialect_counts_only_through_the_schedule_it_gives() -> None:
    assert identity_of(cron("30 2 * * *")) == identity_of(cron("0 30 2 * * *", dialect="seconds"))
    # Vixie's OR of the two day fields against Spring's AND: different schedules.
    assert identity_of(cron("0 0 13 * 5")) != identity_of(cron("0 0 0 13 * 5", dialect="seconds"))


def test_links_of_one_zone_keep_their_own_keys() -> None:
    """A tzdata release may split a link from its zone: a key never stands for two."""
    assert fires(cron("0 9 * * *", "US/Eastern")) == fires(cron("0 9 * * *", "America/New_York"))
    assert identity_of(cron("0 9 * * *", "US/Eastern")) != identity_of(cron("0 9 * * *", "America/New_York"))


def test_everything_the_planner_reads_is_in_the_key() -> None:
    base = identity_of(cron("0 0 * * *"))
    for change in (
        {"tz": "Europe/Berlin"},
        {"misfire": "skip"},
        {"misfire": "once"},
        {"catchup_window_s": 3600},
        {"misfire_grace_s": 30},
        {"jitter_s": 5},
    ):
        assert identity_of(cron("0 0 * * *", **change)) != base, change
    anchor = datetime(2030, 1, 1, tzinfo=UTC)
    interval = {**cron("x"), "kind": "interval", "cron_expr": None, "cron_dialect": None, "tz": None}
    a = identity_of({**interval, "interval_s": 60, "anchor_at": anchor})
    assert a == identity_of({**interval, "interval_s": 60, "anchor_at": anchor.astimezone(None)})
    assert a != identity_of({**interval, "interval_s": 60, "anchor_at": anchor + timedelta(seconds=1)})
    assert a != identity_of({**interval, "interval_s": 61, "anchor_at": anchor})
    once = {**interval, "kind": "once", "fire_at": anchor}
    assert identity_of(once) != identity_of({**once, "fire_at": anchor + timedelta(microseconds=1)})
    assert identity_of(once).canonical.startswith(f"{CANONICAL_VERSION};once;")


def test_the_key_is_a_stable_signed_64_bit_hash_of_the_canonical_text() -> None:
    """Stored keys must mean the same in every later release (a changed
    canonical form takes a new version prefix instead)."""
    identity = identity_of(cron("0 0 * * *"))
    assert -(2**63) <= identity.key < 2**63
    assert identity.canonical == (
        "v1;cron;fixed=1;and=1;w=None;fields=0|0|0|1,10,11,12,13,14,15,16,17,18,19,2,20,21,22,23,24,25,26,27,28,"
        "29,3,30,31,4,5,6,7,8,9|1,10,11,12,2,3,4,5,6,7,8,9|0,1,2,3,4,5,6;tz=UTC;misfire=all;catchup=86400;"
        "grace=60;jitter=0"
    )
    assert identity.key == identity_of(cron("@daily")).key


MINUTES = ("0", "5", "*/15", "0-59/15", "0,30", "*", "7-9", "59")
HOURS = ("0", "*/6", "0,12", "9-17", "*", "23", "2")
DAYS = ("*", "1", "15", "L", "1-7", "13", "29", "31", "?")
MONTHS = ("*", "1", "FEB", "*/3", "6-8", "12")
WEEKDAYS = ("*", "0", "7", "SUN", "1-5", "MON-FRI", "5", "6#2", "5L")


@st.composite
def cron_rows(draw) -> dict:
    fields = [draw(st.sampled_from(choices)) for choices in (MINUTES, HOURS, DAYS, MONTHS, WEEKDAYS)]
    if fields[2] == "?" and fields[4] == "?":
        fields[4] = "*"
    policy = draw(
        st.sampled_from([{}, {"misfire": "skip"}, {"misfire_grace_s": 30}, {"jitter_s": 1}, {"catchup_window_s": 60}])
    )
    return cron(" ".join(fields), draw(st.sampled_from(ZONES)), **policy)


def _valid(row: dict) -> bool:
    try:
        identity_of(row)
    except Exception:  # an expression that never fires (e.g. 31 FEB): not a spec
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_rows(), cron_rows())
def test_specs_sharing_a_key_fire_at_the_same_instants_under_the_same_policy(a: dict, b: dict) -> None:
    """The direction that matters: a key never stands for two schedules (two specs
    of one schedule with different keys only share less)."""
    if not (_valid(a) and _valid(b)):
        return
    same_key = identity_of(a).key == identity_of(b).key
    if same_key:
        assert fires(a) == fires(b)
        assert {k: a[k] for k in SPEC_COLUMNS if k not in ("cron_expr",)} == {
            k: b[k] for k in SPEC_COLUMNS if k not in ("cron_expr",)
        }


def test_every_pair_of_the_field_choices_is_told_apart_exactly_when_it_fires_differently() -> None:
    """Exhaustive over one varying field at a time (UTC, default policy)."""
    base = ["0", "0", "*", "*", "*"]
    for position, choices in enumerate((MINUTES, HOURS, DAYS, MONTHS, WEEKDAYS)):
        rows = []
        for choice in choices:
            fields = list(base)
            fields[position] = choice
            row = cron(" ".join(fields))
            if _valid(row):
                rows.append(row)
        for a, b in itertools.combinations(rows, 2):
            if identity_of(a).key == identity_of(b).key:
                assert fires(a) == fires(b), (a["cron_expr"], b["cron_expr"])
