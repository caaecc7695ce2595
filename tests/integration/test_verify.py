"""``verify`` finds every break of docs/design.md §8 (scheduler/audit.py, scheduler/oracle.py).

Each scenario is written into the store with plain SQL (jobs, job_revisions,
runs, skips), so the audit is tested on exactly the rows it reads, whatever
the write paths do: an early run, an invalid skip, a job edited, paused or
deleted inside the window (audited revision by revision), an expected slot
the independent oracle disagrees with (``--exhaustive``), and the bounded
lists of findings in ``--json``. Windows lie in the past of the store's
clock (hours back, whole minutes), so nothing fires concurrently.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from click.testing import CliRunner

from scheduler import audit
from scheduler.cli import cli
from scheduler.partition import partition_of
from scheduler.planner import scheduled_time
from scheduler.schedule import CronSchedule, format_instant

MINUTE = timedelta(minutes=1)
UTC = UTC


def run_cli(args: list[str], dsn: str):
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def window_base(conn: psycopg.Connection) -> datetime:
    """A whole hour at least three hours before the store's now."""
    now = conn.execute("SELECT now() AS n").fetchone()["n"]
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)


def insert_job(
    conn: psycopg.Connection,
    *,
    created_at: datetime,
    cron: str | None = None,
    tz: str = "UTC",
    interval_s: int | None = None,
    misfire: str = "all",
    catchup_window_s: int = 86_400,
    misfire_grace_s: int = 60,
    jitter_s: int = 0,
    paused: bool = False,
    revision: int = 1,
    changed_at: datetime | None = None,
    deleted_at: datetime | None = None,
    job_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """A ``jobs`` row as the write paths would leave it (next slot not used by the audit)."""
    job_id = job_id or uuid.uuid4()
    conn.execute("INSERT INTO tenants (tenant) VALUES ('acme') ON CONFLICT (tenant) DO NOTHING")
    conn.execute(
        "INSERT INTO jobs (partition_id, job_id, tenant, kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, "
        "misfire, catchup_window_s, misfire_grace_s, jitter_s, paused, revision, created_at, changed_at, "
        "deleted_at) VALUES (%(p)s, %(j)s, 'acme', %(kind)s, %(cron)s, %(dialect)s, %(tz)s, %(interval)s, "
        "%(anchor)s, %(misfire)s, %(cw)s, %(grace)s, %(jitter)s, %(paused)s, %(revision)s, %(created)s, "
        "%(changed)s, %(deleted)s)",
        {
            "p": partition_of(job_id),
            "j": job_id,
            "kind": "cron" if cron else "interval",
            "cron": cron,
            "dialect": "unix" if cron else None,
            "tz": tz if cron else None,
            "interval": interval_s,
            "anchor": None if cron else created_at.replace(microsecond=0),
            "misfire": misfire,
            "cw": catchup_window_s,
            "grace": misfire_grace_s,
            "jitter": jitter_s,
            "paused": paused,
            "revision": revision,
            "created": created_at,
            "changed": changed_at or created_at,
            "deleted": deleted_at,
        },
    )
    return job_id


def insert_revision(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    revision: int,
    valid_from: datetime,
    valid_until: datetime,
    *,
    cron: str,
    tz: str = "UTC",
    misfire: str = "all",
    catchup_window_s: int = 86_400,
    misfire_grace_s: int = 60,
    jitter_s: int = 0,
    paused: bool = False,
) -> None:
    """A superseded revision of a cron job, as jobs.py copies it on a rewrite (migration 0013)."""
    conn.execute(
        "INSERT INTO job_revisions (partition_id, job_id, revision, valid_from, valid_until, tenant, kind, "
        "cron_expr, cron_dialect, tz, misfire, catchup_window_s, misfire_grace_s, jitter_s, paused) "
        "VALUES (%(p)s, %(j)s, %(r)s, %(f)s, %(u)s, 'acme', 'cron', %(cron)s, 'unix', %(tz)s, %(misfire)s, "
        "%(cw)s, %(grace)s, %(jitter)s, %(paused)s)",
        {
            "p": partition_of(job_id),
            "j": job_id,
            "r": revision,
            "f": valid_from,
            "u": valid_until,
            "cron": cron,
            "tz": tz,
            "misfire": misfire,
            "cw": catchup_window_s,
            "grace": misfire_grace_s,
            "jitter": jitter_s,
            "paused": paused,
        },
    )


def insert_run(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    nominal: datetime,
    *,
    scheduled: datetime | None = None,
    fired: datetime | None = None,
) -> None:
    scheduled = nominal if scheduled is None else scheduled
    conn.execute(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch) "
        "VALUES (%s, %s, %s, 'acme', %s, %s, 'n1', 1)",
        (partition_of(job_id), job_id, nominal, scheduled, fired or scheduled + timedelta(milliseconds=300)),
    )


def insert_skip(
    conn: psycopg.Connection, job_id: uuid.UUID, first: datetime, until: datetime, reason: str, recorded_at: datetime
) -> None:
    conn.execute(
        "INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots, reason, recorded_at, "
        "node_id, epoch) VALUES (%s, %s, %s, %s, NULL, %s, %s, 'n1', 1)",
        (partition_of(job_id), job_id, first, until, reason, recorded_at),
    )


def every(start: datetime, step: timedelta, count: int) -> list[datetime]:
    return [start + step * k for k in range(count)]


def pair(job_id: uuid.UUID, nominal: datetime) -> dict:
    return {"job_id": str(job_id), "nominal_time": format_instant(nominal)}


# ---------------------------------------------------------------- early runs


def test_an_early_run_fails_verify(pg_dsn, conn) -> None:
    """A run fired before its scheduled time is counted as early, whether the stored
    scheduled_at says so or the stored value is itself wrong (jitter recomputed)."""
    base = window_base(conn)
    plain = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *")
    for slot in every(base, 10 * MINUTE, 6):
        insert_run(conn, plain, slot, fired=slot - timedelta(seconds=2) if slot == base + 20 * MINUTE else None)
    jittered = insert_job(conn, created_at=base - MINUTE, cron="*/30 * * * *", jitter_s=600)
    late = [s for s in every(base, 30 * MINUTE, 2) if scheduled_time(jittered, s, 600) - s > timedelta(seconds=5)]
    for slot in every(base, 30 * MINUTE, 2):
        if slot == late[0]:  # stored as if it had no jitter, fired 1 s after the nominal time
            insert_run(conn, jittered, slot, scheduled=slot, fired=slot + timedelta(seconds=1))
        else:
            insert_run(conn, jittered, slot, scheduled=scheduled_time(jittered, slot, 600))

    result = run_cli(
        ["verify", "--since", format_instant(base), "--until", format_instant(base + 60 * MINUTE), "--json"], pg_dsn
    )
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["expected"], report["runs"], report["missing"], report["unexpected"], report["early"]) == (
        8,
        8,
        0,
        0,
        2,
    )
    early = report["findings"]["early"]
    assert sorted((e["job_id"], e["nominal_time"], e["scheduled_at"], e["fired_at"]) for e in early) == sorted(
        [
            (
                str(plain),
                format_instant(base + 20 * MINUTE),
                format_instant(base + 20 * MINUTE),
                format_instant(base + 20 * MINUTE - timedelta(seconds=2)),
            ),
            (
                str(jittered),
                format_instant(late[0]),
                format_instant(scheduled_time(jittered, late[0], 600)),
                format_instant(late[0] + timedelta(seconds=1)),
            ),
        ]
    )
    text = run_cli(["verify", "--since", format_instant(base), "--until", format_instant(base + 60 * MINUTE)], pg_dsn)
    assert text.exit_code == 1
    assert "early: 2" in text.stdout.splitlines()
    assert "FAILED: 2 early" in text.stdout


# ---------------------------------------------------------------- skips checked against the policy


def test_a_once_skip_on_a_misfire_all_job_that_was_never_overdue_is_invalid(pg_dsn, conn) -> None:
    base = window_base(conn)
    job = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *")
    slots = every(base, 10 * MINUTE, 6)
    for slot in slots:
        if slot != slots[2]:
            insert_run(conn, job, slot)
    # The run of slots[2] "replaced" by a skip recorded one second after its nominal time.
    insert_skip(conn, job, slots[2], slots[3], "once", slots[2] + timedelta(seconds=1))
    report = audit.verify(conn, base, base + 60 * MINUTE)
    assert (report.expected, report.runs, report.skips_invalid, report.missing, report.skipped) == (6, 5, 1, 1, 0)
    assert not report.ok
    assert report.findings["skips_invalid"] == [
        {
            "job_id": str(job),
            "first_nominal": format_instant(slots[2]),
            "until_nominal": format_instant(slots[3]),
            "reason": "once",
            "recorded_at": format_instant(slots[2] + timedelta(seconds=1)),
            "rule": "reason once needs misfire once (the job's policy was all)",
        }
    ]
    assert report.findings["missing"] == [pair(job, slots[2]) | {"scheduled_at": format_instant(slots[2])}]


def test_each_skip_reason_is_checked_against_its_rule(pg_dsn, conn) -> None:
    """Valid skips account for their slots; each invalid one is listed with the rule it breaks."""
    base = window_base(conn)
    slots = every(base, 10 * MINUTE, 6)
    at = timedelta(seconds=1)

    def job_missing_one(**kwargs) -> uuid.UUID:
        job = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *", **kwargs)
        for slot in slots:
            if slot != slots[1]:
                insert_run(conn, job, slot)
        return job

    valid, invalid = {}, {}
    # catchup_window (misfire all): the slot older than recorded_at - catchup_window_s
    valid["catchup"] = job_missing_one(catchup_window_s=300)
    insert_skip(conn, valid["catchup"], slots[1], slots[2], "catchup_window", slots[1] + 301 * at)
    invalid["catchup"] = job_missing_one(catchup_window_s=300)
    insert_skip(conn, invalid["catchup"], slots[1], slots[2], "catchup_window", slots[1] + 299 * at)
    # grace (misfire skip): scheduled more than misfire_grace_s before recorded_at
    valid["grace"] = job_missing_one(misfire="skip", misfire_grace_s=60)
    insert_skip(conn, valid["grace"], slots[1], slots[2], "grace", slots[1] + 61 * at)
    invalid["grace"] = job_missing_one(misfire="skip", misfire_grace_s=60)
    insert_skip(conn, invalid["grace"], slots[1], slots[2], "grace", slots[1] + 60 * at)
    # once: past the grace, and the collapsed run carries until_nominal (slots[2] has a run)
    valid["once"] = job_missing_one(misfire="once", misfire_grace_s=60)
    insert_skip(conn, valid["once"], slots[1], slots[2], "once", slots[2] + 2 * at)
    invalid["once"] = job_missing_one(misfire="once", misfire_grace_s=60)  # no run at until_nominal
    insert_skip(conn, invalid["once"], slots[1], slots[1] + 5 * MINUTE, "once", slots[1] + 5 * MINUTE + 2 * at)
    # an unknown reason
    invalid["unknown"] = job_missing_one()
    insert_skip(conn, invalid["unknown"], slots[1], slots[2], "operator", slots[1] + 2 * at)
    # edited: recorded at a rewrite (job_revisions.valid_until), slots not after it
    edit = slots[1] + 30 * at
    valid["edited"] = job_missing_one(revision=2, changed_at=edit)
    insert_revision(conn, valid["edited"], 1, base - MINUTE, edit, cron="*/10 * * * *", misfire="skip")
    insert_skip(conn, valid["edited"], slots[1], slots[2], "edited", edit)
    invalid["edited"] = job_missing_one()  # no rewrite at recorded_at
    insert_skip(conn, invalid["edited"], slots[1], slots[2], "edited", edit)

    report = audit.verify(conn, base, base + 60 * MINUTE)
    assert (report.expected, report.runs, report.skipped, report.missing, report.skips_invalid) == (54, 45, 4, 5, 5)
    rules = {row["job_id"]: row["rule"] for row in report.findings["skips_invalid"]}
    assert rules == {
        str(invalid["catchup"]): "a slot in the range was not older than the catch-up window at recorded_at",
        str(invalid["grace"]): "a slot in the range was not past the misfire grace at recorded_at",
        str(invalid["once"]): "no run at until_nominal (where the collapsed run belongs)",
        str(invalid["unknown"]): "unknown reason",
        str(invalid["edited"]): "no rewrite of the job (job_revisions.valid_until) at recorded_at",
    }
    # A slot covered only by an invalid skip is not accounted for: it is missing.
    assert sorted(row["job_id"] for row in report.findings["missing"]) == sorted(str(j) for j in invalid.values())


def test_a_skip_over_a_slot_that_fired_is_invalid(pg_dsn, conn) -> None:
    """A slot cannot be both fired and skipped: a skip whose range holds a run of
    its job is invalid whatever its reason, even one recorded late enough to
    pass its policy's rule."""
    base = window_base(conn)
    slots = every(base, 10 * MINUTE, 6)
    job = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *", misfire="skip", misfire_grace_s=60)
    for slot in slots:
        insert_run(conn, job, slot)
    insert_skip(conn, job, slots[1], slots[2], "grace", slots[1] + 2 * MINUTE)

    report = audit.verify(conn, base, base + 60 * MINUTE)

    assert (report.expected, report.runs, report.missing, report.skips_invalid, report.ok) == (6, 6, 0, 1, False)
    [finding] = report.findings["skips_invalid"]
    assert finding["rule"] == "a run exists in the range (the slot fired and was skipped)"


# ---------------------------------------------------------------- edited, paused and deleted jobs


def test_an_edited_job_is_audited_up_to_and_from_the_edit(pg_dsn, conn) -> None:
    """Runs of the old spec before the edit and of the new spec after it: nothing missing or
    unexpected; a slot of the old spec lost before the edit is missing."""
    base = window_base(conn)
    edit = base + 30 * MINUTE + timedelta(seconds=5)
    job = insert_job(conn, created_at=base - MINUTE, cron="*/15 * * * *", revision=2, changed_at=edit)
    insert_revision(conn, job, 1, base - MINUTE, edit, cron="*/10 * * * *")
    old = every(base, 10 * MINUTE, 4)  # 00, 10, 20, 30 (the 30 is before the edit at 30:05)
    new = [base + 45 * MINUTE]  # the new spec's slots strictly after the edit
    for slot in old + new:
        insert_run(conn, job, slot)
    since, until = base, base + 60 * MINUTE

    report = audit.verify(conn, since, until)
    assert (
        report.expected,
        report.runs,
        report.missing,
        report.unexpected,
        report.jobs_audited,
        report.jobs_excluded,
    ) == (5, 5, 0, 0, 1, 0), report
    assert report.ok

    conn.execute("DELETE FROM runs WHERE job_id = %s AND nominal_time = %s", (job, base + 10 * MINUTE))
    report = audit.verify(conn, since, until)
    assert (report.expected, report.runs, report.missing, report.unexpected) == (5, 4, 1, 0)
    assert report.findings["missing"] == [
        pair(job, base + 10 * MINUTE) | {"scheduled_at": format_instant(base + 10 * MINUTE)}
    ]
    # A run of the new spec's schedule before the edit is not a slot of the spec then in force.
    insert_run(conn, job, base + 15 * MINUTE)
    report = audit.verify(conn, since, until)
    assert (report.unexpected, report.findings["unexpected"]) == (
        1,
        [
            pair(job, base + 15 * MINUTE)
            | {"fired_at": format_instant(base + 15 * MINUTE + timedelta(milliseconds=300))}
        ],
    )


def test_an_edit_that_keeps_the_schedule_continues_it_seamlessly(pg_dsn, conn) -> None:
    """A policy-only edit at the very instant of a slot: the slot is still expected (the new
    revision continues the old schedule), its run is not unexpected."""
    base = window_base(conn)
    edit = base + 20 * MINUTE
    job = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *", misfire="skip", revision=2, changed_at=edit)
    insert_revision(conn, job, 1, base - MINUTE, edit, cron="*/10 * * * *")
    for slot in every(base, 10 * MINUTE, 6):
        insert_run(conn, job, slot)
    report = audit.verify(conn, base, base + 60 * MINUTE)
    assert (report.expected, report.runs, report.missing, report.unexpected) == (6, 6, 0, 0)


def test_a_paused_job_is_audited_up_to_the_pause_and_a_deleted_one_up_to_its_deletion(pg_dsn, conn) -> None:
    base = window_base(conn)
    pause = base + 25 * MINUTE
    paused = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *", paused=True, revision=2, changed_at=pause)
    insert_revision(conn, paused, 1, base - MINUTE, pause, cron="*/10 * * * *")
    deleted = insert_job(
        conn,
        created_at=base - MINUTE,
        cron="*/10 * * * *",
        revision=2,
        changed_at=base + 35 * MINUTE,
        deleted_at=base + 35 * MINUTE,
    )
    insert_revision(conn, deleted, 1, base - MINUTE, base + 35 * MINUTE, cron="*/10 * * * *")
    for slot in every(base, 10 * MINUTE, 3):
        insert_run(conn, paused, slot)
    for slot in every(base, 10 * MINUTE, 3):  # the 30 of the deleted job is missing
        insert_run(conn, deleted, slot)
    since, until = base, base + 60 * MINUTE

    report = audit.verify(conn, since, until)
    assert (report.expected, report.runs, report.missing, report.unexpected, report.jobs_audited) == (7, 6, 1, 0, 2), (
        report
    )
    assert report.findings["missing"] == [
        pair(deleted, base + 30 * MINUTE) | {"scheduled_at": format_instant(base + 30 * MINUTE)}
    ]
    # A run while paused is unexpected.
    insert_run(conn, paused, base + 40 * MINUTE)
    report = audit.verify(conn, since, until)
    assert (report.unexpected, [u["nominal_time"] for u in report.findings["unexpected"]]) == (
        1,
        [format_instant(base + 40 * MINUTE)],
    )


def test_a_job_rewritten_before_revisions_were_kept_is_audited_from_its_rewrite(pg_dsn, conn) -> None:
    """No job_revisions row for revision 1: what the job was before changed_at is unknown,
    so only slots and runs after it are audited, and the job counts in jobs_excluded."""
    base = window_base(conn)
    job = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *", revision=2, changed_at=base + 25 * MINUTE)
    insert_run(conn, job, base + 5 * MINUTE)  # whatever fired before the rewrite is not judged
    for slot in every(base + 30 * MINUTE, 10 * MINUTE, 3):
        insert_run(conn, job, slot)
    report = audit.verify(conn, base, base + 60 * MINUTE)
    assert (
        report.expected,
        report.runs,
        report.missing,
        report.unexpected,
        report.jobs_audited,
        report.jobs_excluded,
    ) == (3, 3, 0, 0, 0, 1)


# ---------------------------------------------------------------- the independent oracle


def test_exhaustive_finds_slots_the_schedule_code_gets_wrong(pg_dsn, conn, monkeypatch) -> None:
    """Runs fired by a broken schedule (it drops minute 30) pass the ordinary audit, which
    uses the same code; --exhaustive recomputes the slots independently and fails."""
    real = CronSchedule.next_after

    def broken(self, instant):
        fire = real(self, instant)
        return real(self, fire) if fire is not None and fire.minute == 30 else fire

    monkeypatch.setattr(CronSchedule, "next_after", broken)
    base = window_base(conn)
    job = insert_job(conn, created_at=base - MINUTE, cron="*/10 * * * *")
    fired = []
    slot = CronSchedule("*/10 * * * *").next_after(base - timedelta(microseconds=1))
    while slot < base + 60 * MINUTE:
        insert_run(conn, job, slot)
        fired.append(slot)
        slot = CronSchedule("*/10 * * * *").next_after(slot)
    assert base + 30 * MINUTE not in fired and len(fired) == 5
    args = ["verify", "--since", format_instant(base), "--until", format_instant(base + 60 * MINUTE), "--json"]

    plain = run_cli(args, pg_dsn)
    assert plain.exit_code == 0, plain.stdout
    assert json.loads(plain.stdout)["expected_disagreements"] is None  # not checked without --exhaustive

    result = run_cli([*args, "--exhaustive"], pg_dsn)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert (report["expected"], report["missing"], report["expected_disagreements"]) == (5, 0, 1)
    assert report["findings"]["expected_disagreements"] == [pair(job, base + 30 * MINUTE) | {"only_in": "oracle"}]


def test_exhaustive_agrees_on_a_fall_back_day_and_refuses_windows_too_big_to_enumerate(pg_dsn, conn) -> None:
    """New York falls back on 2026-11-01 (06:00Z): a fixed-time 01:30 fires once, a
    wildcard-minute job in both passes of 01:xx; the oracle agrees slot for slot."""
    base = datetime(2026, 11, 1, tzinfo=UTC)
    fixed = insert_job(conn, created_at=base - MINUTE, cron="30 1 * * *", tz="America/New_York")
    wildcard = insert_job(conn, created_at=base - MINUTE, cron="*/20 1 * * *", tz="America/New_York", jitter_s=20)
    insert_job(conn, created_at=base - MINUTE, interval_s=3_600)
    report = audit.verify(conn, base, base + timedelta(hours=24), exhaustive=True)
    assert (report.expected_disagreements, report.unexpected, report.expected, report.missing) == (0, 0, 31, 31)
    missing = {(row["job_id"], row["nominal_time"]) for row in report.findings["missing"]}
    assert {t for j, t in missing if j == str(fixed)} == {"2026-11-01T05:30:00Z"}
    assert sorted(t for j, t in missing if j == str(wildcard)) == [
        f"2026-11-01T0{h}:{m}:00Z" for h in (5, 6) for m in ("00", "20", "40")
    ]

    # Two every-second schedules over 30 days: 2 x 33 local days x 86,400 s to test.
    conn.execute(
        "UPDATE jobs SET cron_expr = '* * * * * *', cron_dialect = 'seconds', "
        "tz = CASE WHEN job_id = %s THEN 'UTC' ELSE tz END WHERE kind = 'cron'",
        (fixed,),
    )
    with pytest.raises(audit.ValidationError) as raised:
        audit.verify(conn, base, base + timedelta(days=30), exhaustive=True)
    assert raised.value.field == "exhaustive"
    assert "audit a shorter window" in raised.value.rule


def test_exhaustive_on_the_real_corpus_audits_a_short_window(pg_dsn, conn) -> None:
    """1,356 distinct real schedules: a one-hour window costs their matching wall
    times of three local days each, not three whole days of minutes each (which
    refused even a one-second window)."""
    from pathlib import Path

    from scheduler import jobs

    corpus = Path(__file__).resolve().parents[2] / "scheduler" / "data" / "cron-corpus.csv"
    report = jobs.import_csv(conn, corpus, "corpus")
    assert len(report.imported) == 1356
    since = conn.execute("SELECT date_trunc('hour', now()) - interval '2 hours' AS t").fetchone()["t"]
    conn.execute("UPDATE jobs SET created_at = %(t)s, changed_at = %(t)s", {"t": since - timedelta(days=1)})
    result = audit.verify(conn, since, since + timedelta(hours=1), exhaustive=True)
    assert result.expected_disagreements == 0
    assert result.expected > 0 and result.missing == result.expected  # no node ran: every slot missing


# ---------------------------------------------------------------- bounded lists


def test_json_lists_findings_bounded_with_totals(pg_dsn, conn) -> None:
    base = window_base(conn)
    job = insert_job(conn, created_at=base - MINUTE, cron="* * * * *")
    for slot in every(base, MINUTE, 60)[50:]:
        insert_run(conn, job, slot)
    for second in (10, 20, 30):  # three runs at instants the schedule does not produce
        insert_run(conn, job, base + timedelta(seconds=second))
    args = ["verify", "--since", format_instant(base), "--until", format_instant(base + 60 * MINUTE), "--json"]
    report = json.loads(run_cli([*args, "--list-limit", "4"], pg_dsn).stdout)
    assert (report["missing"], report["unexpected"], report["findings_limit"]) == (50, 3, 4)
    assert report["findings"]["missing"] == [
        pair(job, slot) | {"scheduled_at": format_instant(slot)} for slot in every(base, MINUTE, 4)
    ]
    assert [u["nominal_time"] for u in report["findings"]["unexpected"]] == [
        format_instant(base + timedelta(seconds=s)) for s in (10, 20, 30)
    ]
    assert (report["findings"]["early"], report["findings"]["duplicates"], report["findings"]["skips_invalid"]) == (
        [],
        [],
        [],
    )
    default = json.loads(run_cli(args, pg_dsn).stdout)
    assert (default["findings_limit"], len(default["findings"]["missing"])) == (100, 50)
    text = run_cli(args[:-1], pg_dsn)
    assert "FAILED: 50 missing, 3 unexpected" in text.stdout
    lines = text.stdout.splitlines()
    assert f"  missing {job} {format_instant(base)} scheduled_at={format_instant(base)}" in lines
    assert "  ... 40 more missing (--json lists up to --list-limit)" in lines


def test_the_slot_expansion_is_planned_on_analyzed_working_tables(conn, monkeypatch) -> None:
    """Temporary tables get no statistics from autovacuum: verify analyzes the
    revisions and the schedules' slots before joining them (unanalyzed, a
    5 M-job store with 1,000 distinct schedules was joined by a nested loop
    for over 9 minutes; measured by bench herd --distinct-schedules)."""
    from helpers import record_named_queries

    from scheduler import jobs, store
    from scheduler.spec import JobSpec

    jobs.add_job(conn, JobSpec.build(tenant="acme", cron="* * * * *"))
    sent = record_named_queries(monkeypatch)
    now = store.now(conn)
    audit.verify(conn, now - timedelta(minutes=5), now)
    names = [name for name, _ in sent]
    assert "analyze_audit_slots" in names
    assert names.index("analyze_audit_slots") < names.index("expand_audit_cron_slots")
