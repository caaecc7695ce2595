"""Cron parsing, zones, the DST policy, interval and one-shot schedules.

The DST oracle in the property tests is independent of the code under test:
it walks every UTC minute of a window with ``zoneinfo`` (``fold`` tells the
second pass of a repeated hour) and detects transitions minute by minute,
then applies docs/design.md §3 literally.
"""

from __future__ import annotations

import calendar
import itertools
import shutil
import zoneinfo
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from cronsim import CronSim
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler.cron import CronExpression, nearest_weekday
from scheduler.errors import ValidationError
from scheduler.schedule import (
    CronSchedule,
    IntervalSchedule,
    OnceSchedule,
    format_instant,
    iter_fires,
    parse_instant,
)
from scheduler.zones import (
    load_zone,
    next_transition,
    previous_transition,
    utc_offset,
)

UTC = UTC
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WALL_EPOCH = datetime(1970, 1, 1)


def at(text: str) -> datetime:
    return parse_instant(text, "t")


def fires(expr: str, tz: str, start: str, count: int, dialect: str = "unix") -> list[str]:
    schedule = CronSchedule(expr, tz, dialect)
    return [format_instant(f) for f in itertools.islice(_iterate(schedule, at(start)), count)]


def _iterate(schedule, instant):
    while (instant := schedule.next_after(instant)) is not None:
        yield instant


def epoch_s(dt: datetime) -> int:
    return int((dt - EPOCH).total_seconds())


# --------------------------------------------------------------------------
# Validation: every rule, with the field named in the message


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("60 * * * *", "value 60 is out of range for the minute field (0-59)"),
        ("* 24 * * *", "value 24 is out of range for the hour field (0-23)"),
        ("* * 32 * *", "out of range for the day-of-month field (1-31)"),
        ("* * 0 * *", "out of range for the day-of-month field"),
        ("* * * 13 *", "out of range for the month field (1-12)"),
        ("* * * 0 *", "out of range for the month field"),
        ("* * * * 8", "out of range for the day-of-week field (0-7)"),
        ("* * * FOO *", "'FOO' is not a valid value in the month field"),
        ("* * * * FUNDAY", "'FUNDAY' is not a valid value in the day-of-week field"),
        ("H/15 * * * *", "'H' is not a valid value in the minute field"),
        ("${schedule} * * * *", "minute field"),
        ("-5 * * * *", "missing value in the minute field"),
        ("5-10-15 * * * *", "not a valid range in the minute field"),
        ("1,,2 * * * *", "empty item in the minute field"),
        ("*/0 * * * *", "step 0 in the minute field"),
        ("5-5/0 * * * *", "step 0 in the minute field"),
        ("*/60 * * * *", "step 60 is larger than the minute field allows (at most 59)"),
        ("*/90 * * * *", "step 90 is larger than the minute field allows (at most 59)"),
        ("0 */24 * * *", "step 24 is larger than the hour field allows (at most 23)"),
        ("0 0 */31 * *", "step 31 is larger than the day-of-month field allows (at most 30)"),
        ("0 0 1 */12 *", "step 12 is larger than the month field allows (at most 11)"),
        ("0 0 * * */8", "step 8 is larger than the day-of-week field allows (at most 7)"),
        ("*/x * * * *", "step 'x' in the minute field must be a whole number"),
        ("0 0 * * FRI-MON", "range FRI-MON in the day-of-week field is reversed"),
        ("0 0 * * 5-1", "range 5-1 in the day-of-week field is reversed"),
        ("0 0 * * 1-0", "range 1-0 in the day-of-week field is reversed"),
        ("0 0 30-2 * *", "range 30-2 in the day-of-month field is reversed"),
        ("0 22-2 * * *", "range 22-2 in the hour field is reversed"),
        ("0 0 * NOV-FEB *", "range NOV-FEB in the month field is reversed"),
        (
            "? 0 * * *",
            "'?' (no specific value, = *) is only allowed as a whole day-of-month or day-of-week "
            "field, not in the minute field",
        ),
        ("0 0 * ? *", "not in the month field"),
        ("0 0 ?,1 * *", "'?' (no specific value, = *) is only allowed as a whole day-of-month or day-of-week field"),
        ("0 0 * * ?/2", "only allowed as a whole day-of-month or day-of-week field"),
        ("0 0 * * MON-?", "only allowed as a whole day-of-month or day-of-week field"),
        ("0 0 L-3 * *", "'L-3' (n days before the last day of the month) is not supported; L, LW and NW are"),
        ("0 0 15W,20 * *", "W (nearest weekday) must be the only term of the day-of-month field"),
        ("0 0 15W * MON", "needs day-of-week *"),
        ("0 0 15W/2 * *", "a step cannot follow '15W' in the day-of-month field"),
        ("0 0 L/2 * *", "a step cannot follow 'L' in the day-of-month field"),
        ("0 15W * * *", "W (nearest weekday) is only allowed in the day-of-month field"),
        ("0 0 * 5L *", "L is only allowed in the day-of-month field"),
        ("0 0 * * L", "'L' alone is not allowed in the day-of-week field"),
        ("0 0 * * 1#6", "the n in day#n must be 1-5 in the day-of-week field"),
        ("0 0 * * 1#0", "the n in day#n must be 1-5"),
        ("0 0 1#2 * *", "'#' (nth weekday) is only allowed in the day-of-week field"),
        ("0 0 * * 1-5#2", "day-of-week field"),
        ("0 0 31 2 *", "never fires: day-of-month 31 does not occur in February"),
        ("0 0 30 2 *", "never fires: day-of-month 30 does not occur in February"),
        ("0 0 31 4,6,9,11 *", "never fires: day-of-month 31 does not occur in April, June, September, November"),
        ("0 0 30W 2 *", "never fires: no day 30 in February"),
        ("0 0 */8 * 1#5", "never fires"),  # days 1,9,17,25 are never a 5th weekday
        ("0 0 */10 2 FRI#5", "never fires"),  # the 5th Friday of February is the 29th
        ("* * * *", "expected 5 fields for dialect 'unix', got 4"),
        ("0 * * * * *", "6 fields given, but the unix dialect takes 5"),
        ("0 0 12 * * ? 2024", "7 fields (Quartz with a year) are not supported"),
        ("0 0 12 1 * MON 2024", "7 fields (Quartz with a year) are not supported"),
        ("@reboot", "@reboot is not a timer"),
        ("@every 5m", "unknown macro"),
        ("", "cron expression is empty"),
        ("   ", "cron expression is empty"),
        ("0 " * 300, "too long"),
    ],
)
def test_invalid_unix_expressions_are_rejected_naming_the_rule(expr: str, words: str) -> None:
    with pytest.raises(ValidationError) as raised:
        CronExpression.parse(expr)
    error = raised.value
    assert error.field == "cron"
    assert words in error.rule
    assert error.value == expr
    assert str(error).startswith("cron: ")


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("60 * * * * *", "value 60 is out of range for the second field (0-59)"),
        ("*/60 * * * * *", "step 60 is larger than the second field allows (at most 59)"),
        ("0 0 12 * * MON 2024", "7 fields"),
        ("0 0 12 * * ? 2024", "7 fields (Quartz with a year) are not supported"),
        ("0 0 0 L-3 * *", "'L-3' (n days before the last day of the month) is not supported"),
        ("? 0 0 * * *", "not in the second field"),
        ("0 0 ? * * *", "not in the hour field"),
        ("0 0 0 * * */8", "step 8 is larger than the day-of-week field allows (at most 7)"),
        ("0 0 0 31 2 FRI", "never fires: day-of-month 31 does not occur in February"),  # AND in this dialect
        ("0 12 * * *", "5 fields given, but the seconds dialect takes 6"),
        ("0 0 0 31 2 *", "never fires"),
    ],
)
def test_invalid_seconds_expressions_are_rejected(expr: str, words: str) -> None:
    with pytest.raises(ValidationError) as raised:
        CronExpression.parse(expr, "seconds")
    assert raised.value.field == "cron"
    assert words in raised.value.rule


@pytest.mark.parametrize("dialect", ["quartz", "", "UNIX", None, 5])
def test_unknown_dialect_is_rejected(dialect: object) -> None:
    with pytest.raises(ValidationError) as raised:
        CronExpression.parse("0 0 * * *", dialect)  # type: ignore[arg-type]
    assert raised.value.field == "dialect"


@pytest.mark.parametrize("expr", [None, 5, ["0", "0", "*", "*", "*"]])
def test_non_string_expression_is_rejected(expr: object) -> None:
    with pytest.raises(ValidationError) as raised:
        CronExpression.parse(expr)  # type: ignore[arg-type]
    assert raised.value.field == "cron"


def test_validation_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        CronExpression.parse("*/60 * * * *")


# --------------------------------------------------------------------------
# Accepted forms


@pytest.mark.parametrize(
    ("macro", "expanded"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros_expand(macro: str, expanded: str) -> None:
    assert CronExpression.parse(macro) == CronExpression.parse(expanded)
    assert CronExpression.parse(macro, "seconds") == CronExpression.parse("0 " + expanded, "seconds")


def test_macro_fires() -> None:
    assert fires("@weekly", "UTC", "2024-01-01T00:00:00Z", 2) == ["2024-01-07T00:00:00Z", "2024-01-14T00:00:00Z"]
    assert fires("@hourly", "UTC", "2024-01-01T00:00:00Z", 2) == ["2024-01-01T01:00:00Z", "2024-01-01T02:00:00Z"]


def test_names_are_case_insensitive_and_equal_to_numbers() -> None:
    assert CronExpression.parse("0 0 * jan-Mar mon,FRI") == CronExpression.parse("0 0 * 1-3 1,5")
    assert CronExpression.parse("0 0 * JUL *").normalized == "0 0 0 * 7 *"


def test_expression_keeps_its_text() -> None:
    expression = CronExpression.parse("0 9 * * MON-FRI")
    assert str(expression) == "0 9 * * MON-FRI"
    assert expression.text == "0 9 * * MON-FRI"
    assert expression.dialect == "unix"
    assert CronExpression.parse("0 9 * * MON-FRI") is expression  # cached


@pytest.mark.parametrize("dow", ["MON-SUN", "1-SUN", "1-7", "0-7", "*"])
def test_mon_sun_means_every_day(dow: str) -> None:
    # 2024-01-01 is a Monday.
    got = fires(f"0 0 * * {dow}", "UTC", "2024-01-01T00:00:00Z", 7)
    assert got == [f"2024-01-{d:02d}T00:00:00Z" for d in range(2, 9)]


def test_ranges_through_sunday() -> None:
    assert fires("0 0 * * SAT-SUN", "UTC", "2024-01-01T00:00:00Z", 3) == [
        "2024-01-06T00:00:00Z",
        "2024-01-07T00:00:00Z",
        "2024-01-13T00:00:00Z",
    ]
    assert fires("0 0 * * MON-SUN/2", "UTC", "2024-01-01T00:00:00Z", 4) == [
        "2024-01-03T00:00:00Z",  # Wed
        "2024-01-05T00:00:00Z",  # Fri
        "2024-01-07T00:00:00Z",  # Sun (7)
        "2024-01-08T00:00:00Z",  # Mon
    ]
    assert CronExpression.parse("0 0 * * SUN-SUN").normalized == "0 0 0 * * 0-0"


@pytest.mark.parametrize("sunday", ["0", "7", "SUN"])
def test_sunday_is_0_and_7(sunday: str) -> None:
    assert fires(f"0 0 * * {sunday}", "UTC", "2024-01-01T00:00:00Z", 2) == [
        "2024-01-07T00:00:00Z",
        "2024-01-14T00:00:00Z",
    ]


@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        ("*/59 * * * *", "2024-01-01T00:00:00Z", ["00:59", "01:00", "01:59"]),
        ("0 */23 * * *", "2024-01-01T00:00:00Z", ["23:00", "00:00", "23:00"]),
        ("59/15 * * * *", "2024-01-01T00:00:00Z", ["00:59", "01:59", "02:59"]),
        ("0-10/5 * * * *", "2024-01-01T00:00:00Z", ["00:05", "00:10", "01:00"]),
        ("45/5 * * * *", "2024-01-01T00:00:00Z", ["00:45", "00:50", "00:55"]),
    ],
)
def test_steps(expr: str, start: str, expected: list[str]) -> None:
    got = [f[11:16] for f in fires(expr, "UTC", start, len(expected))]
    assert got == expected


def test_largest_steps_of_day_fields() -> None:
    assert fires("0 0 */30 * *", "UTC", "2024-01-01T00:00:00Z", 3) == [
        "2024-01-31T00:00:00Z",
        "2024-02-01T00:00:00Z",
        "2024-03-01T00:00:00Z",
    ]
    assert fires("0 0 1 */11 *", "UTC", "2024-01-01T00:00:00Z", 2) == [
        "2024-12-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
    ]
    assert fires("0 0 * * */6", "UTC", "2024-01-01T00:00:00Z", 2) == [
        "2024-01-06T00:00:00Z",  # Saturday
        "2024-01-07T00:00:00Z",  # Sunday
    ]


def test_day_rule_and_when_a_day_field_starts_with_star() -> None:
    # OR: the 1st, plus every Monday.  2024-01-01 is a Monday.
    assert fires("0 0 1 * MON", "UTC", "2024-01-01T00:00:00Z", 3) == [
        "2024-01-08T00:00:00Z",
        "2024-01-15T00:00:00Z",
        "2024-01-22T00:00:00Z",
    ]
    assert fires("0 0 1 * MON", "UTC", "2024-01-29T00:00:00Z", 2) == [
        "2024-02-01T00:00:00Z",
        "2024-02-05T00:00:00Z",
    ]
    # AND: '*/1' starts with '*', so a day must match both fields: Mondays only.
    assert fires("0 0 */1 * MON", "UTC", "2024-01-29T00:00:00Z", 2) == [
        "2024-02-05T00:00:00Z",
        "2024-02-12T00:00:00Z",
    ]


def test_last_day_forms() -> None:
    assert fires("0 0 LW * *", "UTC", "2024-03-01T00:00:00Z", 2) == [
        "2024-03-29T00:00:00Z",  # 31st is Sunday
        "2024-04-30T00:00:00Z",
    ]
    assert fires("0 0 * * 5L", "UTC", "2024-01-01T00:00:00Z", 2) == [
        "2024-01-26T00:00:00Z",
        "2024-02-23T00:00:00Z",
    ]
    assert fires("0 0 * * FRIL", "UTC", "2024-01-01T00:00:00Z", 1) == ["2024-01-26T00:00:00Z"]
    assert fires("0 0 * * MON#1", "UTC", "2024-01-02T00:00:00Z", 1) == ["2024-02-05T00:00:00Z"]


@pytest.mark.timeout(60)  # a hang guard (C44 hung other libraries), not a speed assertion
def test_c44_is_found_and_far_matches_beyond_cronsims_50_years() -> None:
    assert fires("0 0 * 2 MON#5", "UTC", "2024-03-01T00:00:00Z", 3) == [
        "2044-02-29T00:00:00Z",
        "2072-02-29T00:00:00Z",
        "2112-02-29T00:00:00Z",
    ]
    # From 2113 the next Monday Feb 29 is 2140; and from 2045 in a DST zone.
    assert fires("0 0 * 2 MON#5", "UTC", "2113-01-01T00:00:00Z", 1) == ["2140-02-29T00:00:00Z"]
    assert fires("0 0 * 2 MON#5", "Europe/Berlin", "2045-01-01T00:00:00Z", 1) == ["2072-02-28T23:00:00Z"]


# ---- W (nearest weekday)


@pytest.mark.parametrize(
    ("year", "month", "day", "expected"),
    [
        (2024, 6, 15, 14),  # Saturday -> Friday 14th
        (2024, 9, 15, 16),  # Sunday -> Monday 16th
        (2024, 6, 1, 3),  # Saturday the 1st -> Monday 3rd (never the previous month)
        (2024, 3, 31, 29),  # Sunday the last day -> Friday 29th (never the next month)
        (2024, 8, 31, 30),  # Saturday -> Friday 30th
        (2024, 4, 31, None),  # April has 30 days: no fire
        (2023, 2, 29, None),
        (2024, 2, 29, 29),  # Thursday
        (2024, 5, 15, 15),  # Wednesday
    ],
)
def test_nearest_weekday(year: int, month: int, day: int, expected: int | None) -> None:
    assert nearest_weekday(year, month, day) == expected


def test_w_fires_on_the_nearest_weekday() -> None:
    assert fires("0 0 15W * *", "UTC", "2024-05-20T00:00:00Z", 4) == [
        "2024-06-14T00:00:00Z",
        "2024-07-15T00:00:00Z",
        "2024-08-15T00:00:00Z",
        "2024-09-16T00:00:00Z",
    ]
    assert fires("0 0 1W * *", "UTC", "2024-05-20T00:00:00Z", 2) == ["2024-06-03T00:00:00Z", "2024-07-01T00:00:00Z"]
    # 31W skips the 30-day months and never crosses into the next month.
    assert fires("0 0 31W * *", "UTC", "2024-01-20T00:00:00Z", 5) == [
        "2024-01-31T00:00:00Z",
        "2024-03-29T00:00:00Z",
        "2024-05-31T00:00:00Z",
        "2024-07-31T00:00:00Z",
        "2024-08-30T00:00:00Z",
    ]


@given(day=st.integers(1, 31), start=st.dates(date(2000, 1, 1), date(2090, 1, 1)))
@settings(max_examples=40, deadline=None)
def test_w_matches_a_brute_force_oracle(day: int, start: date) -> None:
    schedule = CronSchedule(f"0 0 {day}W * *", "UTC")
    instant = datetime.combine(start, datetime.min.time(), UTC)
    got = list(itertools.islice(_iterate(schedule, instant), 6))
    expected = []
    year, month = start.year, start.month
    while len(expected) < 6:
        length = calendar.monthrange(year, month)[1]
        if day <= length:
            # the weekday closest to `day` within the month (earlier wins a tie)
            weekdays = [d for d in range(1, length + 1) if date(year, month, d).weekday() < 5]
            best = min(weekdays, key=lambda d: (abs(d - day), d))
            candidate = datetime(year, month, best, tzinfo=UTC)
            if candidate > instant:
                expected.append(candidate)
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    assert got == expected


# ---- fixed-time vs wildcard


@pytest.mark.parametrize(
    ("expr", "dialect", "fixed"),
    [
        ("30 2 * * *", "unix", True),
        ("0 1-23/2 * * *", "unix", True),
        ("0,30 9-17 * * 1-5", "unix", True),
        ("0 */2 * * *", "unix", False),
        ("* 2 * * *", "unix", False),
        ("*/15 * * * *", "unix", False),
        ("0 * * * *", "unix", False),
        ("@hourly", "unix", False),
        ("@daily", "unix", True),
        ("*/10 30 2 * * *", "seconds", True),  # the seconds field does not count
        ("0 * 2 * * *", "seconds", False),
        ("0 30 */3 * * *", "seconds", False),
    ],
)
def test_is_fixed_time(expr: str, dialect: str, fixed: bool) -> None:
    assert CronExpression.parse(expr, dialect).is_fixed_time is fixed


def test_seconds_dialect_fires_on_seconds() -> None:
    assert fires("*/20 * * * * *", "UTC", "2024-01-01T00:00:00Z", 4, "seconds") == [
        "2024-01-01T00:00:20Z",
        "2024-01-01T00:00:40Z",
        "2024-01-01T00:01:00Z",
        "2024-01-01T00:01:20Z",
    ]
    assert fires("30 15 10 * * 7", "UTC", "2024-01-01T00:00:00Z", 1, "seconds") == ["2024-01-07T10:15:30Z"]


# ---- Dialect details: Spring's day rule, '?', '*/7' in day-of-week (issue 11, item 9)
#
# The examples are the ones Spring's CronExpression javadoc documents, with
# the fires worked out by hand from a calendar (2024-01-01 is a Monday).

JAN_1_2024 = "2024-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("expr", "count", "expected"),
    [
        # "the top of every hour of every day"
        ("0 0 * * * *", 3, ["2024-01-01T01:00:00Z", "2024-01-01T02:00:00Z", "2024-01-01T03:00:00Z"]),
        # "every ten seconds"
        ("*/10 * * * * *", 3, ["2024-01-01T00:00:10Z", "2024-01-01T00:00:20Z", "2024-01-01T00:00:30Z"]),
        # "8, 9 and 10 o'clock of every day"
        (
            "0 0 8-10 * * *",
            4,
            ["2024-01-01T08:00:00Z", "2024-01-01T09:00:00Z", "2024-01-01T10:00:00Z", "2024-01-02T08:00:00Z"],
        ),
        # "6:00 AM and 7:00 PM every day"
        ("0 0 6,19 * * *", 3, ["2024-01-01T06:00:00Z", "2024-01-01T19:00:00Z", "2024-01-02T06:00:00Z"]),
        # "8:00, 8:30, 9:00, 9:30, 10:00 and 10:30 every day"
        (
            "0 0/30 8-10 * * *",
            7,
            [
                "2024-01-01T08:00:00Z",
                "2024-01-01T08:30:00Z",
                "2024-01-01T09:00:00Z",
                "2024-01-01T09:30:00Z",
                "2024-01-01T10:00:00Z",
                "2024-01-01T10:30:00Z",
                "2024-01-02T08:00:00Z",
            ],
        ),
        # "every Christmas Day at midnight"
        ("0 0 0 25 12 ?", 2, ["2024-12-25T00:00:00Z", "2025-12-25T00:00:00Z"]),
        # "last day of the month at midnight"
        ("0 0 0 L * *", 3, ["2024-01-31T00:00:00Z", "2024-02-29T00:00:00Z", "2024-03-31T00:00:00Z"]),
        # "first weekday of the month at midnight" (2024-06-01 is a Saturday)
        ("0 0 0 1W 6 *", 1, ["2024-06-03T00:00:00Z"]),
        ("0 0 0 1W * *", 2, ["2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"]),
        # "last weekday of the month at midnight" (2024-03-31 is a Sunday)
        ("0 0 0 LW * *", 3, ["2024-01-31T00:00:00Z", "2024-02-29T00:00:00Z", "2024-03-29T00:00:00Z"]),
        # "last Friday of the month at midnight"
        ("0 0 0 * * 5L", 3, ["2024-01-26T00:00:00Z", "2024-02-23T00:00:00Z", "2024-03-29T00:00:00Z"]),
        # "last Thursday of the month at midnight"
        ("0 0 0 * * THUL", 2, ["2024-01-25T00:00:00Z", "2024-02-29T00:00:00Z"]),
        # "the second Friday in the month at midnight"
        ("0 0 0 ? * 5#2", 3, ["2024-01-12T00:00:00Z", "2024-02-09T00:00:00Z", "2024-03-08T00:00:00Z"]),
        # "the first Monday in the month at midnight" (not 2024-01-01 itself: strictly after)
        ("0 0 0 ? * MON#1", 3, ["2024-02-05T00:00:00Z", "2024-03-04T00:00:00Z", "2024-04-01T00:00:00Z"]),
    ],
)
def test_spring_javadoc_examples(expr: str, count: int, expected: list[str]) -> None:
    assert fires(expr, "UTC", JAN_1_2024, count, "seconds") == expected


def test_spring_nine_to_five_weekdays() -> None:
    # "on the hour nine-to-five weekdays", from Friday 2024-01-05 16:30
    assert fires("0 0 9-17 * * MON-FRI", "UTC", "2024-01-05T16:30:00Z", 3, "seconds") == [
        "2024-01-05T17:00:00Z",
        "2024-01-08T09:00:00Z",
        "2024-01-08T10:00:00Z",
    ]


def test_seconds_dialect_day_fields_combine_with_and_as_in_spring() -> None:
    # Spring: a day matches both day fields, whatever they start with.
    # Friday the 13th: 2024-09-13, 2024-12-13, 2025-06-13.
    assert fires("0 0 0 13 * FRI", "UTC", JAN_1_2024, 3, "seconds") == [
        "2024-09-13T00:00:00Z",
        "2024-12-13T00:00:00Z",
        "2025-06-13T00:00:00Z",
    ]
    # The Spring idiom for "the first Monday of the month".
    assert fires("0 0 0 1-7 * MON", "UTC", JAN_1_2024, 3, "seconds") == [
        "2024-02-05T00:00:00Z",
        "2024-03-04T00:00:00Z",
        "2024-04-01T00:00:00Z",
    ]
    # The 1st when it is a Monday (2024-01-01 itself is not after the start).
    assert fires("0 0 0 1 * MON", "UTC", JAN_1_2024, 2, "seconds") == ["2024-04-01T00:00:00Z", "2024-07-01T00:00:00Z"]
    # The last day of the month when it is also the last Friday.
    assert fires("0 0 0 L * 5L", "UTC", JAN_1_2024, 2, "seconds") == ["2024-05-31T00:00:00Z", "2025-01-31T00:00:00Z"]
    assert CronExpression.parse("0 0 0 13 * FRI", "seconds").day_and is True


def test_unix_dialect_keeps_the_vixie_or_rule() -> None:
    # The same day fields in the unix dialect: the 13th, or any Friday.
    assert fires("0 0 13 * FRI", "UTC", JAN_1_2024, 4) == [
        "2024-01-05T00:00:00Z",
        "2024-01-12T00:00:00Z",
        "2024-01-13T00:00:00Z",
        "2024-01-19T00:00:00Z",
    ]
    assert CronExpression.parse("0 0 13 * FRI").day_and is False
    assert CronExpression.parse("0 0 */1 * FRI").day_and is True
    # Same normalised fields, different day rule: not the same schedule.
    unix, seconds = CronExpression.parse("0 0 13 * 5"), CronExpression.parse("0 0 0 13 * 5", "seconds")
    assert unix.normalized == seconds.normalized == "0 0 0 13 * 5"
    assert unix != seconds
    # With a '*' day field both dialects read AND, and agree.
    assert CronExpression.parse("0 0 13 * *") == CronExpression.parse("0 0 0 13 * *", "seconds")


@pytest.mark.parametrize("dialect", ["unix", "seconds"])
def test_question_mark_is_star_in_a_day_field(dialect: str) -> None:
    second = "0 " if dialect == "seconds" else ""
    for with_q, with_star in [
        ("15 2 * * ?", "15 2 * * *"),
        ("0 9 ? * MON-FRI", "0 9 * * MON-FRI"),
        ("0 0 1 * ?", "0 0 1 * *"),
        ("0 0 ? * ?", "0 0 * * *"),
        ("0 0 ? 3 5#2", "0 0 * 3 5#2"),
    ]:
        parsed = CronExpression.parse(second + with_q, dialect)
        assert parsed == CronExpression.parse(second + with_star, dialect)
        assert parsed.day_and is True


def test_question_mark_counts_as_star_for_the_unix_day_rule() -> None:
    # robfig/croniter style: '?' leaves day-of-month blank, so only the weekday decides.
    assert fires("0 9 ? * MON-FRI", "UTC", "2024-01-05T12:00:00Z", 2) == [
        "2024-01-08T09:00:00Z",
        "2024-01-09T09:00:00Z",
    ]
    # '?' in day-of-week: the 1st of each month only (not OR-ed with every day).
    assert fires("0 0 1 * ?", "UTC", JAN_1_2024, 2) == ["2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"]


def test_question_mark_does_not_change_the_dst_policy() -> None:
    # Still a fixed-time job (minute and hour decide): the gap slot fires at the jump (C02).
    assert CronExpression.parse("30 2 ? * *").is_fixed_time is True
    assert fires("30 2 ? * *", "America/New_York", "2021-03-13T12:00:00-05:00", 2) == [
        "2021-03-14T07:00:00Z",
        "2021-03-15T06:30:00Z",
    ]


@pytest.mark.parametrize("dialect", ["unix", "seconds"])
def test_step_7_in_day_of_week_is_sunday_as_in_vixie_cron(dialect: str) -> None:
    # Vixie: '*' in day-of-week is 0-7, so '*/7' is {0, 7}, both Sunday.
    second = "0 " if dialect == "seconds" else ""
    assert fires(second + "0 0 * * */7", "UTC", JAN_1_2024, 2, dialect) == [
        "2024-01-07T00:00:00Z",
        "2024-01-14T00:00:00Z",
    ]
    assert fires(second + "0 0 * * 0-7/7", "UTC", JAN_1_2024, 1, dialect) == ["2024-01-07T00:00:00Z"]
    assert fires(second + "0 0 * * 1-7/7", "UTC", JAN_1_2024, 1, dialect) == ["2024-01-08T00:00:00Z"]  # {1}
    # '*/2' counts from Sunday: Sunday, Tuesday, Thursday, Saturday.
    assert fires(second + "0 0 * * */2", "UTC", JAN_1_2024, 4, dialect) == [
        "2024-01-02T00:00:00Z",
        "2024-01-04T00:00:00Z",
        "2024-01-06T00:00:00Z",
        "2024-01-07T00:00:00Z",
    ]


def test_step_7_in_day_of_week_starts_with_star_for_the_unix_day_rule() -> None:
    # Vixie sets DOW_STAR for any field starting with '*': the 13th when it is a Sunday.
    assert fires("0 0 13 * */7", "UTC", JAN_1_2024, 2) == ["2024-10-13T00:00:00Z", "2025-04-13T00:00:00Z"]


# --------------------------------------------------------------------------
# Zones


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("EST", "America/New_York (with DST) or Etc/GMT+5"),
        ("MST", "America/Denver"),
        ("HST", "Pacific/Honolulu"),
        ("EST5EDT", "America/New_York"),
        ("CST6CDT", "America/Chicago"),
        ("MST7MDT", "America/Denver"),
        ("PST8PDT", "America/Los_Angeles"),
        ("CET", "Europe/Berlin"),
        ("EET", "Europe/Athens"),
        ("MET", "Europe/Berlin"),
        ("WET", "Europe/Lisbon"),
        ("PST", "America/Los_Angeles"),
        ("pst", "America/Los_Angeles"),
        ("CEST", "Europe/Berlin"),
        ("IST", "Asia/Kolkata"),
        ("est", "America/New_York"),  # wrong case of a legacy zone gets the legacy hint
        ("europe/berlin", "use Europe/Berlin"),
        ("US/PACIFIC", "use US/Pacific"),
    ],
)
def test_abbreviations_and_legacy_zones_are_rejected_with_a_hint(name: str, hint: str) -> None:
    with pytest.raises(ValidationError) as raised:
        load_zone(name)
    assert raised.value.field == "tz"
    assert hint in raised.value.rule
    assert raised.value.value == name


@pytest.mark.parametrize(
    "name", ["", " ", "Mars/Olympus_Mons", "../../etc/passwd", "Europe/", "/UTC", None, 3, "localtime"]
)
def test_non_zones_are_rejected(name: object) -> None:
    with pytest.raises(ValidationError) as raised:
        load_zone(name)  # type: ignore[arg-type]
    assert raised.value.field == "tz"


@pytest.mark.parametrize(
    "name", ["UTC", "Etc/UTC", "US/Pacific", "Asia/Singapore", "Europe/Berlin", "Etc/GMT+5", "Australia/Lord_Howe"]
)
def test_iana_names_and_links_load(name: str) -> None:
    zone = load_zone(name)
    assert isinstance(zone, zoneinfo.ZoneInfo)
    assert zone.key == name
    assert load_zone(name) is zone  # cached


def test_link_behaves_like_its_target() -> None:
    pacific, los_angeles = load_zone("US/Pacific"), load_zone("America/Los_Angeles")
    for s in range(1_700_000_000, 1_760_000_000, 86_400 * 7):
        assert utc_offset(pacific, s) == utc_offset(los_angeles, s)
    assert fires("0 2 * * *", "US/Pacific", "2025-03-08T12:00:00-08:00", 1) == ["2025-03-09T10:00:00Z"]


def test_singapore_fires() -> None:
    assert fires("0 9 * * *", "Asia/Singapore", "2024-01-01T00:00:00+08:00", 2) == [
        "2024-01-01T01:00:00Z",
        "2024-01-02T01:00:00Z",
    ]


def test_zones_load_from_bundled_tzdata_not_the_host(tmp_path: Path) -> None:
    # A host tz database where Asia/Kathmandu (+05:45) is really UTC: zoneinfo
    # would use it, our loader must not.
    import tzdata

    fake = tmp_path / "Asia"
    fake.mkdir()
    shutil.copy(Path(tzdata.__file__).parent / "zoneinfo" / "UTC", fake / "Kathmandu")
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    try:
        zoneinfo.ZoneInfo.clear_cache()
        assert zoneinfo.ZoneInfo("Asia/Kathmandu").utcoffset(datetime(2024, 1, 1)) == timedelta(0)
        zone = load_zone("Asia/Kathmandu")
        assert zone.utcoffset(datetime(2024, 1, 1)) == timedelta(hours=5, minutes=45)
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()


def test_next_transition_known_values() -> None:
    new_york = load_zone("America/New_York")
    start = epoch_s(at("2024-01-01T00:00:00Z"))
    spring = next_transition(new_york, start)
    assert spring == (epoch_s(at("2024-03-10T07:00:00Z")), -5 * 3600, -4 * 3600)
    fall = next_transition(new_york, spring[0])
    assert fall == (epoch_s(at("2024-11-03T06:00:00Z")), -4 * 3600, -5 * 3600)
    assert next_transition(new_york, spring[0] - 1) == spring  # strictly after
    assert previous_transition(new_york, spring[0]) == spring  # at or before
    assert previous_transition(new_york, spring[0] - 1)[0] == epoch_s(at("2023-11-05T06:00:00Z"))
    lord_howe = load_zone("Australia/Lord_Howe")
    assert next_transition(lord_howe, epoch_s(at("2026-01-01T00:00:00Z"))) == (
        epoch_s(at("2026-04-04T15:00:00Z")),
        11 * 3600,
        10 * 3600 + 1800,
    )
    troll = load_zone("Antarctica/Troll")
    assert next_transition(troll, epoch_s(at("2026-01-01T00:00:00Z"))) == (
        epoch_s(at("2026-03-29T01:00:00Z")),
        0,
        2 * 3600,
    )


def test_next_transition_horizon_and_continuation() -> None:
    utc = load_zone("UTC")
    assert next_transition(utc, 0) is None
    assert previous_transition(utc, 0) is None
    new_york = load_zone("America/New_York")
    start = epoch_s(at("2024-01-01T00:00:00Z"))
    assert next_transition(new_york, start, horizon_s=86_400) is None
    # continue window by window: the first hit is the March transition
    t, found = start, None
    while found is None:
        found = next_transition(new_york, t, horizon_s=86_400 * 7)
        t += 86_400 * 7
    assert found[0] == epoch_s(at("2024-03-10T07:00:00Z"))
    # Sao Paulo abolished DST in 2019: nothing for years.
    sao_paulo = load_zone("America/Sao_Paulo")
    assert next_transition(sao_paulo, epoch_s(at("2020-01-01T00:00:00Z"))) is None


@given(
    instant=st.integers(epoch_s(at("1950-01-01T00:00:00Z")), epoch_s(at("2060-01-01T00:00:00Z"))),
    name=st.sampled_from(
        [
            "America/New_York",
            "Europe/Berlin",
            "Australia/Lord_Howe",
            "Antarctica/Troll",
            "Pacific/Apia",
            "America/Sao_Paulo",
            "Asia/Tehran",
            "Pacific/Chatham",
        ]
    ),
)
@settings(max_examples=150, deadline=None)
def test_sampled_offsets_agree_with_zoneinfo(instant: int, name: str) -> None:
    zone = load_zone(name)
    expected = datetime.fromtimestamp(instant, zone).utcoffset()
    assert utc_offset(zone, instant) == int(expected.total_seconds())
    nxt = next_transition(zone, instant)
    if nxt is not None:
        x, before, after = nxt
        assert x > instant
        assert datetime.fromtimestamp(x - 1, zone).utcoffset().total_seconds() == before
        assert datetime.fromtimestamp(x, zone).utcoffset().total_seconds() == after
        assert before != after


# --------------------------------------------------------------------------
# DST policy, beyond the shared cases


def test_spring_forward_slots_collapse_into_one_fire() -> None:
    assert fires("0,30 2 * * *", "America/New_York", "2021-03-13T12:00:00-05:00", 3) == [
        "2021-03-14T07:00:00Z",
        "2021-03-15T06:00:00Z",
        "2021-03-15T06:30:00Z",
    ]
    # 02:00 (gap) and 03:00 (first wall after it) are one instant: one fire.
    assert fires("0 2,3 * * *", "America/New_York", "2021-03-13T12:00:00-05:00", 3) == [
        "2021-03-14T07:00:00Z",
        "2021-03-15T06:00:00Z",
        "2021-03-15T07:00:00Z",
    ]


def test_wildcard_job_has_nothing_for_gap_times() -> None:
    assert fires("*/30 2 * * *", "America/New_York", "2021-03-14T00:00:00-05:00", 2) == [
        "2021-03-15T06:00:00Z",
        "2021-03-15T06:30:00Z",
    ]


def test_fall_back_wildcard_fires_in_both_passes_and_fixed_once() -> None:
    assert fires("*/30 1 * * *", "America/New_York", "2021-11-07T00:00:00-04:00", 4) == [
        "2021-11-07T05:00:00Z",
        "2021-11-07T05:30:00Z",
        "2021-11-07T06:00:00Z",
        "2021-11-07T06:30:00Z",
    ]
    assert fires("0,30 1 * * *", "America/New_York", "2021-11-07T00:00:00-04:00", 3) == [
        "2021-11-07T05:00:00Z",
        "2021-11-07T05:30:00Z",
        "2021-11-08T06:00:00Z",
    ]
    # Asked from inside the second pass: the repeated walls are not re-run.
    assert fires("45 1 * * *", "America/New_York", "2021-11-07T01:15:00-05:00", 1) == ["2021-11-08T06:45:00Z"]


def test_skipped_calendar_day_fires_at_the_jump() -> None:
    # Samoa skipped 2011-12-30 (-10 -> +14 at local midnight).
    assert fires("0 12 * * *", "Pacific/Apia", "2011-12-28T00:00:00Z", 4) == [
        "2011-12-28T22:00:00Z",
        "2011-12-29T22:00:00Z",
        "2011-12-30T10:00:00Z",  # Dec 30 12:00 never existed: at the jump
        "2011-12-30T22:00:00Z",  # Dec 31 12:00 +14
    ]


def test_seconds_dialect_gap_fires_at_the_transition() -> None:
    assert fires("15 30 2 * * *", "America/New_York", "2021-03-13T12:00:00-05:00", 2, "seconds") == [
        "2021-03-14T07:00:00Z",
        "2021-03-15T06:30:15Z",
    ]


def test_wildcard_seconds_job_at_the_last_second_before_a_gap() -> None:
    # 01:59:59 EST exists, 02:59:59 does not (wildcard: nothing), 03:59:59 EDT does.
    assert fires("59 59 * * * *", "America/New_York", "2021-03-14T01:30:00-05:00", 2, "seconds") == [
        "2021-03-14T06:59:59Z",
        "2021-03-14T07:59:59Z",
    ]


def test_sub_second_instants() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    assert schedule.next_after(at("2024-01-01T00:00:59.999999Z")) == at("2024-01-01T00:01:00Z")
    assert schedule.next_after(at("2024-01-01T00:01:00.000001Z")) == at("2024-01-01T00:02:00Z")


def test_naive_or_out_of_range_after_is_rejected() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    with pytest.raises(ValidationError) as raised:
        schedule.next_after(datetime(2024, 1, 1))
    assert raised.value.field == "after"
    with pytest.raises(ValidationError) as raised:
        schedule.next_after(datetime(9999, 1, 1, tzinfo=UTC))
    assert raised.value.field == "after"


def test_end_of_supported_range_is_none() -> None:
    assert CronSchedule("0 0 1 1 *", "UTC").next_after(at("9997-06-01T00:00:00Z")) is None
    assert CronSchedule("0 0 * 2 MON#5", "UTC").next_after(at("9990-01-01T00:00:00Z")) is None


def test_schedule_equality_and_repr() -> None:
    a = CronSchedule("0 9 * * MON-FRI", "Europe/Berlin")
    b = CronSchedule("0 9 * * 1-5", "Europe/Berlin")
    assert a == b and hash(a) == hash(b)
    assert a != CronSchedule("0 9 * * 1-5", "UTC")
    assert "Europe/Berlin" in repr(a)


@pytest.mark.parametrize(("tz", "field"), [("PST", "tz"), ("EST", "tz")])
def test_cron_schedule_rejects_bad_zone(tz: str, field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        CronSchedule("0 9 * * *", tz)
    assert raised.value.field == field


# --------------------------------------------------------------------------
# Interval and one-shot schedules; instants


def test_interval_is_elapsed_seconds_across_dst() -> None:
    anchor = at("2021-03-13T12:00:00-05:00")
    schedule = IntervalSchedule(86_400, anchor)
    assert schedule.next_after(anchor - timedelta(seconds=1)) == anchor  # the anchor is the first slot
    assert schedule.next_after(anchor) == at("2021-03-14T17:00:00Z")  # 13:00 EDT: 24 h later
    assert schedule.next_after(at("2021-03-14T17:00:00Z")) == at("2021-03-15T17:00:00Z")
    assert schedule.next_after(at("2021-03-14T16:59:59.5Z")) == at("2021-03-14T17:00:00Z")
    assert schedule.next_after(at("2000-01-01T00:00:00Z")) == anchor
    assert schedule.anchor.tzinfo is UTC


def test_interval_slots() -> None:
    anchor = at("2024-01-01T00:00:00Z")
    schedule = IntervalSchedule(90, anchor)
    got = list(iter_fires(schedule, anchor, at("2024-01-01T00:06:00Z")))
    assert [format_instant(f) for f in got] == [
        "2024-01-01T00:01:30Z",
        "2024-01-01T00:03:00Z",
        "2024-01-01T00:04:30Z",
        "2024-01-01T00:06:00Z",
    ]
    assert IntervalSchedule(60.0, anchor).interval_s == 60  # type: ignore[arg-type]
    assert IntervalSchedule(60, anchor) == IntervalSchedule(60, at("2024-01-01T01:00:00+01:00"))


@pytest.mark.parametrize("interval", [0, -5, 1.5, "60", None, True, float("nan")])
def test_interval_must_be_a_positive_whole_number(interval: object) -> None:
    with pytest.raises(ValidationError) as raised:
        IntervalSchedule(interval, at("2024-01-01T00:00:00Z"))  # type: ignore[arg-type]
    assert raised.value.field == "interval"


def test_interval_and_once_reject_naive() -> None:
    with pytest.raises(ValidationError) as raised:
        IntervalSchedule(60, datetime(2024, 1, 1))
    assert raised.value.field == "anchor"
    with pytest.raises(ValidationError) as raised:
        OnceSchedule(datetime(2024, 1, 1))
    assert raised.value.field == "at"
    for schedule in (IntervalSchedule(60, at("2024-01-01T00:00:00Z")), OnceSchedule(at("2024-01-01T00:00:00Z"))):
        with pytest.raises(ValidationError) as raised:
            schedule.next_after(datetime(2024, 1, 1))
        assert raised.value.field == "after"


def test_once() -> None:
    schedule = OnceSchedule(at("2024-06-01T12:00:00+02:00"))
    assert schedule.at == at("2024-06-01T10:00:00Z")
    assert schedule.next_after(at("2024-06-01T09:59:59Z")) == at("2024-06-01T10:00:00Z")
    assert schedule.next_after(at("2024-06-01T10:00:00Z")) is None
    assert schedule.next_after(at("2025-01-01T00:00:00Z")) is None
    assert list(iter_fires(schedule, at("2024-01-01T00:00:00Z"), at("2025-01-01T00:00:00Z"))) == [schedule.at]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01T00:00:00Z", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01T01:00:00+01:00", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2023-12-31T19:00:00-05:00", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01T00:00:00.250Z", datetime(2024, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)),
        (" 2024-01-01T00:00:00+00:00 ", datetime(2024, 1, 1, tzinfo=UTC)),
    ],
)
def test_parse_instant(text: str, expected: datetime) -> None:
    got = parse_instant(text, "at")
    assert got == expected
    assert got.tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("2024-01-01T00:00:00", "no UTC offset"),
        ("2024-01-01", "no UTC offset"),
        ("yesterday", "not an ISO 8601 instant"),
        ("2024-13-01T00:00:00Z", "not an ISO 8601 instant"),
        ("", "not an ISO 8601 instant"),
        (1704067200, "ISO 8601 instant string"),
        (None, "ISO 8601 instant string"),
        ("0001-01-01T00:00:00+05:00", "must lie in years 2 to 9997"),  # before year 1 in UTC: no datetime
        ("9999-12-31T23:00:00-05:00", "must lie in years 2 to 9997"),  # after year 9999 in UTC
        ("0001-06-01T00:00:00Z", "must lie in years 2 to 9997"),
        ("9998-01-01T00:00:00Z", "must lie in years 2 to 9997"),
    ],
)
def test_parse_instant_rejects(text: object, words: str) -> None:
    with pytest.raises(ValidationError) as raised:
        parse_instant(text, "at")  # type: ignore[arg-type]
    assert raised.value.field == "at"
    assert words in raised.value.rule
    assert raised.value.value == text  # echoed as typed


def test_format_instant() -> None:
    assert format_instant(datetime(2024, 1, 1, tzinfo=UTC)) == "2024-01-01T00:00:00Z"
    assert format_instant(at("2024-01-01T01:00:00+01:00")) == "2024-01-01T00:00:00Z"
    assert format_instant(datetime(2024, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)) == "2024-01-01T00:00:00.500000Z"
    with pytest.raises(ValidationError):
        format_instant(datetime(2024, 1, 1))
    for text in ("2024-01-01T00:00:00Z", "1999-12-31T23:59:59.000001Z"):
        assert format_instant(parse_instant(text, "t")) == text


def test_iter_fires_bounds_are_after_exclusive_until_inclusive() -> None:
    schedule = CronSchedule("0 * * * *", "UTC")
    got = list(iter_fires(schedule, at("2024-01-01T00:00:00Z"), at("2024-01-01T03:00:00Z")))
    assert [format_instant(f) for f in got] == [
        "2024-01-01T01:00:00Z",
        "2024-01-01T02:00:00Z",
        "2024-01-01T03:00:00Z",
    ]
    # consecutive windows neither miss nor repeat
    edges = [at(f"2024-01-01T{h:02d}:00:00Z") for h in (0, 2, 5, 7)]
    joined = [f for lo, hi in itertools.pairwise(edges) for f in iter_fires(schedule, lo, hi)]
    assert joined == list(iter_fires(schedule, edges[0], edges[-1]))
    assert list(iter_fires(schedule, at("2024-01-01T03:00:00Z"), at("2024-01-01T02:00:00Z"))) == []
    with pytest.raises(ValidationError) as raised:
        list(iter_fires(schedule, at("2024-01-01T00:00:00Z"), datetime(2024, 1, 2)))
    assert raised.value.field == "until"


# --------------------------------------------------------------------------
# Property tests

DST_ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Europe/London",
    "Australia/Lord_Howe",
    "Antarctica/Troll",
    "America/Sao_Paulo",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Asia/Tehran",
    "UTC",
]


def _values(low: int, high: int, max_step: int) -> st.SearchStrategy[str]:
    """Terms of a numeric cron field from a small grammar."""
    value = st.integers(low, high)
    step = st.integers(1, max_step)
    rng = st.tuples(value, value).map(sorted)
    term = st.one_of(
        st.just("*"),
        value.map(str),
        rng.map(lambda r: f"{r[0]}-{r[1]}"),
        step.map(lambda s: f"*/{s}"),
        st.tuples(rng, step).map(lambda x: f"{x[0][0]}-{x[0][1]}/{x[1]}"),
        st.tuples(value, step).map(lambda x: f"{x[0]}/{x[1]}"),
    )
    return st.lists(term, min_size=1, max_size=3).map(",".join)


def _day_of_month() -> st.SearchStrategy[str]:
    return st.one_of(_values(1, 31, 30), st.sampled_from(["L", "LW", "1,L", "15,LW"]))


def _day_of_week() -> st.SearchStrategy[str]:
    special = st.one_of(
        st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda x: f"{x[0]}#{x[1]}"),
        st.integers(0, 7).map(lambda d: f"{d}L"),
        st.sampled_from(["MON-FRI", "SAT,SUN", "MON-SUN", "TUE#2", "FRIL"]),
    )
    return st.one_of(_values(0, 7, 7), special)


EXPRESSIONS = st.tuples(
    _values(0, 59, 59),
    _values(0, 23, 23),
    _day_of_month(),
    st.one_of(_values(1, 12, 11), st.sampled_from(["JAN-MAR", "FEB", "*/3", "DEC"])),
    _day_of_week(),
).map(" ".join)

INSTANTS = st.datetimes(datetime(1990, 1, 1), datetime(2050, 1, 1)).map(lambda d: d.replace(tzinfo=UTC))


def _schedule_or_reject(expr: str, tz: str) -> CronSchedule:
    try:
        return CronSchedule(expr, tz)
    except ValidationError:
        assume(False)
        raise


@given(expr=EXPRESSIONS, start=INSTANTS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_agrees_with_cronsim_in_utc(expr: str, start: datetime) -> None:
    schedule = _schedule_or_reject(expr, "UTC")
    # cronsim reads MON-SUN as a reversed range and knows no FRIL: give it 1-7 and 5L.
    reference = CronSim(expr.replace("MON-SUN", "1-7").replace("FRIL", "5L"), start)
    instant = start
    for _ in range(4):
        try:
            expected = next(reference)
        except StopIteration:  # cronsim gives up after 50 years; we do not
            return
        instant = schedule.next_after(instant)
        assert instant == expected


DAY_EXPRESSIONS = st.tuples(
    st.integers(0, 59),
    st.integers(0, 23),
    _day_of_month(),
    st.one_of(_values(1, 12, 11), st.just("*")),
    st.one_of(_day_of_week(), st.just("*"), st.just("?")),
).map(lambda t: " ".join(map(str, t)))


def _assert_same_fires(schedule: CronSchedule, reference: CronSim, start: datetime, count: int) -> None:
    """The schedule's next ``count`` fires after ``start`` are the reference iterator's."""
    instant = start
    for _ in range(count):
        try:
            expected = next(reference)
        except StopIteration:  # cronsim gives up after 50 years; we do not
            return
        instant = schedule.next_after(instant)
        assert instant == expected


def _cronsim_text(expr: str) -> str:
    """``expr`` as cronsim reads it: MON-SUN as 1-7, FRIL as 5L, a day field '?' as '*'."""
    fields = expr.replace("MON-SUN", "1-7").replace("FRIL", "5L").split()
    return " ".join("*" if f == "?" else f for f in fields)


@given(expr=DAY_EXPRESSIONS, start=INSTANTS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_day_fields_agree_with_cronsim_in_utc(expr: str, start: datetime) -> None:
    # One fire a day at most, so every step crosses day and month boundaries.
    schedule = _schedule_or_reject(expr, "UTC")
    reference = CronSim(_cronsim_text(expr), start)
    _assert_same_fires(schedule, reference, start, 8)


@given(expr=DAY_EXPRESSIONS, start=INSTANTS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_seconds_dialect_day_fields_are_cronsims_matchers_combined_with_and(expr: str, start: datetime) -> None:
    # Spring's rule: a day matches iff it matches both day fields. cronsim's own
    # per-field matchers, with its day rule forced to AND, are the reference.
    try:
        schedule = CronSchedule("0 " + expr, "UTC", "seconds")
    except ValidationError:
        assume(False)
        raise
    reference = CronSim("0 " + _cronsim_text(expr), start)
    reference.day_and = True
    _assert_same_fires(schedule, reference, start, 8)


@given(expr=EXPRESSIONS, start=INSTANTS, tz=st.sampled_from(DST_ZONES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_fires_strictly_increase_and_are_matches_or_jumps(expr: str, start: datetime, tz: str) -> None:
    schedule = _schedule_or_reject(expr, tz)
    expression = schedule.expression
    zone = load_zone(tz)
    instant = start
    for _ in range(5):
        fire = schedule.next_after(instant)
        assert fire is not None
        assert fire > instant
        s = epoch_s(fire)
        wall = s + utc_offset(zone, s)
        is_match = expression.next_wall(wall - 1, wall) == wall
        is_jump = previous_transition(zone, s, 0) is not None
        assert is_match or (expression.is_fixed_time and is_jump)
        instant = fire


# ---- an independent oracle for the DST policy (minute and hour fields)


def _field_set(text: str, low: int, high: int) -> set[int]:
    result: set[int] = set()
    for term in text.split(","):
        base, _, step = term.partition("/")
        if base == "*":
            first, last = low, high
        elif "-" in base:
            first, last = map(int, base.split("-"))
        else:
            first = int(base)
            last = high if step else first
        result.update(range(first, last + 1, int(step or 1)))
    return result


def _oracle(expr: str, zone: zoneinfo.ZoneInfo, start_s: int, end_s: int) -> list[int]:
    """Fires in [start_s, end_s) by docs/design.md §3, minute by minute (whole-minute zones)."""
    minute_text, hour_text, _, _, dow_text = expr.split()
    minutes, hours = _field_set(minute_text, 0, 59), _field_set(hour_text, 0, 23)
    dows = {d % 7 for d in _field_set(dow_text, 0, 7)}
    fixed = not minute_text.startswith("*") and not hour_text.startswith("*")

    def matches(wall: datetime) -> bool:
        return wall.minute in minutes and wall.hour in hours and wall.isoweekday() % 7 in dows

    result = []
    previous = datetime.fromtimestamp(start_s - 60, zone).utcoffset()
    for s in range(start_s, end_s, 60):
        local = datetime.fromtimestamp(s, zone)
        offset = local.utcoffset()
        fire = matches(local) and not (fixed and local.fold == 1)
        if fixed and offset > previous:  # spring-forward at s: walls that never happen
            gap_start = datetime.fromtimestamp(s, UTC).replace(tzinfo=None) + previous
            gap = int((offset - previous).total_seconds()) // 60
            fire = fire or any(matches(gap_start + timedelta(minutes=k)) for k in range(gap))
        if fire:
            result.append(s)
        previous = offset
    return result


MINUTE_HOUR_EXPRESSIONS = st.tuples(
    st.sampled_from(["*", "*/15", "0", "30", "0,30", "*/7", "45", "59", "10-20"]),
    st.sampled_from(["*", "*/2", "0", "1", "2", "3", "1-3", "0,12", "23", "22-23", "*/5"]),
    st.sampled_from(["*", "*", "1-5", "0", "6"]),
).map(lambda t: f"{t[0]} {t[1]} * * {t[2]}")


@st.composite
def _windows(draw: st.DrawFn, zones: list[str]) -> tuple[str, int, int]:
    """A zone and a ~36 h window near one of its transitions (or anywhere if none)."""
    name = draw(st.sampled_from(zones))
    zone = load_zone(name)
    year_start = epoch_s(datetime(draw(st.integers(1996, 2030)), 1, 1, tzinfo=UTC))
    anchor = year_start + draw(st.integers(0, 364)) * 86_400
    transition = next_transition(zone, anchor)
    if transition is not None:
        anchor = transition[0]
    start = (anchor - draw(st.integers(0, 30 * 60)) * 60) // 60 * 60
    return name, start, start + 36 * 3600


@given(expr=MINUTE_HOUR_EXPRESSIONS, window=_windows(DST_ZONES))
@settings(max_examples=120, deadline=None)
def test_dst_policy_matches_the_minute_by_minute_oracle(expr: str, window: tuple[str, int, int]) -> None:
    name, start_s, end_s = window
    schedule = CronSchedule(expr, name)
    start, end = EPOCH + timedelta(seconds=start_s - 1), EPOCH + timedelta(seconds=end_s - 1)
    got = [epoch_s(f) for f in iter_fires(schedule, start, end)]
    assert got == sorted(set(got))  # strictly increasing: no duplicate instants
    assert got == _oracle(expr, load_zone(name), start_s, end_s)


@given(
    expr=st.sampled_from(["* * * * *", "* 2 * * *", "*/5 * * * *", "* 1-3 * * *", "*/10 0-4 * * *", "30 * * * *"]),
    window=_windows(DST_ZONES[:-1]),
)
@settings(max_examples=60, deadline=None)
def test_wildcard_fires_in_a_utc_day_equal_the_matching_real_minutes(expr: str, window: tuple[str, int, int]) -> None:
    name, start_s, _ = window
    zone = load_zone(name)
    day_start = start_s // 86_400 * 86_400
    minutes, hours = (_field_set(x, 0, 59 if i == 0 else 23) for i, x in enumerate(expr.split()[:2]))
    real = sum(
        1
        for s in range(day_start, day_start + 86_400, 60)
        if (local := datetime.fromtimestamp(s, zone)).minute in minutes and local.hour in hours
    )
    schedule = CronSchedule(expr, name)
    got = list(
        iter_fires(schedule, EPOCH + timedelta(seconds=day_start - 1), EPOCH + timedelta(seconds=day_start + 86_399))
    )
    assert len(got) == real


@given(
    minute=st.integers(0, 59),
    hour=st.integers(0, 23),
    name=st.sampled_from(
        [
            "America/New_York",
            "Europe/Berlin",
            "Australia/Lord_Howe",
            "Antarctica/Troll",
            "America/Sao_Paulo",
            "Pacific/Chatham",
        ]
    ),
    year=st.integers(2000, 2030),
    spring=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_daily_fixed_time_job_fires_once_per_local_date_across_dst(
    minute: int, hour: int, name: str, year: int, spring: bool
) -> None:
    zone = load_zone(name)
    anchor = epoch_s(datetime(year, 3 if spring else 9, 1, tzinfo=UTC))
    transition = next_transition(zone, anchor)
    assume(transition is not None)
    first_date = datetime.fromtimestamp(transition[0], zone).date() - timedelta(days=3)
    schedule = CronSchedule(f"{minute} {hour} * * *", name)
    start = datetime.combine(first_date, datetime.min.time(), zone)
    got = list(itertools.islice(_iterate(schedule, start - timedelta(seconds=1)), 7))
    dates = [f.astimezone(zone).date() for f in got]
    assert dates == [first_date + timedelta(days=k) for k in range(7)]


# --------------------------------------------------------------------------
# The smallest gap between consecutive slots (the jitter rule, issue 11 item 2)


@pytest.mark.parametrize(
    ("expr", "dialect", "gap"),
    [
        ("* * * * *", "unix", 60),
        ("*/15 * * * *", "unix", 900),
        ("0,59 * * * *", "unix", 60),  # :59 to the next hour's :00
        ("30 1,2 * * *", "unix", 3600),
        ("0 0,23 * * *", "unix", 3600),  # 23:00 to the next midnight
        ("0 0,23 * * MON", "unix", 82_800),  # Monday 00:00 to 23:00; Mondays are never adjacent
        ("0 0,23 * * MON,TUE", "unix", 3600),  # Monday 23:00 to Tuesday 00:00
        ("0 0 * * *", "unix", 86_400),
        ("0 0 * * 0-6/6", "unix", 86_400),  # Saturday, then Sunday
        ("0 0 28,29 2 *", "unix", 86_400),  # adjacent only in leap years
        ("0 1,23 L,1 * *", "unix", 7200),  # the month's last day 23:00, the 1st 01:00
        ("0 0 L * 1", "unix", 86_400),  # OR: a Sunday last day, then Monday the 1st
        ("0 0 1 * *", "unix", None),  # more than a day: every gap is 28 days or more
        ("0 0 15W * *", "unix", None),
        ("59 23 L * *", "unix", None),
        ("*/7 * * * * *", "seconds", 4),  # :56 to the next minute's :00
        ("0 0 0 13 * FRI", "seconds", None),  # AND: Friday the 13th
        ("0 0 0 12,13 * FRI,SAT", "seconds", 86_400),  # AND: a Friday 12th, then Saturday the 13th
    ],
)
def test_smallest_wall_gap(expr: str, dialect: str, gap: int | None) -> None:
    assert CronExpression.parse(expr, dialect).smallest_wall_gap_s() == gap


AFTER_2023_06 = at("2023-06-01T00:00:00Z")


@pytest.mark.parametrize(
    ("expr", "tz", "dialect", "limit", "gap"),
    [
        # Fixed-time: 01:30 EST, then 02:30 (in the gap) fires at the 03:00 EDT jump.
        ("30 1,2 * * *", "America/New_York", "unix", 86_400, 1800),
        ("30 1,2 * * *", "America/New_York", "unix", 1800, 1800),
        ("30 1,2 * * *", "America/New_York", "unix", 1799, None),  # only gaps up to the limit
        ("30 1,2 * * *", "UTC", "unix", 86_400, 3600),
        # The jump to 03:00 EDT, then 03:30 EDT.
        ("30 2,3 * * *", "America/New_York", "unix", 86_400, 1800),
        # Wildcard across spring-forward: 01:59 EST, then 03:00 EDT one minute later.
        ("*/59 1,3 * * *", "America/New_York", "unix", 86_400, 60),
        # Wildcard across fall-back: 02:00 CEST, then 02:00 CET an hour later.
        ("0 */2 * * *", "Europe/Berlin", "unix", 86_400, 3600),
        # A 23-hour day; Lord Howe's half-hour change gives 23.5 hours.
        ("0 0 * * *", "America/New_York", "unix", 86_400, 82_800),
        ("0 30 1 * * *", "Australia/Lord_Howe", "seconds", 86_400, 84_600),
        ("0 0 1 * *", "Europe/Berlin", "unix", 86_400, None),
    ],
)
def test_smallest_gap_around_offset_changes(expr: str, tz: str, dialect: str, limit: int, gap: int | None) -> None:
    assert CronSchedule(expr, tz, dialect).smallest_gap_s(limit, AFTER_2023_06) == gap


def test_smallest_gap_only_looks_at_changes_within_the_horizon() -> None:
    schedule = CronSchedule("30 1,2 * * *", "America/New_York")
    # From June 2023, the next spring-forward is 2024-03-10: 283 days away.
    assert schedule.smallest_gap_s(86_400, AFTER_2023_06, horizon_s=280 * 86_400) == 3600
    assert schedule.smallest_gap_s(86_400, AFTER_2023_06, horizon_s=290 * 86_400) == 1800


def test_smallest_gap_of_intervals_and_one_shots() -> None:
    interval = IntervalSchedule(60, AFTER_2023_06)
    assert interval.smallest_gap_s(60, AFTER_2023_06) == 60
    assert interval.smallest_gap_s(59, AFTER_2023_06) is None
    assert OnceSchedule(AFTER_2023_06).smallest_gap_s(86_400, AFTER_2023_06) is None


_GAP_EXPRESSIONS = st.tuples(
    st.sampled_from(["0", "30", "59", "0,30", "*/20", "15,45"]),
    st.sampled_from(["1", "2", "1,2", "0,23", "2,3", "*/6", "1-3", "*/11"]),
    st.sampled_from(["*", "L", "1", "L,1", "13", "28-31"]),
    st.just("*"),
    st.sampled_from(["*", "MON", "SAT,SUN", "5", "*/7"]),
).map(" ".join)


@given(expr=_GAP_EXPRESSIONS)
@settings(max_examples=40, deadline=None)
def test_smallest_wall_gap_matches_enumeration(expr: str) -> None:
    # Oracle: enumerate the matching days of 2001-2028 and the times of one
    # matching day with next_wall; gaps are consecutive times, and midnight
    # crossings between adjacent matching days.
    expression = CronExpression.parse(expr)
    start, end = _wall(datetime(2001, 1, 1)), _wall(datetime(2029, 1, 2))
    days, cursor = [], start - 1
    while (match := expression.next_wall(cursor, end)) is not None:
        days.append(match // 86_400)
        cursor = (match // 86_400 + 1) * 86_400 - 1
    first = days[0] * 86_400
    times, cursor = [], first - 1
    while (match := expression.next_wall(cursor, first + 86_399)) is not None:
        times.append(match - first)
        cursor = match
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if any(b - a == 1 for a, b in zip(days, days[1:], strict=False)):
        gaps.append(86_400 - (times[-1] - times[0]))
    assert expression.smallest_wall_gap_s() == (min(gaps) if gaps else None)


def _wall(naive: datetime) -> int:
    return int((naive - WALL_EPOCH).total_seconds())


@given(expr=_GAP_EXPRESSIONS, tz=st.sampled_from(DST_ZONES))
@settings(max_examples=30, deadline=None)
def test_smallest_gap_matches_brute_force_over_the_horizon(expr: str, tz: str) -> None:
    # Brute force: every fire from June 2023 through the two-year horizon, consecutive
    # differences. Whatever it finds, the method finds too (or smaller, from a wall
    # gap that occurs outside the horizon); when every day matches, exactly that.
    schedule = CronSchedule(expr, tz)
    after = AFTER_2023_06
    end = after + timedelta(days=2 * 366)
    fires_ = [epoch_s(f) for f in iter_fires(schedule, after, end)]
    gaps = [b - a for a, b in zip(fires_, fires_[1:], strict=False) if b - a <= 86_400]
    brute = min(gaps) if gaps else None
    got = schedule.smallest_gap_s(86_400, after)
    if brute is not None:
        assert got is not None and got <= brute
    if expr.split()[2] == "*" and expr.split()[4] == "*":
        assert got == brute
