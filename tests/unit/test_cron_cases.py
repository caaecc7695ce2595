"""The 41 cron/DST cases from public bug reports (tests/data/cron-cases.json).

The file is the source of truth: a list of cases, each drawn from a real
report against a scheduler or cron library (paraphrased in ``note``), with
``id``, ``expr``, ``tz`` (the IANA zone), ``start`` (ISO-8601 with offset)
and ``expect``. Each case is one test: ``fires`` cases must produce exactly
``expected_next`` (UTC, in order, the first strictly after ``start``);
``reject`` and ``never`` cases must be refused when the schedule is built
(ValidationError), which is the policy docs/design.md §3 prefers for both.
"""

from __future__ import annotations

import pytest
from helpers import cron_cases

from scheduler.errors import ValidationError
from scheduler.schedule import CronSchedule, format_instant, parse_instant

CASES = cron_cases()


def test_all_cases_are_present() -> None:
    assert len(CASES) == 41
    assert len({case["id"] for case in CASES}) == 41
    assert {case["expect"] for case in CASES} == {"fires", "reject", "never"}


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
@pytest.mark.timeout(60)  # a hang guard ("must return quickly", C34, C44), not a speed assertion
def test_case(case: dict) -> None:
    start = parse_instant(case["start"], "start")
    if case["expect"] in ("reject", "never"):
        with pytest.raises(ValidationError) as raised:
            CronSchedule(case["expr"], case["tz"])
        assert raised.value.field in ("cron", "tz")
        return
    assert case["expect"] == "fires"
    schedule = CronSchedule(case["expr"], case["tz"])
    got = []
    instant = start
    for _ in case["expected_next"]:
        fire = schedule.next_after(instant)
        assert fire is not None
        assert fire > instant
        got.append(format_instant(fire))
        instant = fire
    assert got == case["expected_next"], case["note"]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_start_without_offset_is_rejected(case: dict) -> None:
    naive = case["start"][:19]  # 2023-10-27T12:00:00, offset dropped
    with pytest.raises(ValidationError) as raised:
        parse_instant(naive, "start")
    assert raised.value.field == "start"
    assert "offset" in raised.value.rule


@pytest.mark.parametrize(
    ("case_id", "field", "words"),
    [
        ("C32", "cron", "never fires"),
        ("C46", "cron", "step 0 in the minute field"),
        ("C47", "cron", "day-of-month field"),
        ("C49", "cron", "step 90 is larger than the minute field allows (at most 59)"),
        ("C50", "cron", "dialect 'seconds'"),
        ("C52", "tz", "America/Los_Angeles"),
    ],
)
def test_rejections_name_the_rule(case_id: str, field: str, words: str) -> None:
    case = next(c for c in CASES if c["id"] == case_id)
    with pytest.raises(ValidationError) as raised:
        CronSchedule(case["expr"], case["tz"])
    assert raised.value.field == field
    assert words in raised.value.rule


def test_c50_is_valid_in_the_seconds_dialect() -> None:
    # The same string means "every minute at second 0" when the dialect says so.
    schedule = CronSchedule("0 * * * * *", "UTC", dialect="seconds")
    fire = schedule.next_after(parse_instant("2024-01-01T00:00:00Z", "t"))
    assert format_instant(fire) == "2024-01-01T00:01:00Z"
