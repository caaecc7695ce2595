"""The independent slot oracle (scheduler/oracle.py) against the schedule code and the cases.

The oracle is a second, brute-force implementation of the documented
semantics; where it and :mod:`scheduler.schedule` agree over the 41 public
cases and a hypothesis sample of expressions, zones and windows, a schedule
bug would have to be made twice. The rules that changed in issue 11 (the
``seconds`` dialect's AND day rule, ``?``, ``*/7`` in day-of-week) are
pinned here on the oracle alone, from Spring's and Vixie cron's documented
examples; the sample avoids the expressions they change.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import cron_cases
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler import oracle
from scheduler.errors import ValidationError
from scheduler.schedule import CronSchedule, IntervalSchedule, format_instant, parse_instant

UTC = UTC
CASES = cron_cases()
FIRES = [case for case in CASES if case["expect"] == "fires"]


def schedule_slots(schedule, start: datetime, end: datetime) -> list[datetime]:
    out, slot = [], schedule.next_after(start - timedelta(microseconds=1))
    while slot is not None and slot < end:
        out.append(slot)
        slot = schedule.next_after(slot)
    return out


def test_the_oracle_imports_no_schedule_code() -> None:
    tree = ast.parse((Path(oracle.__file__)).read_text("utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"cronsim", "scheduler.cron", "scheduler.schedule", "scheduler.planner"}, imported


@pytest.mark.parametrize("case", FIRES, ids=[case["id"] for case in FIRES])
def test_the_oracle_gives_each_cases_instants(case: dict) -> None:
    start = parse_instant(case["start"], "start")
    expected = case["expected_next"]
    end = parse_instant(expected[-1], "end") + timedelta(seconds=1)
    got = oracle.cron_slots(case["expr"], "unix", case["tz"], start + timedelta(microseconds=1), end, budget=10**8)
    assert [format_instant(slot) for slot in got] == expected, case["note"]
    assert got == schedule_slots(CronSchedule(case["expr"], case["tz"]), start + timedelta(microseconds=1), end)


ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Antarctica/Troll",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "America/Havana",
    "Europe/London",
]


def _plain(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.integers(1, high - low).map(lambda n: f"*/{n}"),
        st.tuples(value, st.integers(1, high - low)).map(lambda vn: f"{vn[0]}/{vn[1]}"),
        st.lists(value, min_size=2, max_size=4).map(lambda vs: ",".join(map(str, vs))),
    )


@st.composite
def unix_expressions(draw) -> str:
    minute = draw(_plain(0, 59))
    hour = draw(_plain(0, 23))
    dom = draw(st.one_of(_plain(1, 31), st.sampled_from(["L", "LW", "1W", "15W", "31W"])))
    month = draw(st.one_of(st.just("*"), _plain(1, 12)))
    dow = draw(st.one_of(_plain(0, 6), st.sampled_from(["MON-FRI", "MON-SUN", "SAT,SUN", "7", "5L", "1#2", "0#5"])))
    if dom.endswith("W"):
        dow = "*"
    return f"{minute} {hour} {dom} {month} {dow}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    expr=unix_expressions(),
    tz=st.sampled_from(ZONES),
    start=st.datetimes(datetime(2000, 1, 1), datetime(2037, 12, 31), timezones=st.just(UTC)),
    days=st.integers(1, 4),
)
def test_the_oracle_agrees_with_the_schedule_code(expr: str, tz: str, start: datetime, days: int) -> None:
    try:
        schedule = CronSchedule(expr, tz)
    except ValidationError:
        assume(False)
    end = start + timedelta(days=days)
    assert oracle.cron_slots(expr, "unix", tz, start, end) == schedule_slots(schedule, start, end)


@settings(max_examples=40, deadline=None)
@given(
    second=_plain(0, 59),
    rest=unix_expressions(),
    tz=st.sampled_from(ZONES),
    start=st.datetimes(datetime(2000, 1, 1), datetime(2037, 12, 31), timezones=st.just(UTC)),
)
def test_the_oracle_agrees_in_the_seconds_dialect(second: str, rest: str, tz: str, start: datetime) -> None:
    minute, hour, dom, month, dow = rest.split()
    # Both day fields restricted: the rule changes to AND (below), so keep one of them '*'.
    assume(dom.startswith("*") or dow.startswith("*"))
    expr = f"{second} {minute} {hour} {dom} {month} {dow}"
    try:
        schedule = CronSchedule(expr, tz, "seconds")
    except ValidationError:
        assume(False)
    end = start + timedelta(hours=6)
    assert oracle.cron_slots(expr, "seconds", tz, start, end) == schedule_slots(schedule, start, end)


def at(text: str) -> datetime:
    return parse_instant(text, "at")


def test_seconds_dialect_combines_the_day_fields_with_and() -> None:
    """Spring's documented rule: '0 0 0 13 * FRI' is every Friday the 13th."""
    got = oracle.cron_slots("0 0 0 13 * FRI", "seconds", "UTC", at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
    assert [format_instant(slot) for slot in got] == [
        "2026-02-13T00:00:00Z",
        "2026-03-13T00:00:00Z",
        "2026-11-13T00:00:00Z",
    ]
    # The unix dialect keeps the OR rule: the 13ths and the Fridays.
    unix = oracle.cron_slots("0 0 13 * FRI", "unix", "UTC", at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z"))
    assert [slot.day for slot in unix] == [6, 13, 20, 27]


def test_question_mark_is_a_star_in_either_day_field() -> None:
    start, end = at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z")
    for dialect, expr, same in (
        ("seconds", "0 15 10 ? * MON-FRI", "0 15 10 * * MON-FRI"),
        ("seconds", "0 0 12 1 * ?", "0 0 12 1 * *"),
        ("unix", "0 12 ? * 1", "0 12 * * 1"),
    ):
        got = oracle.cron_slots(expr, dialect, "UTC", start, end)
        assert got and got == oracle.cron_slots(same, dialect, "UTC", start, end)


def test_a_step_of_seven_in_day_of_week_is_sunday_as_in_vixie_cron() -> None:
    got = oracle.cron_slots("0 0 * * */7", "unix", "UTC", at("2026-03-01T00:00:00Z"), at("2026-03-31T00:00:00Z"))
    assert [slot.day for slot in got] == [1, 8, 15, 22, 29]  # the Sundays of March 2026
    assert oracle.parse("0 0 * * */2").dow == (("in", frozenset({0, 2, 4, 6})),)


def test_interval_and_once_slots() -> None:
    anchor = at("2030-01-01T00:00:07Z")
    start, end = at("2030-01-01T00:10:00Z"), at("2030-01-01T01:00:00Z")
    got = oracle.slots("interval", None, None, None, 300, anchor, None, start, end)
    assert got == schedule_slots(IntervalSchedule(300, anchor), start, end)
    assert [format_instant(slot) for slot in got[:2]] == ["2030-01-01T00:10:07Z", "2030-01-01T00:15:07Z"]
    assert oracle.slots("once", None, None, None, None, None, anchor, anchor, end) == [anchor]
    assert oracle.slots("once", None, None, None, None, None, anchor, start, end) == []


def test_the_oracle_refuses_more_work_than_its_budget() -> None:
    with pytest.raises(oracle.OracleError, match="more than the budget of 100000"):
        oracle.cron_slots(
            "* * * * * *", "seconds", "UTC", at("2030-01-01T00:00:00Z"), at("2030-01-02T00:00:00Z"), budget=100_000
        )
    with pytest.raises(oracle.OracleError, match="cannot read"):
        oracle.parse("0 0 * * FOO")
