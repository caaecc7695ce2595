"""Registering and managing jobs and tenants against a real store (scheduler/jobs.py).

Bad input must raise ValidationError naming the field and change nothing
(docs/design.md §8): every rejection test snapshots ``jobs`` and ``tenants``
before and after. The corpus import runs on the project's real 1,500-line
corpus with its exact outcome pinned.
"""

from __future__ import annotations

import csv
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from helpers import store_now

from scheduler import jobs, store
from scheduler.errors import ConflictError, NotFoundError, ValidationError
from scheduler.partition import partition_of
from scheduler.planner import scheduled_time
from scheduler.schedule import CronSchedule
from scheduler.spec import JobSpec

UTC = UTC
CORPUS = Path(__file__).resolve().parents[2] / "scheduler" / "data" / "cron-corpus.csv"


def snapshot(conn: psycopg.Connection) -> tuple[list[dict], list[dict]]:
    return (
        conn.execute("SELECT * FROM jobs ORDER BY job_id").fetchall(),
        conn.execute("SELECT * FROM tenants ORDER BY tenant").fetchall(),
    )


def count(conn: psycopg.Connection, table: str, where: str = "true", params: tuple = ()) -> int:
    return conn.execute(f"SELECT count(*) AS c FROM {table} WHERE {where}", params).fetchone()["c"]  # noqa: S608


# ---------------------------------------------------------------- add / pause / resume / delete


def test_add_cron_job_stores_the_spec_and_its_first_slot(conn) -> None:
    before = store_now(conn)
    result = jobs.add_job(conn, JobSpec.build(tenant="acme", cron="30 2 * * *", tz="America/New_York"))
    after = store_now(conn)

    assert result.outcome == "created"
    row = jobs.get_job(conn, result.job_id)
    assert row["partition_id"] == partition_of(result.job_id)
    assert (row["tenant"], row["kind"], row["cron_expr"], row["cron_dialect"], row["tz"]) == (
        "acme",
        "cron",
        "30 2 * * *",
        "unix",
        "America/New_York",
    )
    assert (row["misfire"], row["catchup_window_s"], row["misfire_grace_s"], row["jitter_s"]) == ("all", 86_400, 60, 0)
    assert row["paused"] is False and row["deleted_at"] is None and row["revision"] == 1
    assert before <= row["created_at"] <= after
    schedule = CronSchedule("30 2 * * *", "America/New_York")
    assert row["next_nominal_at"] == schedule.next_after(row["created_at"])
    assert row["next_due_at"] == row["next_nominal_at"]
    assert [t["tenant"] for t in jobs.list_tenants(conn)] == ["acme"]  # created on first use


def test_add_interval_job_is_anchored_on_its_creation_second(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=300, jitter_s=20)).job_id
    row = jobs.get_job(conn, job_id)
    assert row["anchor_at"] == row["created_at"].replace(microsecond=0)
    assert row["next_nominal_at"] == row["anchor_at"] + timedelta(seconds=300)
    assert row["next_due_at"] == scheduled_time(job_id, row["next_nominal_at"], 20)


def test_add_one_shot_job(conn) -> None:
    at = datetime(2030, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=2)))
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", at=at)).job_id
    row = jobs.get_job(conn, job_id)
    assert row["kind"] == "once"
    assert row["fire_at"] == row["next_nominal_at"] == datetime(2030, 1, 1, 7, 0, tzinfo=UTC)


def test_pause_resume_delete(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", cron="*/5 * * * *")).job_id
    created = jobs.get_job(conn, job_id)

    jobs.set_paused(conn, job_id, True)
    paused = jobs.get_job(conn, job_id)
    assert paused["paused"] is True
    assert paused["next_nominal_at"] is None and paused["next_due_at"] is None
    assert paused["revision"] == created["revision"] + 1

    jobs.set_paused(conn, job_id, False)
    resumed = jobs.get_job(conn, job_id)
    assert resumed["paused"] is False
    assert resumed["revision"] == created["revision"] + 2
    assert resumed["next_nominal_at"] == CronSchedule("*/5 * * * *").next_after(resumed["changed_at"])
    assert resumed["next_nominal_at"] > resumed["changed_at"]

    jobs.delete_job(conn, job_id)
    deleted = jobs.get_job(conn, job_id)  # soft delete: the row stays
    assert deleted["deleted_at"] is not None
    assert deleted["next_nominal_at"] is None and deleted["next_due_at"] is None
    assert jobs.list_jobs(conn) == []
    assert jobs.list_tenants(conn)[0]["jobs"] == 0

    with pytest.raises(NotFoundError, match=str(job_id)):
        jobs.delete_job(conn, job_id)
    with pytest.raises(NotFoundError, match="deleted"):
        jobs.set_paused(conn, job_id, False)
    assert jobs.get_job(conn, job_id) == deleted


def test_pause_and_resume_are_idempotent(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", cron="*/5 * * * *")).job_id
    overdue = datetime(2020, 1, 1, tzinfo=UTC)  # a backlog after an outage
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(t)s, next_due_at = %(t)s WHERE job_id = %(j)s", {"t": overdue, "j": job_id}
    )
    running = jobs.get_job(conn, job_id)

    jobs.set_paused(conn, job_id, False)  # resuming a running job keeps its backlog
    assert jobs.get_job(conn, job_id) == running

    jobs.set_paused(conn, job_id, True)
    paused = jobs.get_job(conn, job_id)
    jobs.set_paused(conn, job_id, True)
    assert jobs.get_job(conn, job_id) == paused
    assert paused["revision"] == running["revision"] + 1


def test_unknown_job_is_not_found(conn) -> None:
    missing = uuid.UUID(int=42)
    for call in (
        lambda: jobs.get_job(conn, missing),
        lambda: jobs.delete_job(conn, missing),
        lambda: jobs.set_paused(conn, missing, True),
    ):
        with pytest.raises(NotFoundError, match=str(missing)):
            call()


def test_resume_of_an_interval_job_keeps_its_anchor(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=7)).job_id
    anchor = jobs.get_job(conn, job_id)["anchor_at"]
    jobs.set_paused(conn, job_id, True)
    jobs.set_paused(conn, job_id, False)
    row = jobs.get_job(conn, job_id)
    assert row["anchor_at"] == anchor
    elapsed = (row["next_nominal_at"] - anchor).total_seconds()
    assert elapsed % 7 == 0 and row["next_nominal_at"] > row["changed_at"]


# ---------------------------------------------------------------- idempotent --name


def test_same_name_and_spec_returns_the_existing_id(conn) -> None:
    spec = JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *", tz="Europe/Berlin")
    first = jobs.add_job(conn, spec)
    state = snapshot(conn)
    second = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *", tz="Europe/Berlin"))
    assert (first.outcome, second.outcome) == ("created", "exists")
    assert second.job_id == first.job_id
    assert snapshot(conn) == state


def test_same_name_in_another_tenant_is_another_job(conn) -> None:
    a = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *"))
    b = jobs.add_job(conn, JobSpec.build(tenant="globex", name="nightly", cron="0 2 * * *"))
    assert a.job_id != b.job_id and b.outcome == "created"
    assert count(conn, "jobs") == 2


def test_same_name_different_spec_conflicts_and_changes_nothing(conn) -> None:
    first = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *"))
    state = snapshot(conn)
    with pytest.raises(ConflictError, match=rf"name: .*nightly.*{first.job_id}.*--replace"):
        jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 3 * * *"))
    with pytest.raises(ConflictError):
        jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *", misfire="skip"))
    assert snapshot(conn) == state


def test_replace_edits_in_place_and_bumps_the_revision(conn) -> None:
    first = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *"))
    before = jobs.get_job(conn, first.job_id)
    replaced = jobs.add_job(
        conn, JobSpec.build(tenant="acme", name="nightly", interval_s=600, misfire="once"), replace=True
    )
    after = jobs.get_job(conn, first.job_id)
    assert (replaced.job_id, replaced.outcome) == (first.job_id, "replaced")
    assert count(conn, "jobs") == 1
    assert after["revision"] == before["revision"] + 1
    assert (after["kind"], after["interval_s"], after["cron_expr"], after["misfire"]) == ("interval", 600, None, "once")
    assert after["created_at"] == before["created_at"]
    assert after["changed_at"] > before["changed_at"]
    assert after["anchor_at"] == after["changed_at"].replace(microsecond=0)
    assert after["next_nominal_at"] == after["anchor_at"] + timedelta(seconds=600)
    # Replacing with the same spec again is a no-op.
    again = jobs.add_job(
        conn, JobSpec.build(tenant="acme", name="nightly", interval_s=600, misfire="once"), replace=True
    )
    assert again.outcome == "exists"
    assert jobs.get_job(conn, first.job_id)["revision"] == after["revision"]


def overdue(conn: psycopg.Connection, job_id: uuid.UUID, slot: datetime) -> dict:
    """Put ``job_id``'s pending slot at ``slot`` (an outage left it due; an interval
    job is re-anchored there); its row."""
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(t)s, next_due_at = %(t)s, created_at = %(c)s, "
        "changed_at = %(c)s, anchor_at = CASE WHEN kind = 'interval' THEN %(t)s END "
        "WHERE job_id = %(j)s",
        {"t": slot, "c": slot - timedelta(minutes=1), "j": job_id},
    )
    return jobs.get_job(conn, job_id)


def skips(conn: psycopg.Connection, job_id: uuid.UUID) -> list[tuple]:
    return [
        (r["first_nominal"], r["until_nominal"], r["slots"], r["reason"], r["recorded_at"])
        for r in conn.execute("SELECT * FROM skips WHERE job_id = %s ORDER BY first_nominal", (job_id,)).fetchall()
    ]


def revisions(conn: psycopg.Connection, job_id: uuid.UUID) -> list[dict]:
    return conn.execute("SELECT * FROM job_revisions WHERE job_id = %s ORDER BY revision", (job_id,)).fetchall()


def test_replace_of_an_overdue_job_keeping_its_schedule_keeps_the_due_slot(conn) -> None:
    """A policy change alone (--catchup-window-s) must not drop the slot an outage left due."""
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", name="n", cron="*/5 * * * *")).job_id
    slot = store_now(conn).replace(second=0, microsecond=0) - timedelta(minutes=30)
    slot -= timedelta(minutes=slot.minute % 5)
    before = overdue(conn, job_id, slot)

    jobs.add_job(
        conn,
        JobSpec.build(tenant="acme", name="n", cron="*/5 * * * *", catchup_window_s=7200, jitter_s=30),
        replace=True,
    )

    after = jobs.get_job(conn, job_id)
    assert (after["next_nominal_at"], after["catchup_window_s"]) == (slot, 7200)
    assert after["next_due_at"] == scheduled_time(job_id, slot, 30)
    assert skips(conn, job_id) == []
    [old] = revisions(conn, job_id)
    assert (old["revision"], old["catchup_window_s"], old["jitter_s"]) == (before["revision"], 86_400, 0)
    assert (old["valid_from"], old["valid_until"]) == (before["changed_at"], after["changed_at"])


def test_replace_of_an_overdue_interval_job_keeping_its_interval_keeps_anchor_and_slot(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", name="n", interval_s=60)).job_id
    slot = jobs.get_job(conn, job_id)["anchor_at"] - timedelta(seconds=600)
    overdue(conn, job_id, slot)
    jobs.add_job(conn, JobSpec.build(tenant="acme", name="n", interval_s=60, misfire="skip"), replace=True)
    after = jobs.get_job(conn, job_id)
    assert (after["anchor_at"], after["next_nominal_at"], after["misfire"]) == (slot, slot, "skip")
    assert skips(conn, job_id) == []


def test_replace_of_an_overdue_job_with_a_new_schedule_records_the_dropped_slots(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", name="n", cron="*/5 * * * *")).job_id
    slot = store_now(conn).replace(second=0, microsecond=0) - timedelta(minutes=30)
    slot -= timedelta(minutes=slot.minute % 5)
    before = overdue(conn, job_id, slot)

    jobs.add_job(conn, JobSpec.build(tenant="acme", name="n", cron="0 3 * * *"), replace=True)

    after = jobs.get_job(conn, job_id)
    edit = after["changed_at"]
    old = CronSchedule("*/5 * * * *")
    until = old.next_after(edit)
    dropped = int((until - slot).total_seconds() // 300)
    assert skips(conn, job_id) == [(slot, until, dropped, "edited", edit)]
    assert after["next_nominal_at"] == CronSchedule("0 3 * * *").next_after(edit)
    [rev] = revisions(conn, job_id)
    assert (rev["cron_expr"], rev["valid_from"], rev["valid_until"]) == ("*/5 * * * *", before["changed_at"], edit)


def test_pause_and_delete_of_an_overdue_job_record_the_dropped_slots(conn) -> None:
    for action, reason in (("pause", "paused"), ("delete", "deleted")):
        job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
        slot = anchor = jobs.get_job(conn, job_id)["anchor_at"] - timedelta(seconds=600)
        overdue(conn, job_id, slot)
        if action == "pause":
            jobs.set_paused(conn, job_id, True)
        else:
            jobs.delete_job(conn, job_id)
        row = jobs.get_job(conn, job_id)
        edit = row["changed_at"]
        until = anchor + timedelta(seconds=60 * (int((edit - anchor).total_seconds()) // 60 + 1))
        dropped = int((until - slot).total_seconds()) // 60
        assert skips(conn, job_id) == [(slot, until, dropped, reason, edit)], action
        assert [(r["paused"], r["valid_until"]) for r in revisions(conn, job_id)] == [(False, edit)]


def test_resume_records_the_paused_revision_and_drops_nothing(conn) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
    jobs.set_paused(conn, job_id, True)
    paused = jobs.get_job(conn, job_id)
    jobs.set_paused(conn, job_id, False)
    resumed = jobs.get_job(conn, job_id)
    assert [(r["revision"], r["paused"], r["valid_from"], r["valid_until"]) for r in revisions(conn, job_id)] == [
        (1, False, paused["created_at"], paused["changed_at"]),
        (2, True, paused["changed_at"], resumed["changed_at"]),
    ]
    assert skips(conn, job_id) == []


def test_a_deleted_name_can_be_reused(conn) -> None:
    first = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *"))
    jobs.delete_job(conn, first.job_id)
    second = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", cron="0 2 * * *"))
    assert second.outcome == "created" and second.job_id != first.job_id


# ---------------------------------------------------------------- bad input changes nothing

FUTURE = datetime(2031, 1, 1, tzinfo=UTC)

BAD = [
    # (id, spec arguments, field named, words in the rule)
    ("cron-fields", {"cron": "* * *"}, "cron", "expected 5 fields"),
    ("cron-garbage", {"cron": "every day"}, "cron", "expected 5 fields"),
    ("cron-step-60", {"cron": "*/60 * * * *"}, "cron", "step 60 is larger than the minute field allows"),
    ("cron-step-24h", {"cron": "0 */24 * * *"}, "cron", "hour"),
    ("cron-step-0", {"cron": "*/0 * * * *"}, "cron", "step 0"),
    ("cron-never", {"cron": "0 0 31 2 *"}, "cron", "never fires"),
    ("cron-reboot", {"cron": "@reboot"}, "cron", "@reboot"),
    ("cron-quartz", {"cron": "0 0 12 * * ? 2024", "dialect": "seconds"}, "cron", "Quartz with a year"),
    ("cron-question-minute", {"cron": "? 0 * * *"}, "cron", "only allowed as a whole day-of-month or day-of-week"),
    ("cron-spring-never", {"cron": "0 0 0 31 2 FRI", "dialect": "seconds"}, "cron", "never fires"),
    ("cron-reversed", {"cron": "0 0 * * FRI-MON"}, "cron", "reversed"),
    ("cron-out-of-range", {"cron": "61 * * * *"}, "cron", "minute"),
    ("dialect", {"cron": "* * * * *", "dialect": "quartz"}, "dialect", "one of unix, seconds"),
    ("tz-unknown", {"cron": "* * * * *", "tz": "Mars/Olympus_Mons"}, "tz", "IANA"),
    ("tz-EST", {"cron": "* * * * *", "tz": "EST"}, "tz", "America/New_York"),
    ("tz-PST", {"cron": "* * * * *", "tz": "PST"}, "tz", "America/Los_Angeles"),
    ("tz-CET", {"cron": "* * * * *", "tz": "CET"}, "tz", "legacy"),
    ("tz-on-interval", {"interval_s": 60, "tz": "UTC"}, "tz", "--cron schedules only"),
    ("at-naive", {"at": datetime(2031, 1, 1, 9, 0)}, "at", "UTC offset"),
    ("at-past", {"at": datetime(2001, 1, 1, tzinfo=UTC)}, "at", "future"),
    (
        "at-past-9997",
        {"at": datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), "jitter_s": 86_400},
        "at",
        "years 2 to 9997",
    ),
    ("interval-0", {"interval_s": 0}, "interval", "positive"),
    ("interval-neg", {"interval_s": -5}, "interval", "positive"),
    ("interval-frac", {"interval_s": 1.5}, "interval", "whole number"),
    ("interval-text", {"interval_s": "5m"}, "interval", "number of seconds"),
    ("interval-bool", {"interval_s": True}, "interval", "number of seconds"),
    ("interval-huge", {"interval_s": 10**12}, "interval", "at most"),
    ("no-schedule", {}, "schedule", "exactly one"),
    ("two-schedules", {"cron": "* * * * *", "interval_s": 60}, "schedule", "exactly one"),
    ("misfire", {"interval_s": 60, "misfire": "sometimes"}, "misfire", "one of all, once, skip"),
    ("window-neg", {"interval_s": 60, "catchup_window_s": -1}, "catchup_window_s", "at least 0"),
    ("window-huge", {"interval_s": 60, "catchup_window_s": 10**10}, "catchup_window_s", "at most"),
    ("grace-huge", {"interval_s": 60, "misfire": "skip", "misfire_grace_s": 10**10}, "misfire_grace_s", "at most"),
    ("grace-frac", {"interval_s": 60, "misfire": "skip", "misfire_grace_s": 0.5}, "misfire_grace_s", "whole number"),
    ("jitter-neg", {"interval_s": 60, "jitter_s": -1}, "jitter", "at least 0"),
    ("jitter-huge", {"interval_s": 60, "jitter_s": 86_401}, "jitter", "at most 86400"),
    # Jitter must be smaller than the smallest gap between consecutive slots (issue 11, item 2).
    (
        "jitter-interval-equal",
        {"interval_s": 60, "jitter_s": 60},
        "jitter",
        "must be smaller than the smallest gap between slots (60 s for this schedule)",
    ),
    ("jitter-interval-above", {"interval_s": 60, "jitter_s": 300}, "jitter", "(60 s for this schedule)"),
    ("jitter-cron-equal", {"cron": "* * * * *", "jitter_s": 60}, "jitter", "(60 s for this schedule)"),
    ("jitter-cron-above", {"cron": "*/5 * * * *", "jitter_s": 3600}, "jitter", "(300 s for this schedule)"),
    (
        "jitter-cron-dst",
        {"cron": "30 1,2 * * *", "tz": "America/New_York", "jitter_s": 1800},
        "jitter",
        "(1800 s for this schedule, at a UTC-offset change of America/New_York)",
    ),
    (
        "jitter-cron-daily-dst",
        {"cron": "0 0 * * *", "tz": "Europe/Berlin", "jitter_s": 82_800},
        "jitter",
        "(82800 s for this schedule, at a UTC-offset change of Europe/Berlin)",
    ),  # the 23-hour day
    ("jitter-cron-month-end", {"cron": "0 1,23 L,1 * *", "jitter_s": 7200}, "jitter", "(7200 s for this schedule)"),
    (
        "jitter-seconds-dialect",
        {"cron": "*/10 * * * * *", "dialect": "seconds", "jitter_s": 10},
        "jitter",
        "(10 s for this schedule)",
    ),
    ("name-empty", {"interval_s": 60, "name": ""}, "name", "printable"),
    ("name-newline", {"interval_s": 60, "name": "a\nb"}, "name", "printable"),
    ("tenant-punct", {"interval_s": 60, "tenant": "-acme"}, "tenant", "letter or digit"),
    ("tenant-space", {"interval_s": 60, "tenant": "ac me"}, "tenant", "letters, digits"),
    ("tenant-empty", {"interval_s": 60, "tenant": ""}, "tenant", "1-200 characters"),
    ("tenant-long", {"interval_s": 60, "tenant": "a" * 201}, "tenant", "1-200 characters"),
]


@pytest.mark.parametrize(("kwargs", "field", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(conn, kwargs, field, words) -> None:
    jobs.add_job(conn, JobSpec.build(tenant="existing", cron="0 0 * * *"))
    state = snapshot(conn)
    kwargs = {"tenant": "newcomer", **kwargs}

    with pytest.raises(ValidationError) as caught:
        jobs.add_job(conn, JobSpec.build(**kwargs))

    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert words in caught.value.rule
    assert snapshot(conn) == state
    assert count(conn, "tenants", "tenant = %s", ("newcomer",)) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval_s": 60, "jitter_s": 59},
        {"cron": "* * * * *", "jitter_s": 59},
        {"cron": "30 1,2 * * *", "tz": "America/New_York", "jitter_s": 1799},
        {"cron": "30 1,2 * * *", "tz": "UTC", "jitter_s": 3599},  # no offset change: the wall gap, 3,600 s
        {"cron": "0 0 * * *", "tz": "Europe/Berlin", "jitter_s": 82_799},
        {"cron": "0 1,23 L,1 * *", "jitter_s": 7199},
        {"cron": "*/10 * * * * *", "dialect": "seconds", "jitter_s": 9},
        {"cron": "0 0 1 * *", "jitter_s": 86_400},  # a month apart: any jitter up to the maximum
        {"at": FUTURE, "jitter_s": 86_400},  # one slot: no gap
    ],
    ids=["interval", "cron", "cron-dst", "cron-utc", "cron-daily-dst", "cron-month-end", "seconds", "monthly", "once"],
)
def test_jitter_below_the_smallest_gap_is_accepted(conn, kwargs) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", **kwargs)).job_id
    assert jobs.get_job(conn, job_id)["jitter_s"] == kwargs["jitter_s"]


def test_a_past_one_shot_in_a_batch_writes_nothing(conn) -> None:
    state = snapshot(conn)
    specs = [
        JobSpec.build(tenant="newcomer", interval_s=60),
        JobSpec.build(tenant="newcomer", at=FUTURE),
        JobSpec.build(tenant="newcomer", at=datetime(2001, 1, 1, tzinfo=UTC)),
    ]
    with pytest.raises(ValidationError) as caught:
        jobs.add_jobs(conn, specs)
    assert caught.value.field == "at"
    assert snapshot(conn) == state


def test_tenants_add_list_set(conn) -> None:
    assert jobs.add_tenant(conn, "acme", weight=3, max_rate=50.0) is True
    assert jobs.add_tenant(conn, "acme", weight=9) is False  # exists: unchanged
    jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60))
    jobs.add_job(conn, JobSpec.build(tenant="globex", interval_s=60))
    listed = [(t["tenant"], t["weight"], t["max_rate"], t["jobs"]) for t in jobs.list_tenants(conn)]
    assert listed == [("acme", 3, 50.0, 1), ("globex", 1, None, 1)]

    acme = {"tenant": "acme", "max_schedules": None}
    assert jobs.set_tenant(conn, "acme", weight=5) == {**acme, "weight": 5, "max_rate": 50.0}
    assert jobs.set_tenant(conn, "acme", max_rate=7.5) == {**acme, "weight": 5, "max_rate": 7.5}
    assert jobs.set_tenant(conn, "acme", clear_max_rate=True) == {**acme, "weight": 5, "max_rate": None}
    assert jobs.set_tenant(conn, "acme", max_schedules=3) == {**acme, "weight": 5, "max_rate": None, "max_schedules": 3}
    assert jobs.set_tenant(conn, "acme", weight=6)["max_schedules"] == 3  # kept
    assert jobs.set_tenant(conn, "acme", clear_max_schedules=True)["max_schedules"] is None
    with pytest.raises(NotFoundError, match="initech"):
        jobs.set_tenant(conn, "initech", weight=2)

    state = snapshot(conn)
    for call, field in [
        (lambda: jobs.add_tenant(conn, "bad tenant"), "tenant"),
        (lambda: jobs.add_tenant(conn, "initech", weight=0), "weight"),
        (lambda: jobs.add_tenant(conn, "initech", weight=1001), "weight"),
        (lambda: jobs.add_tenant(conn, "initech", max_rate=0), "max_rate"),
        (lambda: jobs.set_tenant(conn, "acme", max_schedules=-1), "max_schedules"),
        (lambda: jobs.set_tenant(conn, "acme", max_schedules=100_000_001), "max_schedules"),
        (lambda: jobs.set_tenant(conn, "acme", max_schedules="٣"), "max_schedules"),
        (lambda: jobs.add_tenant(conn, "initech", max_rate=float("inf")), "max_rate"),
        (lambda: jobs.add_tenant(conn, "initech", max_rate=float("nan")), "max_rate"),
        (lambda: jobs.set_tenant(conn, "acme", max_rate=float("inf")), "max_rate"),
        (lambda: jobs.set_tenant(conn, "acme", weight=-1), "weight"),
        (lambda: jobs.set_tenant(conn, "acme", max_rate=-2.0), "max_rate"),
    ]:
        with pytest.raises(ValidationError) as caught:
            call()
        assert caught.value.field == field
    assert snapshot(conn) == state


# ---------------------------------------------------------------- the corpus import

# The corpus has 1,500 data lines (1,501 physical lines with the header).
# Computed once with `corpus_specs` and checked by hand: 1,356 parse as
# schedules (unix5 and macro lines as unix, seconds6 as seconds, empty zone =
# UTC) and 144 do not — 102 Python/YAML/JSON snippets (celery `crontab(...)`,
# `h: 16, m: 30`, `[{hour: ...}]`), Go-style durations (`3h`, `1h`, `168h`,
# `1m`), words (`hourly`, `daily`, `once`, `nil`), `@reboot`, 6-field Quartz
# lines (dialect `quartz`, read as unix), zone suffixes (`30 8 * * * Europe/London`), templated values
# (`${scheduleExpression}`, `%%CRONTAB_INT%%`, `#{rand(60)}`), Jenkins `H/15`,
# a 4-field line and `0 22, 10 * * *` (a space after a comma: 6 tokens).
CORPUS_LINES = 1_500
CORPUS_IMPORTED = 1_356
CORPUS_REJECTED = 144

KNOWN_BAD = {
    2: ("3h", "cron: expected 5 fields for dialect 'unix', got 1"),
    210: ("@reboot", "cron: @reboot is not a timer"),
    228: ("*/%%CRONTAB_INT%% * * * *", "cron: step '%%CRONTAB_INT%%' in the minute field must be a whole number"),
    302: ("30 8 * * * Europe/London", "cron: 6 fields given, but the unix dialect takes 5"),
    392: ("0 22, 10 * * *", "cron: 6 fields given, but the unix dialect takes 5"),
    617: ("${scheduleExpression}", "cron: expected 5 fields for dialect 'unix', got 1"),
    1169: ("0/30 * * * * ?", "cron: 6 fields given, but the unix dialect takes 5"),
    1173: ("1 * * 1-5", "cron: expected 5 fields for dialect 'unix', got 4"),
    1174: ("H/15 * * * 1-5", "cron: 'H' is not a valid value in the minute field"),
}


def test_corpus_import_exact_outcome(conn) -> None:
    assert sum(1 for _ in CORPUS.open(encoding="utf-8")) == CORPUS_LINES + 1

    report = jobs.import_csv(conn, CORPUS, "corpus")

    assert len(report.imported) == CORPUS_IMPORTED
    assert len(report.rejected) == CORPUS_REJECTED
    assert len(set(report.imported)) == CORPUS_IMPORTED
    assert CORPUS_IMPORTED + CORPUS_REJECTED == CORPUS_LINES
    rejected = {line: (expr, reason) for line, expr, reason in report.rejected}
    assert len(rejected) == CORPUS_REJECTED  # one report per line
    for line, (expr, reason) in KNOWN_BAD.items():
        assert rejected[line][0] == expr, line
        assert rejected[line][1].startswith(reason), (line, rejected[line][1])
    # Line numbers are physical lines of the file: check them against the file itself.
    physical = CORPUS.read_text(encoding="utf-8").splitlines()
    for line, (expr, _) in rejected.items():
        assert next(csv.reader([physical[line - 1]]))[0].strip() == expr, line

    assert count(conn, "jobs") == CORPUS_IMPORTED
    assert count(conn, "jobs", "tenant = 'corpus' AND kind = 'cron' AND next_nominal_at IS NOT NULL") == CORPUS_IMPORTED
    assert sorted(r["job_id"] for r in conn.execute("SELECT job_id FROM jobs").fetchall()) == sorted(report.imported)
    # A seconds-dialect line with its zone (line 156) and a macro line (line 138) came in as such.
    assert count(conn, "jobs", "cron_expr = '0 0 8 * * *' AND cron_dialect = 'seconds' AND tz = 'Europe/Madrid'") == 1
    assert count(conn, "jobs", "cron_expr = '@yearly' AND cron_dialect = 'unix' AND tz = 'UTC'") == 1
    assert count(conn, "jobs", "cron_dialect = 'seconds'") == 11  # every seconds6 line, 3 with '?' (= *)
    assert count(conn, "jobs", "cron_expr = '0 0 0 * * ?' AND cron_dialect = 'seconds'") == 1  # line 157


def test_corpus_import_uses_batched_transactions(conn) -> None:
    report = jobs.import_csv(conn, CORPUS, "corpus", batch_size=500)
    assert len(report.imported) == CORPUS_IMPORTED
    # Every row remembers the transaction that inserted it (xmin): 1,356 jobs
    # in batches of 500 are exactly three transactions, not one per row.
    rows = conn.execute(
        "SELECT xmin::text AS tx, count(*) AS n, count(DISTINCT created_at) AS stamps "
        "FROM jobs GROUP BY xmin::text ORDER BY count(*) DESC"
    ).fetchall()
    assert [r["n"] for r in rows] == [500, 500, 356]
    assert all(r["stamps"] == 1 for r in rows)  # one store clock reading per batch


def test_corpus_import_default_batches(conn, monkeypatch) -> None:
    calls = []
    real = store.run_transaction

    def run_transaction(c, body, **kwargs):
        calls.append(body)
        return real(c, body, **kwargs)

    monkeypatch.setattr(store, "run_transaction", run_transaction)
    report = jobs.import_csv(conn, CORPUS, "corpus")
    assert len(report.imported) == CORPUS_IMPORTED
    assert len(calls) == 2  # IMPORT_BATCH = 1,000: 1,000 + 356
    assert jobs.IMPORT_BATCH == 1_000


def test_import_reads_the_dialect_names_jobs_add_takes(conn, tmp_path) -> None:
    """The README's dialect column takes ``unix`` or ``seconds`` (the corpus's own
    ``unix5``/``seconds6`` too): ``seconds`` was read as unix, so a seconds-first line was
    refused with a hint to use dialect 'seconds' (a trial)."""
    path = tmp_path / "dialects.csv"
    path.write_text(
        "expr,dialect,timezone\n*/10 * * * * *,seconds,\n0 2 * * *,unix,\n*/5 * * * * *,seconds6,\n0 3 * * *,unix5,\n",
        encoding="utf-8",
    )
    report = jobs.import_csv(conn, path, "mine")
    assert report.rejected == []
    assert conn.execute("SELECT cron_expr, cron_dialect FROM jobs ORDER BY cron_expr").fetchall() == [
        {"cron_expr": "*/10 * * * * *", "cron_dialect": "seconds"},
        {"cron_expr": "*/5 * * * * *", "cron_dialect": "seconds"},
        {"cron_expr": "0 2 * * *", "cron_dialect": "unix"},
        {"cron_expr": "0 3 * * *", "cron_dialect": "unix"},
    ]


def test_import_reports_and_imports_a_small_file(conn, tmp_path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(
        "expr,dialect,timezone\n"
        "0 2 * * *,unix5,America/New_York\n"
        "*/60 * * * *,unix5,\n"
        '"0 22, 10 * * *",unix5,\n'
        "*/10 * * * * *,seconds6,\n"
        "0 9 * * *,unix5,EST\n",
        encoding="utf-8",
    )
    report = jobs.import_csv(conn, path, "mine")
    assert len(report.imported) == 2
    assert [(line, expr, reason.split(" (got")[0]) for line, expr, reason in report.rejected] == [
        (3, "*/60 * * * *", "cron: step 60 is larger than the minute field allows (at most 59)"),
        (
            4,
            "0 22, 10 * * *",
            "cron: 6 fields given, but the unix dialect takes 5 (minute hour day-of-month "
            "month day-of-week); for a seconds-first expression use dialect 'seconds'",
        ),
        # the CSV's column (timezone), not jobs add's --tz (a trial read "tz" as a column it lacked)
        (6, "0 9 * * *", "timezone: EST is a fixed-offset legacy zone; use America/New_York (with DST) or Etc/GMT+5"),
    ]
    got = {(r["cron_expr"], r["cron_dialect"], r["tz"]) for r in jobs.list_jobs(conn, "mine")}
    assert got == {("0 2 * * *", "unix", "America/New_York"), ("*/10 * * * * *", "seconds", "UTC")}


def test_import_refuses_a_bad_tenant_or_a_file_without_expr(conn, tmp_path) -> None:
    path = tmp_path / "no-expr.csv"
    path.write_text("schedule,zone\n0 2 * * *,UTC\n", encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        jobs.import_csv(conn, path, "mine")
    assert caught.value.field == "file"
    with pytest.raises(ValidationError) as caught:
        jobs.import_csv(conn, CORPUS, "bad tenant")
    assert caught.value.field == "tenant"
    assert count(conn, "jobs") == 0 and count(conn, "tenants") == 0


def test_import_reports_undecodable_and_unparsable_lines_and_imports_the_rest(conn, tmp_path) -> None:
    path = tmp_path / "messy.csv"
    path.write_bytes(
        b"expr,dialect,timezone,repo\n"
        b"0 1 * * *,unix5,,caf\xe9/latin-1 in a column the import does not use\n"
        b"0 2 * * \xff,unix5,,x\n"
        b"0 3 * * *,unix5,Europe/Z\xfcrich,x\n"
        b'"' + b"a" * 200_000 + b'",unix5,,x\n'
        b"0 4 * * *,unix5,,x\n"
    )
    report = jobs.import_csv(conn, path, "messy")
    assert report.rejected == [
        (3, "0 2 * * \udcff", "encoding: the line is not valid UTF-8"),
        (4, "0 3 * * *", "encoding: the line is not valid UTF-8"),
        (5, "", "csv: field larger than field limit (131072)"),
    ]
    assert len(report.imported) == 2
    assert sorted(r["cron_expr"] for r in jobs.list_jobs(conn, "messy")) == ["0 1 * * *", "0 4 * * *"]


# ------------------------------------------------------------- schedule keys


def keyed(conn: psycopg.Connection) -> dict[uuid.UUID, dict]:
    """Every job with its key, the key its columns give now, and the registered canonical text."""
    from scheduler.identity import SPEC_COLUMNS, identity_of

    rows = conn.execute(
        f"SELECT j.job_id, j.schedule_key, s.canonical, {', '.join('j.' + c for c in SPEC_COLUMNS)}"
        " FROM jobs AS j LEFT JOIN schedules AS s ON s.schedule_key = j.schedule_key"
    ).fetchall()
    return {r["job_id"]: {**r, "want": identity_of(r)} for r in rows}


def test_every_write_path_gives_a_job_the_key_of_its_spec(conn, tmp_path: Path) -> None:
    """add, add in bulk, import, replace (schedule, policy or nothing changed):
    each job's key is its current spec's, registered with its canonical text."""
    single = jobs.add_job(conn, JobSpec.build(tenant="acme", name="a", cron="0 0 * * 7", tz="Europe/Berlin")).job_id
    bulk = jobs.add_jobs(
        conn,
        [
            JobSpec.build(tenant="acme", cron="0 0 * * SUN", tz="Europe/Berlin"),
            JobSpec.build(tenant="acme", interval_s=60),
            JobSpec.build(tenant="acme", at=datetime(2031, 1, 1, tzinfo=UTC)),
            JobSpec.build(tenant="acme", cron="*/5 * * * *", jitter_s=10),
        ],
    )
    path = tmp_path / "corpus.csv"
    path.write_text("expr,timezone\n0 0 * * 0,Europe/Berlin\n15 3 * * 1-5,Asia/Kolkata\n")
    jobs.import_csv(conn, path, "acme")
    before = keyed(conn)
    assert len(before) == 7
    for row in before.values():
        assert row["schedule_key"] == row["want"].key and row["canonical"] == row["want"].canonical
    # Sundays at midnight in Berlin, spelled three ways: one key.
    assert len({before[single]["schedule_key"], before[bulk[0]]["schedule_key"]}) == 1
    assert len({r["schedule_key"] for r in before.values()}) == 5, sorted(r["canonical"] for r in before.values())

    for change in (
        {"cron": "0 0 * * 7", "tz": "Europe/Berlin", "misfire": "skip"},  # policy only: the slot is kept
        {"cron": "0 1 * * 7", "tz": "Europe/Berlin", "misfire": "skip"},  # the schedule
        {"cron": "0 1 * * 7", "tz": "Asia/Tokyo", "misfire": "skip", "jitter_s": 5},
    ):
        jobs.add_job(conn, JobSpec.build(tenant="acme", name="a", **change), replace=True)
        row = keyed(conn)[single]
        assert row["schedule_key"] == row["want"].key and row["canonical"] == row["want"].canonical, change
    jobs.set_paused(conn, single, True)
    jobs.set_paused(conn, single, False)
    row = keyed(conn)[single]
    assert row["schedule_key"] == row["want"].key
    assert len({r["schedule_key"] for r in keyed(conn).values()}) == 6  # a new one for "a"
