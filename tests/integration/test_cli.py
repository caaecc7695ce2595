"""The ``scheduler`` command line (scheduler/cli.py) against a real store.

Most commands run in process through ``click.testing.CliRunner`` (stdout and
stderr apart, exit status as the process would return it); a few run the
installed console script (``.venv/bin/scheduler``) as a subprocess to pin
the real exit status and the one-line error on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner
from helpers import RUNS_LIST_COLUMNS, OneNode, cron_cases, store_now

from scheduler import audit, jobs, migrate, store
from scheduler.cli import FlagNamedOption, cli
from scheduler.planner import scheduled_time
from scheduler.schedule import format_instant
from scheduler.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("scheduler")
CASES = {case["id"]: case for case in cron_cases()}
CORPUS = REPO / "scheduler" / "data" / "cron-corpus.csv"
VERIFY_KEYS = {
    "expected",
    "runs",
    "missing",
    "duplicates",
    "unexpected",
    "early",
    "skips_invalid",
    "expected_disagreements",
    "jobs_excluded",
    "lateness_p50_s",
    "lateness_p99_s",
    "lateness_max_s",
    "findings",
    "findings_limit",
}


def run(args: list[str], dsn: str | None = None):
    """Invoke the CLI in process; no SCHEDULER_* variable leaks in from the environment."""
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    if dsn is not None:
        env["SCHEDULER_DSN"] = dsn
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def one_line_error(result, status: int, prefix: str) -> str:
    assert result.exit_code == status, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    assert result.stdout == ""
    return lines[0]


# ---------------------------------------------------------------- jobs next (no store)


@pytest.mark.parametrize("case_id", ["C01", "C02", "C11", "C20", "C44"])
def test_jobs_next_prints_the_exact_instants_of_known_cases(case_id: str) -> None:
    case = CASES[case_id]
    expected = case["expected_next"]
    result = run(
        [
            "jobs",
            "next",
            "--cron",
            case["expr"],
            "--tz",
            case["tz"],
            "--after",
            case["start"],
            "--count",
            str(len(expected)),
        ]
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == expected
    assert result.stderr == ""


def test_jobs_next_says_when_the_supported_range_ends_first() -> None:
    result = run(["jobs", "next", "--cron", "0 0 29 2 *", "--after", "9990-01-01T00:00:00Z", "--count", "3"])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["9992-02-29T00:00:00Z", "9996-02-29T00:00:00Z"]
    assert result.stderr == "no further fire before the end of the supported range (year 9997)\n"


def test_jobs_next_seconds_dialect_and_default_count() -> None:
    result = run(
        ["jobs", "next", "--cron", "*/20 * * * * *", "--dialect", "seconds", "--after", "2030-01-01T00:00:00Z"]
    )
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "2030-01-01T00:00:20Z",
        "2030-01-01T00:00:40Z",
        "2030-01-01T00:01:00Z",
        "2030-01-01T00:01:20Z",
        "2030-01-01T00:01:40Z",
    ]


def test_jobs_next_without_after_lists_the_fires_after_now(monkeypatch) -> None:
    """As ``GET /v1/explain``: no ``--after`` is the local clock's now (it was a required option)."""
    import scheduler.cli

    monkeypatch.setattr(scheduler.cli, "_utc_now", lambda: datetime.fromisoformat("2030-05-06T07:08:09.5+00:00"))
    result = run(["jobs", "next", "--cron", "*/20 * * * *", "--count", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["2030-05-06T07:20:00Z", "2030-05-06T07:40:00Z", "2030-05-06T08:00:00Z"]
    assert "--after" in run(["jobs", "next", "--help"]).stdout
    assert "(default: now" in " ".join(run(["jobs", "next", "--help"]).stdout.split())


def test_worker_help_names_every_field_of_the_handlers_run() -> None:
    """The handler gets a :class:`scheduler.delivery.worker.Run`: ``--help`` names its fields exactly."""
    import dataclasses

    from scheduler.delivery.worker import Run

    result = run(["worker", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for name in [f.name for f in dataclasses.fields(Run)]:
        assert f" {name} (" in text or f" {name}:" in text, name


def test_jobs_next_spring_day_rule_question_mark_and_step_7() -> None:
    # The seconds dialect combines the day fields with AND (Friday the 13th) ...
    friday_13 = run(
        [
            "jobs",
            "next",
            "--cron",
            "0 0 0 13 * FRI",
            "--dialect",
            "seconds",
            "--after",
            "2024-01-01T00:00:00Z",
            "--count",
            "2",
        ]
    )
    assert (friday_13.exit_code, friday_13.stdout) == (0, "2024-09-13T00:00:00Z\n2024-12-13T00:00:00Z\n")
    # ... the unix dialect with OR (every 13th, and every Friday).
    unix = run(["jobs", "next", "--cron", "0 0 13 * FRI", "--after", "2024-01-01T00:00:00Z", "--count", "3"])
    assert (unix.exit_code, unix.stdout) == (0, "2024-01-05T00:00:00Z\n2024-01-12T00:00:00Z\n2024-01-13T00:00:00Z\n")
    # '?' is '*' in a day field; '*/7' in day-of-week is Sunday.
    christmas = run(
        [
            "jobs",
            "next",
            "--cron",
            "0 0 0 25 12 ?",
            "--dialect",
            "seconds",
            "--after",
            "2024-01-01T00:00:00Z",
            "--count",
            "1",
        ]
    )
    assert (christmas.exit_code, christmas.stdout) == (0, "2024-12-25T00:00:00Z\n")
    sundays = run(["jobs", "next", "--cron", "0 0 * * */7", "--after", "2024-01-01T00:00:00Z", "--count", "2"])
    assert (sundays.exit_code, sundays.stdout) == (0, "2024-01-07T00:00:00Z\n2024-01-14T00:00:00Z\n")


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (
            ["--cron", "0 0 0 L-3 * *", "--dialect", "seconds", "--after", "2030-01-01T00:00:00Z"],
            "error: cron: 'L-3' (n days before the last day of the month) is not supported",
        ),
        (
            ["--cron", "? * * * *", "--after", "2030-01-01T00:00:00Z"],
            "error: cron: '?' (no specific value, = *) is only allowed as a whole day-of-month or day-of-week field",
        ),
        (
            ["--cron", "*/60 * * * *", "--after", "2030-01-01T00:00:00Z"],
            "error: cron: step 60 is larger than the minute field allows (at most 59)",
        ),
        (["--cron", "0 0 31 2 *", "--after", "2030-01-01T00:00:00Z"], "error: cron: the expression never fires"),
        (["--cron", "0 0 * * *", "--after", "2030-01-01T00:00:00"], "error: after: instant has no UTC offset"),
        (["--cron", "0 0 * * *", "--after", "tomorrow"], "error: after: not an ISO 8601 instant"),
        (["--after", "2030-01-01T00:00:00Z"], "error: cron: is required"),
        (["--cron", "0 0 * * *", "--tz", "EST", "--after", "2030-01-01T00:00:00Z"], "error: tz: EST"),
    ],
)
def test_jobs_next_bad_input_exits_2_with_one_line(args: list[str], prefix: str) -> None:
    one_line_error(run(["jobs", "next", *args]), 2, prefix)


def test_console_script_exit_status_and_one_line_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    good = subprocess.run(
        [
            str(SCRIPT),
            "jobs",
            "next",
            "--cron",
            "30 2 * * *",
            "--tz",
            "America/New_York",
            "--after",
            "2021-03-13T12:00:00-05:00",
            "--count",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (good.returncode, good.stderr) == (0, "")
    assert good.stdout.splitlines() == CASES["C02"]["expected_next"]
    bad = subprocess.run(
        [str(SCRIPT), "jobs", "next", "--cron", "*/60 * * * *", "--after", "2030-01-01T00:00:00Z"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr == (
        "error: cron: step 60 is larger than the minute field allows (at most 59) (got '*/60 * * * *')\n"
    )


# ---------------------------------------------------------------- jobs add / list / show / pause / delete


def test_jobs_add_refuses_jitter_not_below_the_gap_between_slots(pg_dsn, conn) -> None:
    # Exit 2, one line naming jitter, nothing written (issue 11, item 2).
    line = one_line_error(
        run(["jobs", "add", "--tenant", "acme", "--interval", "60", "--jitter", "300"], pg_dsn), 2, "error: jitter: "
    )
    assert line == (
        "error: jitter: must be smaller than the smallest gap between slots (60 s for this schedule) (got 300)"
    )
    line = one_line_error(
        run(
            [
                "jobs",
                "add",
                "--tenant",
                "acme",
                "--cron",
                "30 1,2 * * *",
                "--tz",
                "America/New_York",
                "--jitter",
                "1800",
            ],
            pg_dsn,
        ),
        2,
        "error: jitter: ",
    )
    assert line == (
        "error: jitter: must be smaller than the smallest gap between slots "
        "(1800 s for this schedule, at a UTC-offset change of America/New_York) (got 1800)"
    )
    assert conn.execute("SELECT count(*) AS c FROM jobs").fetchone()["c"] == 0
    accepted = run(["jobs", "add", "--tenant", "acme", "--interval", "60", "--jitter", "59"], pg_dsn)
    assert accepted.exit_code == 0, accepted.stderr
    assert jobs.get_job(conn, uuid.UUID(accepted.stdout.strip()))["jitter_s"] == 59


def test_jobs_add_prints_the_id_of_the_stored_job(pg_dsn, conn) -> None:
    result = run(
        [
            "jobs",
            "add",
            "--tenant",
            "acme",
            "--cron",
            "0 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--name",
            "nightly",
            "--misfire",
            "once",
            "--jitter",
            "20",
        ],
        pg_dsn,
    )
    assert result.exit_code == 0, result.stderr
    job_id = uuid.UUID(result.stdout.strip())
    assert result.stdout == f"{job_id}\n"
    row = jobs.get_job(conn, job_id)
    assert (row["tenant"], row["name"], row["cron_expr"], row["tz"], row["misfire"], row["jitter_s"]) == (
        "acme",
        "nightly",
        "0 2 * * *",
        "Europe/Berlin",
        "once",
        20,
    )

    again = run(
        [
            "jobs",
            "add",
            "--tenant",
            "acme",
            "--cron",
            "0 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--name",
            "nightly",
            "--misfire",
            "once",
            "--jitter",
            "20",
        ],
        pg_dsn,
    )
    assert (again.exit_code, again.stdout, again.stderr) == (0, f"{job_id}\n", "(exists)\n")

    conflict = run(["jobs", "add", "--tenant", "acme", "--cron", "0 3 * * *", "--name", "nightly"], pg_dsn)
    line = one_line_error(conflict, 2, "error: name: ")
    assert str(job_id) in line and "--replace" in line

    replaced = run(["jobs", "add", "--tenant", "acme", "--cron", "0 3 * * *", "--name", "nightly", "--replace"], pg_dsn)
    assert (replaced.exit_code, replaced.stdout, replaced.stderr) == (0, f"{job_id}\n", "(replaced)\n")
    assert jobs.get_job(conn, job_id)["cron_expr"] == "0 3 * * *"
    assert conn.execute("SELECT count(*) AS c FROM jobs").fetchone()["c"] == 1


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["--cron", "*/60 * * * *"], "error: cron: step 60 is larger than the minute field allows (at most 59)"),
        (["--cron", "0 0 31 2 *"], "error: cron: the expression never fires"),
        (["--cron", "* * * * *", "--tz", "Mars/Base"], "error: tz: not an IANA time zone name"),
        (["--interval", "0"], "error: interval: must be positive"),
        (["--interval", "1.5"], "error: interval: must be a whole number of seconds"),
        (["--at", "2030-01-01T09:00:00"], "error: at: instant has no UTC offset"),
        (["--at", "2001-01-01T09:00:00Z"], "error: at: must be in the future"),
        (
            ["--interval", "60", "--misfire", "sometimes"],
            "error: misfire: must be one of all, once, skip (got 'sometimes')",
        ),
        (["--interval", "60", "--replace"], "error: replace: needs --name"),
        ([], "error: schedule: give exactly one of --cron, --interval or --at"),
        (["--interval", "60", "--name", "a/b"], "error: name: must not contain / or be . or .. (it is one URL"),
        (["--interval", "60", "--name", ".."], "error: name: must not contain / or be . or .. (it is one URL"),
    ],
)
def test_jobs_add_bad_input_exits_2_and_writes_nothing(pg_dsn, conn, args, prefix) -> None:
    result = run(["jobs", "add", "--tenant", "acme", *args], pg_dsn)
    one_line_error(result, 2, prefix)
    assert conn.execute("SELECT count(*) AS c FROM jobs").fetchone()["c"] == 0
    assert conn.execute("SELECT count(*) AS c FROM tenants").fetchone()["c"] == 0


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["jobs", "import", "{tmp}/missing.csv", "--tenant", "acme"], "csv_file: must be an existing, readable file"),
        (["jobs", "import", "{tmp}", "--tenant", "acme"], "csv_file: must be an existing, readable file"),
        (["keys", "create", "--tenant", "acme", "--role", "god"], "role: must be one of admin, tenant, worker"),
        (["api", "--ssl-certfile", "{tmp}/none.pem", "--ssl-keyfile", "{tmp}/none.key"], "ssl_certfile: must be an"),
    ],
    ids=["import-missing", "import-directory", "keys-role", "api-certfile"],
)
def test_a_choice_or_a_file_refused_names_the_field_and_the_rule(pg_dsn, conn, tmp_path, args, line) -> None:
    """click's own refusals (``Invalid value for 'CSV_FILE'`` / ``'--role'``) read as every
    other refusal: one line, the field and the rule, exit 2, nothing written."""
    result = run([a.format(tmp=tmp_path) for a in args], pg_dsn)
    one_line_error(result, 2, f"error: {line}")
    assert conn.execute("SELECT count(*) AS c FROM tenants").fetchone()["c"] == 0


def test_commands_without_a_store_say_so() -> None:
    line = one_line_error(run(["jobs", "list"]), 2, "error: dsn: no store configured")
    assert "SCHEDULER_DSN" in line
    one_line_error(run(["db", "upgrade"]), 2, "error: dsn: no store configured")


def test_jobs_list_show_pause_resume_delete(pg_dsn, conn) -> None:
    a = uuid.UUID(
        run(["jobs", "add", "--tenant", "acme", "--cron", "*/5 * * * *", "--dialect", "unix"], pg_dsn).stdout.strip()
    )
    b = uuid.UUID(run(["jobs", "add", "--tenant", "acme", "--interval", "300"], pg_dsn).stdout.strip())
    c = uuid.UUID(
        run(["jobs", "add", "--tenant", "globex", "--at", "2030-01-01T09:00:00+01:00"], pg_dsn).stdout.strip()
    )

    listed = run(["jobs", "list", "--json"], pg_dsn)
    assert listed.exit_code == 0
    rows = json.loads(listed.stdout)
    assert [(r["job_id"], r["tenant"], r["schedule"]) for r in rows] == [
        (str(a), "acme", "cron '*/5 * * * *' UTC"),
        (str(b), "acme", "every 300s"),
        (str(c), "globex", "once at 2030-01-01T08:00:00Z"),
    ]
    assert rows[2]["next_nominal_at"] == "2030-01-01T08:00:00Z"
    only = json.loads(run(["jobs", "list", "--tenant", "globex", "--json"], pg_dsn).stdout)
    assert [r["job_id"] for r in only] == [str(c)]
    text = run(["jobs", "list"], pg_dsn).stdout.splitlines()
    assert text[0].split() == ["JOB_ID", "TENANT", "NAME", "SCHEDULE", "TARGET", "MISFIRE", "PAUSED", "NEXT_NOMINAL_AT"]
    assert len(text) == 4

    shown = json.loads(run(["jobs", "show", str(b), "--json"], pg_dsn).stdout)
    assert (shown["job_id"], shown["kind"], shown["interval_s"], shown["schedule"]) == (
        str(b),
        "interval",
        300,
        "every 300s",
    )

    assert run(["jobs", "pause", str(b)], pg_dsn).stdout == f"paused {b}\n"
    assert jobs.get_job(conn, b)["paused"] is True
    assert run(["jobs", "resume", str(b)], pg_dsn).stdout == f"resumed {b}\n"
    assert jobs.get_job(conn, b)["paused"] is False
    assert run(["jobs", "delete", str(b)], pg_dsn).stdout == f"deleted {b}\n"
    assert [r["job_id"] for r in json.loads(run(["jobs", "list", "--json"], pg_dsn).stdout)] == [str(a), str(c)]

    one_line_error(run(["jobs", "delete", str(b)], pg_dsn), 2, f"error: job_id: no job {b}")
    one_line_error(run(["jobs", "show", "not-a-uuid"], pg_dsn), 2, "error: job_id: must be a UUID")


def test_jobs_resume_catch_up_backfill(pg_dsn, conn) -> None:
    job_id = uuid.UUID(run(["jobs", "add", "--tenant", "acme", "--cron", "0 * * * *"], pg_dsn).stdout.strip())

    def pause_three_hours_ago() -> datetime:
        assert run(["jobs", "pause", str(job_id)], pg_dsn).stdout == f"paused {job_id}\n"
        conn.execute(  # as if the pause had happened three hours ago
            "UPDATE job_revisions SET valid_from = valid_from - interval '3 hours',"
            " valid_until = valid_until - interval '3 hours' WHERE job_id = %s AND NOT paused",
            (job_id,),
        )
        return conn.execute(
            "SELECT max(valid_until) AS t FROM job_revisions WHERE job_id = %s AND NOT paused", (job_id,)
        ).fetchone()["t"]

    paused_at = pause_three_hours_ago()
    refused = run(["jobs", "resume", str(job_id), "--catch-up", "backfill", "--max-runs", "1"], pg_dsn)
    one_line_error(refused, 2, "error: max_runs: the range holds more than 1 slots")
    assert jobs.get_job(conn, job_id)["paused"] is True  # nothing written
    resumed = run(["jobs", "resume", str(job_id), "--catch-up", "backfill"], pg_dsn)
    resumed_at = jobs.get_job(conn, job_id)["changed_at"]
    top = paused_at.replace(minute=0, second=0, microsecond=0)
    expected = [top + timedelta(hours=k) for k in range(1, 6) if top + timedelta(hours=k) <= resumed_at]
    assert len(expected) in (3, 4)
    assert resumed.stdout == f"resumed {job_id}; backfilled {len(expected)} runs\n"
    got = conn.execute("SELECT nominal_time, origin FROM runs WHERE job_id = %s ORDER BY 1", (job_id,)).fetchall()
    assert got == [{"nominal_time": t, "origin": "backfill"} for t in expected]
    assert jobs.get_job(conn, job_id)["paused"] is False

    pause_three_hours_ago()
    assert run(["jobs", "resume", str(job_id)], pg_dsn).stdout == f"resumed {job_id}\n"  # --catch-up none
    assert len(conn.execute("SELECT 1 FROM runs WHERE job_id = %s", (job_id,)).fetchall()) == len(expected)


def test_jobs_import_reports_every_bad_line(pg_dsn, conn) -> None:
    result = run(["jobs", "import", str(CORPUS), "--tenant", "corpus"], pg_dsn)
    assert result.exit_code == 0
    # 1,356 valid lines and 144 bad ones (see tests/integration/test_jobs.py).
    assert result.stdout == "1356 created, 0 unchanged, 144 rejected\n"
    errors = result.stderr.splitlines()
    assert len(errors) == 144
    assert errors[0] == f"{CORPUS}:2: '3h': cron: expected 5 fields for dialect 'unix', got 1 (got '3h')"
    assert any(e.startswith(f"{CORPUS}:302: '30 8 * * * Europe/London': cron: 6 fields given") for e in errors)
    assert conn.execute("SELECT count(*) AS c FROM jobs").fetchone()["c"] == 1356


# ---------------------------------------------------------------- tenants


def test_tenants_add_list_set(pg_dsn, conn) -> None:
    assert run(["tenants", "add", "acme", "--weight", "2"], pg_dsn).stdout == "tenant acme created\n"
    assert run(["tenants", "add", "acme", "--weight", "5"], pg_dsn).stdout == (
        "tenant acme exists (unchanged; use `scheduler tenants set acme` to change it)\n"
    )
    assert run(["tenants", "add", "globex", "--max-rate", "10"], pg_dsn).stdout == "tenant globex created\n"
    listed = json.loads(run(["tenants", "list", "--json"], pg_dsn).stdout)
    assert [(t["tenant"], t["weight"], t["max_rate"], t["jobs"]) for t in listed] == [
        ("acme", 2, None, 0),
        ("globex", 1, 10.0, 0),
    ]

    assert run(["tenants", "set", "acme", "--weight", "3", "--max-rate", "5"], pg_dsn).stdout == (
        "tenant acme weight=3 max_rate=5.0 max_schedules=default\n"
    )
    assert run(["tenants", "set", "acme", "--no-max-rate"], pg_dsn).stdout == (
        "tenant acme weight=3 max_rate=- max_schedules=default\n"
    )
    assert run(["tenants", "set", "acme", "--max-schedules", "40"], pg_dsn).stdout == (
        "tenant acme weight=3 max_rate=- max_schedules=40\n"
    )
    text = run(["tenants", "list"], pg_dsn).stdout.splitlines()
    assert text[0].split() == ["TENANT", "WEIGHT", "MAX_RATE", "MAX_SCHEDULES", "JOBS", "CREATED_AT"]
    assert text[1].split()[:5] == ["acme", "3", "-", "40", "0"]
    assert run(["tenants", "set", "acme", "--no-max-schedules"], pg_dsn).stdout.endswith("max_schedules=default\n")
    one_line_error(
        run(["tenants", "set", "acme", "--max-schedules", "-1"], pg_dsn),
        2,
        "error: max_schedules: must be a whole number from 0 to 100000000 in ASCII digits (got '-1')",
    )
    one_line_error(
        run(["tenants", "set", "acme", "--max-schedules", "5", "--no-max-schedules"], pg_dsn),
        2,
        "error: --max-schedules and --no-max-schedules contradict each other",
    )

    one_line_error(run(["tenants", "set", "initech", "--weight", "2"], pg_dsn), 2, "error: tenant: no tenant")
    one_line_error(
        run(["tenants", "set", "acme"], pg_dsn),
        2,
        "error: give --weight, --max-rate, --no-max-rate, --max-schedules or --no-max-schedules",
    )
    one_line_error(
        run(["tenants", "set", "acme", "--max-rate", "5", "--no-max-rate"], pg_dsn),
        2,
        "error: --max-rate and --no-max-rate contradict each other",
    )
    assert conn.execute("SELECT max_rate FROM tenants WHERE tenant = 'acme'").fetchone()["max_rate"] is None
    one_line_error(run(["tenants", "add", "bad tenant"], pg_dsn), 2, "error: tenant: must be 1-200 characters")
    # A final newline met the rule's `$` (Python matches it before one): tenant "acme\n" was created.
    one_line_error(run(["tenants", "add", "acme\n"], pg_dsn), 2, "error: tenant: must be 1-200 characters")
    one_line_error(
        run(["jobs", "add", "--tenant", "acme\n", "--interval", "60"], pg_dsn), 2, "error: tenant: must be 1-200"
    )
    assert conn.execute("SELECT count(*) AS n FROM tenants WHERE tenant LIKE %s", ["%\n"]).fetchone()["n"] == 0
    one_line_error(run(["tenants", "add", "initech", "--weight", "0"], pg_dsn), 2, "error: weight: ")
    one_line_error(run(["tenants", "set", "acme", "--max-rate", "inf"], pg_dsn), 2, "error: max_rate: ")
    # A finite cap too large to mean anything (it overflowed the firer's token bucket: every
    # node's tick crashed, for every tenant) is refused naming the bound; nothing written.
    one_line_error(
        run(["tenants", "set", "acme", "--max-rate", "1e308"], pg_dsn),
        2,
        "error: max_rate: must be a number of runs per second > 0 and <= 1000000000 in ASCII digits (got '1e308')",
    )
    one_line_error(run(["tenants", "add", "initech", "--max-rate", "1000000001"], pg_dsn), 2, "error: max_rate: ")
    assert conn.execute("SELECT max_rate FROM tenants WHERE tenant = 'acme'").fetchone()["max_rate"] is None
    assert conn.execute("SELECT count(*) AS n FROM tenants WHERE tenant = 'initech'").fetchone()["n"] == 0


# ---------------------------------------------------------------- db upgrade


def test_db_upgrade_is_rerunnable(empty_pg_dsn) -> None:
    for _ in range(2):
        result = run(["db", "upgrade"], empty_pg_dsn)
        assert (result.exit_code, result.stdout) == (0, f"schema at {migrate.head_revision()} (head)\n"), result.stderr
    with psycopg.connect(empty_pg_dsn) as c:
        assert c.execute("SELECT count(*) FROM partitions").fetchone()[0] == 1024
        tables = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
    assert {"partitions", "nodes", "tenants", "jobs", "runs", "skips", "alembic_version"} <= tables


# ---------------------------------------------------------------- runs list and verify


def tick_once(dsn: str) -> int:
    """One firing tick of a node "cli-node" holding every partition; returns the runs fired."""
    node = OneNode(dsn, node_id="cli-node")
    try:
        return node.firer.tick().fired
    finally:
        node.close()


def fire_two_jobs(pg_dsn: str, conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID, datetime]:
    """Two interval-60 jobs with slots anchor+60 .. anchor+300 overdue, fired by one tick.

    Returns their ids and the anchor (the store's now is anchor + 330 s).
    """
    ids = [jobs.add_job(conn, JobSpec.build(tenant=t, interval_s=60)).job_id for t in ("acme", "globex")]
    anchor = store_now(conn).replace(microsecond=0) - timedelta(seconds=330)
    conn.execute(
        "UPDATE jobs SET anchor_at = %(a)s, created_at = %(a)s, changed_at = %(a)s, "
        "next_nominal_at = %(n)s, next_due_at = %(n)s",
        {"a": anchor, "n": anchor + timedelta(seconds=60)},
    )
    assert tick_once(pg_dsn) == 10
    return ids[0], ids[1], anchor


def test_runs_list(pg_dsn, conn) -> None:
    a, b, anchor = fire_two_jobs(pg_dsn, conn)
    result = run(["runs", "list", "--job", str(a), "--json"], pg_dsn)
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [r["nominal_time"] for r in rows] == [
        format_instant(anchor + timedelta(seconds=60 * k)) for k in (5, 4, 3, 2, 1)
    ]  # newest first
    assert {(r["job_id"], r["tenant"], r["node_id"], r["epoch"]) for r in rows} == {(str(a), "acme", "cli-node", 1)}
    lateness = [r["lateness_s"] for r in rows]
    assert lateness == sorted(lateness)  # older slots were later
    assert 25 < lateness[0] < lateness[-1] < 300

    since = format_instant(anchor + timedelta(seconds=240))
    recent = json.loads(run(["runs", "list", "--since", since, "--json"], pg_dsn).stdout)
    assert sorted((r["job_id"], r["nominal_time"]) for r in recent) == sorted(
        (str(j), format_instant(anchor + timedelta(seconds=60 * k))) for j in (a, b) for k in (4, 5)
    )
    until = format_instant(anchor + timedelta(seconds=240))  # exclusive: the 240 s slot is not in it
    early = json.loads(run(["runs", "list", "--until", until, "--json"], pg_dsn).stdout)
    assert sorted((r["job_id"], r["nominal_time"]) for r in early) == sorted(
        (str(j), format_instant(anchor + timedelta(seconds=60 * k))) for j in (a, b) for k in (1, 2, 3)
    )
    window = ["runs", "list", "--since", format_instant(anchor + timedelta(seconds=120)), "--until", until]
    between = json.loads(run([*window, "--job", str(b), "--json"], pg_dsn).stdout)
    assert [r["nominal_time"] for r in between] == [format_instant(anchor + timedelta(seconds=60 * k)) for k in (3, 2)]
    one_line_error(
        run(["runs", "list", "--since", until, "--until", until], pg_dsn), 2, "error: until: must be later than since"
    )
    limited = json.loads(run(["runs", "list", "--limit", "3", "--json"], pg_dsn).stdout)
    assert len(limited) == 3
    text = run(["runs", "list", "--job", str(b)], pg_dsn).stdout.splitlines()
    assert text[0].split() == RUNS_LIST_COLUMNS
    assert len(text) == 6
    one_line_error(run(["runs", "list", "--since", "2030-01-01"], pg_dsn), 2, "error: since: ")
    rule = "error: limit: must be a whole number from 1 to 1000000 in ASCII digits"
    one_line_error(run(["runs", "list", "--limit", "0"], pg_dsn), 2, f"{rule} (got '0')")
    one_line_error(run(["jobs", "list", "--limit", "-1"], pg_dsn), 2, f"{rule} (got '-1')")
    # Past bigint, these reached the store: "error: store: bigint out of range", exit 1.
    huge = "99999999999999999999"
    unknown = uuid.uuid4()  # the README: an unknown job exits 2 (it printed an empty table, exit 0)
    one_line_error(run(["runs", "list", "--job", str(unknown)], pg_dsn), 2, f"error: job_id: no job {unknown}")
    redrive = ["runs", "redrive", "--job", str(uuid.uuid4()), "--state", "dead"]
    for args in (["runs", "list"], ["jobs", "list"], redrive):
        one_line_error(run([*args, "--limit", huge], pg_dsn), 2, f"{rule} (got '{huge}')")


def test_verify_counts_and_exit_status(pg_dsn, conn) -> None:
    a, b, anchor = fire_two_jobs(pg_dsn, conn)
    excluded = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
    # Rewritten after the window started with no job_revisions row (as before revisions were
    # kept): its history is unknown before changed_at, so it is left out of this audit.
    conn.execute(
        "UPDATE jobs SET created_at = %s, revision = 2, changed_at = now() WHERE job_id = %s",
        (anchor - timedelta(seconds=5), excluded),
    )
    since, until = format_instant(anchor), format_instant(anchor + timedelta(seconds=330))
    args = ["verify", "--since", since, "--until", until, "--json"]

    ok = run(args, pg_dsn)
    assert ok.exit_code == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert VERIFY_KEYS <= set(report)
    assert (
        report["expected"],
        report["runs"],
        report["missing"],
        report["duplicates"],
        report["unexpected"],
        report["jobs_excluded"],
    ) == (10, 10, 0, 0, 0, 1)
    lateness = [
        r["l"]
        for r in conn.execute(
            "SELECT extract(epoch FROM fired_at - scheduled_at)::float8 AS l FROM runs ORDER BY l"
        ).fetchall()
    ]
    assert report["lateness_max_s"] == pytest.approx(lateness[-1], abs=1e-6)
    assert report["lateness_p50_s"] == pytest.approx((lateness[4] + lateness[5]) / 2, abs=1e-6)
    assert lateness[0] <= report["lateness_p99_s"] <= lateness[-1]

    conn.execute("DELETE FROM runs WHERE job_id = %s AND nominal_time = %s", (b, anchor + timedelta(seconds=180)))
    missing = run(args, pg_dsn)
    assert missing.exit_code == 1
    report = json.loads(missing.stdout)
    assert (report["expected"], report["runs"], report["missing"], report["unexpected"]) == (10, 9, 1, 0)

    # A run at a nominal time the schedule does not produce is unexpected.
    conn.execute(
        "INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch) "
        "SELECT partition_id, job_id, %(t)s, tenant, %(t)s, %(t)s, 'rogue', 1 FROM jobs WHERE job_id = %(j)s",
        {"t": anchor + timedelta(seconds=90), "j": a},
    )
    report = json.loads(run(args, pg_dsn).stdout)
    assert (report["runs"], report["missing"], report["unexpected"]) == (10, 1, 1)

    text = run(["verify", "--since", since, "--until", until], pg_dsn)
    assert text.exit_code == 1
    assert "missing: 1" in text.stdout.splitlines() and "unexpected: 1" in text.stdout.splitlines()


def test_verify_is_retried_whole_after_a_serialization_failure(pg_dsn, conn, monkeypatch) -> None:
    """At SERIALIZABLE a concurrent firing transaction can cancel the audit with
    40001 midway (its temporary tables already made): it runs again from the start."""
    a, b, anchor = fire_two_jobs(pg_dsn, conn)
    real_execute = store.execute
    failed = []

    def execute(c, name, params=None, **kwargs):
        if name == "audit_segments" and not failed:
            failed.append(name)
            raise psycopg.errors.SerializationFailure("could not serialize access (injected)")
        return real_execute(c, name, params, **kwargs)

    monkeypatch.setattr(store, "execute", execute)
    with psycopg.connect(pg_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as other:
        report = audit.verify(other, anchor, anchor + timedelta(seconds=330))
    assert failed == ["audit_segments"]
    assert (report.expected, report.runs, report.missing, report.duplicates) == (10, 10, 0, 0)


def test_verify_accounts_for_skipped_slots(pg_dsn, conn) -> None:
    a, b, anchor = fire_two_jobs(pg_dsn, conn)
    slot = anchor + timedelta(seconds=120)
    conn.execute("DELETE FROM runs WHERE job_id = %s AND nominal_time = %s", (a, slot))
    # A 'grace' skip is valid under misfire skip, recorded more than the grace after the slot.
    conn.execute("UPDATE jobs SET misfire = 'skip' WHERE job_id = %s", (a,))
    conn.execute(
        "INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots, reason, recorded_at, "
        "node_id, epoch) SELECT partition_id, job_id, %(s)s, %(u)s, 1, 'grace', now(), 'n', 1 "
        "FROM jobs WHERE job_id = %(j)s",
        {"s": slot, "u": slot + timedelta(seconds=60), "j": a},
    )
    result = run(
        [
            "verify",
            "--since",
            format_instant(anchor),
            "--until",
            format_instant(anchor + timedelta(seconds=330)),
            "--json",
        ],
        pg_dsn,
    )
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert (report["expected"], report["runs"], report["missing"], report["skipped"]) == (10, 9, 0, 1)


def test_verify_refuses_a_reversed_window(pg_dsn) -> None:
    one_line_error(
        run(["verify", "--since", "2030-01-02T00:00:00Z", "--until", "2030-01-01T00:00:00Z"], pg_dsn),
        2,
        "error: until: must be later than --since",
    )
    one_line_error(
        run(["verify", "--since", "2030-01-01T00:00:00", "--until", "2030-01-02T00:00:00Z"], pg_dsn),
        2,
        "error: since: instant has no UTC offset",
    )


def test_status_json_after_a_node_claimed(pg_dsn, conn) -> None:
    fire_two_jobs(pg_dsn, conn)
    result = run(["status", "--json"], pg_dsn)
    assert result.exit_code == 0
    status = json.loads(result.stdout)
    assert [n["node_id"] for n in status["nodes"]] == ["cli-node"]
    assert status["nodes"][0]["partitions"] == 1024
    assert (status["partitions_total"], status["partitions_owned_live"], status["partitions_orphaned"]) == (
        1024,
        1024,
        0,
    )


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        (["status", "--lease-ttl-s", "1e20"], "lease_ttl_s: must be a number of seconds > 0 and <= 86400"),
        (["status", "--lease-ttl-s", "nan"], "lease_ttl_s: must be a number of seconds"),  # was accepted: "nans TTL"
        (["status", "--poll-interval-s", "0"], "poll_interval_s: must be a number of seconds > 0"),
        (
            [
                *("verify", "--since", "2026-01-01T00:00:00Z", "--until", "2026-01-02T00:00:00Z"),
                *("--delivery", "--lease-ttl-s", "86401"),
            ],
            "lease_ttl_s: must be a number of seconds > 0 and <= 86400",
        ),
    ],
)
def test_fleet_timings_out_of_range_exit_2_naming_the_field(pg_dsn, args, detail) -> None:
    """The bound of a node's settings and of the admin API's ``/v1/status`` and ``/v1/verify``."""
    line = one_line_error(run(args, pg_dsn), 2, f"error: {detail}")
    assert line.endswith(f"(got '{args[-1]}')")


def test_jobs_import_of_a_non_utf8_file_reports_lines_not_a_traceback(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"expr,dialect,timezone\n0 1 * * *,unix5,\n0 2 * * \xff,unix5,\n")
    result = run(["jobs", "import", str(path), "--tenant", "mine"], pg_dsn)
    assert result.exit_code == 0
    assert result.stdout == "1 created, 0 unchanged, 1 rejected\n"
    assert result.stderr == f"{path}:3: '0 2 * * \\udcff': encoding: the line is not valid UTF-8\n"
    as_json = run(["jobs", "import", str(path), "--tenant", "mine", "--json"], pg_dsn)
    assert json.loads(as_json.stdout) == {  # idempotent: the valid line's job exists
        "created": 0,
        "unchanged": 1,
        "rejected": [{"line": 3, "expr": "0 2 * * \udcff", "reason": "encoding: the line is not valid UTF-8"}],
    }
    assert conn.execute("SELECT count(*) AS c FROM jobs").fetchone()["c"] == 1


def test_jobs_import_without_an_expr_header_exits_2(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "no-header.csv"
    path.write_text("schedule\n0 1 * * *\n", encoding="utf-8")
    one_line_error(
        run(["jobs", "import", str(path), "--tenant", "mine"], pg_dsn),
        2,
        "error: file: must be a CSV with a header row naming an 'expr' column",
    )
    assert conn.execute("SELECT count(*) AS c FROM tenants").fetchone()["c"] == 0


def test_verify_a_window_ending_between_a_slots_nominal_and_jittered_time(pg_dsn, conn) -> None:
    """A slot whose jittered time is after --until is not expected yet; if it has
    already fired (the window is in the past), its run is not 'unexpected' either."""
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60, jitter_s=30)).job_id
    anchor = store_now(conn).replace(microsecond=0) - timedelta(seconds=330)
    slots = [anchor + timedelta(seconds=60 * k) for k in range(1, 6)]
    conn.execute(
        "UPDATE jobs SET anchor_at = %(a)s, created_at = %(a)s, changed_at = %(a)s, "
        "next_nominal_at = %(n)s, next_due_at = %(d)s",
        {"a": anchor, "n": slots[0], "d": scheduled_time(job_id, slots[0], 30)},
    )
    assert tick_once(pg_dsn) == 5
    # The window ends 1 ms before the jittered time of the last slot whose jitter is over 1 s.
    last = max(s for s in slots if scheduled_time(job_id, s, 30) - s > timedelta(seconds=1))
    until = scheduled_time(job_id, last, 30) - timedelta(milliseconds=1)
    due = [s for s in slots if scheduled_time(job_id, s, 30) <= until]
    result = run(["verify", "--since", format_instant(anchor), "--until", format_instant(until), "--json"], pg_dsn)
    report = json.loads(result.stdout)
    assert (report["expected"], report["runs"], report["missing"], report["unexpected"]) == (
        len(due),
        len(due),
        0,
        0,
    ), report
    assert result.exit_code == 0


def test_verify_refuses_future_and_overlong_windows(pg_dsn) -> None:
    future = run(["verify", "--since", "2020-01-01T00:00:00Z", "--until", "2999-01-01T00:00:00Z"], pg_dsn)
    assert future.exit_code == 2
    assert future.stderr.startswith("error: until: the window may span at most 31 days")
    ahead = run(["verify", "--since", "2999-01-01T00:00:00Z", "--until", "2999-01-02T00:00:00Z"], pg_dsn)
    assert ahead.exit_code == 2
    assert ahead.stderr.startswith("error: until: must not be in the future")


def test_commands_on_an_unmigrated_store_say_to_upgrade(empty_pg_dsn) -> None:
    result = run(["jobs", "list"], empty_pg_dsn)
    assert result.exit_code == 2
    assert "run `scheduler db upgrade` first" in result.stderr


# ---------------------------------------------------------------- options from the environment


def _options(command: click.Command, path: tuple[str, ...] = ()):
    """Every (command path, option) of the CLI tree."""
    for param in command.params:
        if isinstance(param, click.Option):
            yield path, param
    for name, sub in getattr(command, "commands", {}).items():
        yield from _options(sub, (*path, name))


def test_no_option_parses_a_number_with_clicks_own_types() -> None:
    """The README: numbers are ASCII digits. click's INT/FLOAT (and their ranges) take what
    Python's int()/float() take, ``٦٠`` and ``nan`` among them (a trial: `verify
    --list-limit ٦٠` listed 60 findings); every numeric option is one of the project's
    types (WholeNumber, Seconds, Decimal, ...), which refuse them naming the field."""
    numeric = (click.types.IntParamType, click.types.FloatParamType)
    plain = [(path, o.opts) for path, o in _options(cli) if isinstance(o.type, numeric)]
    assert plain == []
    result = CliRunner().invoke(cli, ["verify", "--since", "2030-01-01T00:00:00Z", "--list-limit", "٦٠"])
    assert (result.exit_code, result.stderr) == (
        2,
        "error: list_limit: must be a whole number from 0 to 10000 in ASCII digits (got '٦٠')\n",
    )


def test_every_option_reads_the_variable_named_after_its_flag(pg_dsn: str) -> None:
    """The README: an option reads SCHEDULER_<COMMAND>_<SUBCOMMAND>_<OPTION>. click's
    automatic name came from the Python parameter instead, so `--interval` read
    SCHEDULER_JOBS_ADD_INTERVAL_S and `--json` ..._AS_JSON (a trial set the
    documented names and was told to give --interval)."""
    plain = [(path, o.opts) for path, o in _options(cli) if o.expose_value and not isinstance(o, FlagNamedOption)]
    assert plain == []
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env |= {"SCHEDULER_DSN": pg_dsn, "SCHEDULER_JOBS_ADD_INTERVAL": "60", "SCHEDULER_JOBS_LIST_JSON": "1"}
    result = CliRunner().invoke(cli, ["jobs", "add", "--tenant", "envt", "--name", "every-minute"], env=env)
    assert result.exit_code == 0, result.stderr
    listed = CliRunner().invoke(cli, ["jobs", "list", "--tenant", "envt"], env=env)
    assert [(job["name"], job["interval_s"]) for job in json.loads(listed.stdout)] == [("every-minute", 60)]
    env |= {"SCHEDULER_JOBS_ADD_INTERVAL": "6o"}
    result = CliRunner().invoke(cli, ["jobs", "add", "--tenant", "envt", "--name", "other"], env=env)
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("; set by SCHEDULER_JOBS_ADD_INTERVAL"), result.stderr


@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("--backoff-base-s", "0", "must be a number of seconds above 0 and at most 86400, in ASCII digits"),
        ("--backoff-cap-s", "-1", "must be a number of seconds above 0 and at most 86400, in ASCII digits"),
        (
            "--max-age-s",
            "31d",
            "must be a duration from 1 second to 30 days (2592000 s): whole seconds, or e.g. "
            "90m, 12h, 7d, 1d12h (ASCII digits)",
        ),
        ("--timeout-s", "0", "must be a number of seconds above 0 and at most 300, in ASCII digits"),
        ("--catchup-window-s", "x", "must be a whole number of seconds in ASCII digits"),
        ("--misfire-grace-s", "x", "must be a whole number of seconds in ASCII digits"),
    ],
)
def test_a_refused_seconds_option_is_named_as_typed_and_by_its_variable(pg_dsn, option, value, rule) -> None:
    """A trial: `--backoff-base-s 0` was refused as `backoff_base: ...` (the API says
    backoff_base_s, the CSV column is backoff_base_s), and the same value from
    SCHEDULER_JOBS_ADD_BACKOFF_BASE_S did not name the variable (no option is
    called --backoff-base). The field is the option's (and the column's, and the
    API's) name."""
    field = option[2:].replace("-", "_")
    base = ["jobs", "add", "--tenant", "envt", "--url", "https://93.184.216.34/"]
    extra = ["--misfire", "once"] if field == "misfire_grace_s" else []
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": pg_dsn}
    flagged = CliRunner().invoke(cli, [*base, "--interval", "60", *extra, option, value], env=env)
    assert (flagged.exit_code, flagged.stderr) == (2, f"error: {field}: {rule} (got {value!r})\n")
    variable = "SCHEDULER_JOBS_ADD_" + field.upper()
    sourced = CliRunner().invoke(cli, [*base, "--interval", "60", *extra], env=env | {variable: value})
    assert (sourced.exit_code, sourced.stderr) == (2, f"error: {field}: {rule} (got {value!r}); set by {variable}\n")


@pytest.mark.parametrize(
    ("command", "variable", "value", "message"),
    [
        (
            ["jobs", "add", "--tenant", "envt", "--cron", "0 0 * * *"],
            "SCHEDULER_JOBS_ADD_DIALECT",
            "weird",
            "error: dialect: must be one of unix, seconds (got 'weird')",
        ),
        (
            ["jobs", "add", "--tenant", "envt", "--interval", "60"],
            "SCHEDULER_JOBS_ADD_OVERLAP",
            "never",
            "error: overlap: must be one of allow, forbid, buffer_one, replace (got 'never')",
        ),
        (["config", "show"], "SCHEDULER_COORDINATOR", "zk", "error: coordinator: must be one of sql, etcd (got 'zk')"),
        # The root group's options (a trial: a traceback for every command).
        (
            ["jobs", "list"],
            "SCHEDULER_LOG_LEVEL",
            "bogus",
            "error: log_level: must be one of debug, info, warning, error (got 'bogus')",
        ),
        (["status"], "SCHEDULER_LOG_FORMAT", "xml", "error: log_format: must be one of text, json (got 'xml')"),
    ],
)
def test_a_choice_taken_from_the_environment_is_refused_naming_the_variable(
    pg_dsn: str, command: list[str], variable: str, value: str, message: str
) -> None:
    """A value outside an option's choices, from an environment variable, is refused as
    ``field: rule (got value); set by VARIABLE`` (click's own message named the flag,
    which was not given, and not the variable; a trial); nothing is written."""
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": pg_dsn}
    result = CliRunner().invoke(cli, command, env=env | {variable: value})
    assert one_line_error(result, 2, message) == f"{message}; set by {variable}"
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_value_the_command_refuses_names_the_variable_it_came_from(pg_dsn: str) -> None:
    """A value checked by the command itself (a time zone, a tenant name, the DSN),
    taken from the environment, is refused naming the variable; given as a flag, not;
    nothing is written either way."""
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": pg_dsn}
    add = ["jobs", "add", "--tenant", "envt", "--cron", "* * * * *"]
    result = CliRunner().invoke(cli, add, env=env | {"SCHEDULER_JOBS_ADD_TZ": "Mars/X"})
    line = one_line_error(result, 2, "error: tz: not an IANA time zone name")
    assert line.endswith("(got 'Mars/X'); set by SCHEDULER_JOBS_ADD_TZ"), line
    line = one_line_error(CliRunner().invoke(cli, [*add, "--tz", "Mars/X"], env=env), 2, "error: tz: ")
    assert line.endswith("(got 'Mars/X')"), line
    result = CliRunner().invoke(cli, add[:2] + add[4:], env=env | {"SCHEDULER_TENANT": "bad tenant"})
    assert one_line_error(result, 2, "error: tenant: ").endswith("; set by SCHEDULER_TENANT")
    bad_dsn = {"SCHEDULER_DSN": "postgresql://u:p@ss@127.0.0.1/db"}
    line = one_line_error(CliRunner().invoke(cli, ["jobs", "list"], env=env | bad_dsn), 2, "error: dsn: ")
    assert line.endswith("; set by SCHEDULER_DSN") and "p@ss" not in line, line
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
