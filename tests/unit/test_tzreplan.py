"""The slot test and the true slot of scheduler/tzreplan.py (pure parts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.schedule import CronSchedule
from scheduler.tzreplan import is_slot, true_slot

CASES = [
    c
    for c in json.loads((Path(__file__).resolve().parents[1] / "data" / "cron-cases.json").read_text())
    if c.get("expect") == "fires"
]
S = timedelta(seconds=1)


def t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_every_fire_of_the_dst_cases_is_a_slot_and_nothing_between(case: dict) -> None:
    """A stored slot is replanned only if it is no slot: every real fire must pass
    (transition instants, first occurrences on fall-back nights), and instants
    one second either side must not."""
    schedule = CronSchedule(case["expr"], case.get("tz") or "UTC", case.get("dialect") or "unix")
    fires = [t(x) for x in case["expected_next"]]
    for fire in fires:
        assert is_slot(schedule, fire), fire
        for near in (fire - S, fire + S):
            assert is_slot(schedule, near) == (near in fires), near


@settings(max_examples=200, deadline=None)
@given(
    minute=st.integers(0, 59),
    hour=st.integers(0, 23),
    zone=st.sampled_from(
        ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Havana", "Asia/Almaty", "UTC"]
    ),
    start=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2027, 12, 31)),
)
def test_a_chain_of_fires_is_all_slots(minute: int, hour: int, zone: str, start: datetime) -> None:
    schedule = CronSchedule(f"{minute} {hour},{(hour + 5) % 24} * * *", zone)
    fire = start.replace(tzinfo=UTC)
    for _ in range(6):
        fire = schedule.next_after(fire)
        assert is_slot(schedule, fire)


def test_the_true_slot_is_the_first_after_the_last_handled_instant() -> None:
    daily = CronSchedule("0 9 * * *", "Europe/Berlin")  # 08:00Z in winter
    created, stored = t("2026-11-20T00:00:00Z"), t("2026-12-01T09:00:00Z")
    last_run = t("2026-11-30T08:00:00Z")
    assert true_slot(
        daily, stored=stored, created_at=created, changed_at=created, last_run=last_run, last_skip_until=None
    ) == t("2026-12-01T08:00:00Z")
    # Never ran, created yesterday: the first slot after the creation.
    assert true_slot(
        daily,
        stored=stored,
        created_at=t("2026-11-30T20:00:00Z"),
        changed_at=t("2026-11-30T20:00:00Z"),
        last_run=None,
        last_skip_until=None,
    ) == t("2026-12-01T08:00:00Z")
    # A skip range ending at a slot: the slot at its end is not skipped.
    assert true_slot(
        daily,
        stored=stored,
        created_at=created,
        changed_at=created,
        last_run=last_run,
        last_skip_until=t("2026-12-01T08:00:00Z"),
    ) == t("2026-12-01T08:00:00Z")
    # An edit kept a pending slot older than the edit: the edit is no lower bound.
    assert true_slot(
        daily,
        stored=t("2026-11-28T09:00:00Z"),
        created_at=created,
        changed_at=t("2026-11-30T00:00:00Z"),
        last_run=t("2026-11-26T08:00:00Z"),
        last_skip_until=None,
    ) == t("2026-11-27T08:00:00Z")
