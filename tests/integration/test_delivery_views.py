"""Seeing delivery (docs/delivery.md, "Seeing it"): ``jobs describe``, ``runs list --state``,
``runs redrive``, ``verify --delivery`` and the node's delivery gauges, against a real store.

Runs are written directly in the states delivery leaves them (helpers.insert_run),
at instants chosen by the test, so every figure is exact.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from click.testing import CliRunner
from helpers import RUNS_LIST_COLUMNS, insert_run, store_now

from scheduler import jobs, store
from scheduler.audit import verify_delivery
from scheduler.cli import cli
from scheduler.delivery import lifecycle, views
from scheduler.errors import ConflictError, NotFoundError
from scheduler.metrics import Metrics
from scheduler.partition import partition_of
from scheduler.schedule import format_instant
from scheduler.spec import JobSpec

S = timedelta(seconds=1)
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def run(args: list[str], dsn: str):
    """Invoke the CLI in process; no SCHEDULER_* variable leaks in from the environment."""
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def one_line_error(result, status: int, text: str) -> None:
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    assert result.stderr.splitlines() == [text], result.stderr


def add(conn: psycopg.Connection, tenant: str = "acme", **spec) -> uuid.UUID:
    return jobs.add_job(conn, JobSpec.build(tenant=tenant, **(spec or {"interval_s": 60}))).job_id


def rid(job_id: uuid.UUID, nominal: datetime) -> str:
    return f"{job_id}.{int(nominal.timestamp()) * 1_000_000 + nominal.microsecond}"


def run_row(conn: psycopg.Connection, job_id: uuid.UUID, nominal: datetime) -> dict:
    return conn.execute(
        "SELECT state, attempt, available_at, lease_token, leased_until, worker, claimed_at, first_claimed_at,"
        " finished_at, retryable, last_error FROM runs WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (partition_of(job_id), job_id, nominal),
    ).fetchone()


# ---------------------------------------------------------------- run ids


# ---------------------------------------------------------------- runs list


def test_runs_list_by_state_and_tenant(pg_dsn, conn) -> None:
    a, b = add(conn, "acme"), add(conn, "globex")
    insert_run(conn, a, T0, state="dead", attempt=5, last_error="HTTP 500")
    insert_run(conn, a, T0 + 60 * S, state="succeeded", attempt=1)
    insert_run(conn, a, T0 + 120 * S, state="dead", attempt=3, last_error="not retryable")
    insert_run(conn, b, T0 + 30 * S, state="dead", attempt=5, last_error="timeout", tenant="globex", worker="w:42")
    insert_run(conn, b, T0 + 90 * S, state="pending", tenant="globex")

    dead = json.loads(run(["runs", "list", "--state", "dead", "--json"], pg_dsn).stdout)
    assert [(r["run_id"], r["state"], r["attempt"], r["last_error"]) for r in dead] == [
        (rid(a, T0 + 120 * S), "dead", 3, "not retryable"),
        (rid(b, T0 + 30 * S), "dead", 5, "timeout"),
        (rid(a, T0), "dead", 5, "HTTP 500"),
    ]
    acme_dead = json.loads(run(["runs", "list", "--state", "dead", "--tenant", "acme", "--json"], pg_dsn).stdout)
    assert [r["run_id"] for r in acme_dead] == [rid(a, T0 + 120 * S), rid(a, T0)]
    by_job = json.loads(run(["runs", "list", "--job", str(b), "--state", "pending", "--json"], pg_dsn).stdout)
    assert [r["run_id"] for r in by_job] == [rid(b, T0 + 90 * S)]
    limited = json.loads(run(["runs", "list", "--state", "dead", "--limit", "1", "--json"], pg_dsn).stdout)
    assert [r["run_id"] for r in limited] == [rid(a, T0 + 120 * S)]

    text = run(["runs", "list", "--state", "dead", "--tenant", "globex"], pg_dsn).stdout.splitlines()
    assert text[0].split()[:6] == ["RUN_ID", "TENANT", "JOB_NAME", "NOMINAL_TIME", "STATE", "ATTEMPT"]  # test_cli.py
    assert text[1].split() == [rid(b, T0 + 30 * S), "globex", "-", format_instant(T0 + 30 * S), "dead", "5"] + [
        format_instant(T0 + 30 * S),
        "0.0",
        "w:42",
        "timeout",
    ]
    assert len(text) == 2
    empty = run(["runs", "list", "--state", "leased", "--tenant", "acme", "--json"], pg_dsn)
    assert (empty.exit_code, json.loads(empty.stdout)) == (0, [])
    one_line_error(run(["runs", "list", "--tenant", "initech"], pg_dsn), 2, "error: tenant: no tenant 'initech'")
    assert run(["runs", "list", "--state", "lost"], pg_dsn).exit_code == 2


def test_runs_list_text_marks_a_cut_error(pg_dsn, conn) -> None:
    """The table's error column holds 80 characters: a longer error ends in … (the re-trial: a
    max-age reason was cut mid-sentence, with nothing to say so); --json has it whole."""
    job = add(conn, name="nightly", interval_s=60)
    long_error = "connection error: Empty reply from server (dead: retrying would pass max_age_s = 60 s) " + "x" * 40
    insert_run(conn, job, T0, state="dead", attempt=1, job_name="nightly", last_error=long_error)
    short = add(conn, name="hourly", interval_s=60)
    insert_run(conn, short, T0 + S, state="dead", attempt=1, job_name="hourly", last_error="HTTP 404")
    lines = run(["runs", "list", "--state", "dead"], pg_dsn).stdout.splitlines()
    cut = long_error[:79] + "…"
    assert lines[2].endswith(f"  {cut}") and lines[1].endswith("  HTTP 404")
    got = json.loads(run(["runs", "list", "--state", "dead", "--json"], pg_dsn).stdout)
    assert [r["last_error"] for r in got] == ["HTTP 404", long_error]


def jobs_reads(conn: psycopg.Connection) -> int:
    """Scans of ``jobs`` (sequential and index) this transaction made so far."""
    row = conn.execute(
        "SELECT seq_scan + coalesce(idx_scan, 0) AS scans FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
    ).fetchone()
    return int(row["scans"])


def test_runs_list_names_each_runs_job(pg_dsn, conn) -> None:
    """The trial: `runs list --state dead` showed run and job ids only. Each run shows the
    name its job had when the run was created (runs.job_name; '' for none: null / -); a
    run from before revision 0035 (NULL) the job's current name, the only runs for which
    the listing reads jobs."""
    named = add(conn, name="nightly", interval_s=60)
    unnamed = add(conn)
    legacy = add(conn, name="weekly", interval_s=60)
    insert_run(conn, named, T0 + 3 * S, state="dead", attempt=5, job_name="nightly", last_error="HTTP 500")
    insert_run(conn, unnamed, T0 + 2 * S, state="dead", attempt=5, job_name="")
    insert_run(conn, legacy, T0 + S, state="dead", attempt=5)  # job_name NULL: fired before 0035
    insert_run(conn, unnamed, T0, state="dead", attempt=5)
    conn.execute("UPDATE jobs SET name = 'renamed' WHERE job_id = %s", (named,))  # after its run was created

    got = json.loads(run(["runs", "list", "--state", "dead", "--json"], pg_dsn).stdout)
    assert [(r["run_id"], r["job_name"]) for r in got] == [
        (rid(named, T0 + 3 * S), "nightly"),
        (rid(unnamed, T0 + 2 * S), None),
        (rid(legacy, T0 + S), "weekly"),
        (rid(unnamed, T0), None),
    ]
    text = run(["runs", "list", "--state", "dead"], pg_dsn).stdout.splitlines()
    assert text[0].split() == RUNS_LIST_COLUMNS
    assert [line.split()[:3] for line in text[1:]] == [
        [rid(named, T0 + 3 * S), "acme", "nightly"],
        [rid(unnamed, T0 + 2 * S), "acme", "-"],
        [rid(legacy, T0 + S), "acme", "weekly"],
        [rid(unnamed, T0), "acme", "-"],
    ]
    with conn.transaction():
        before = jobs_reads(conn)
        assert len(jobs.list_runs(conn, state="dead")) == 4
        assert jobs_reads(conn) - before == 2  # one probe per run without a recorded name


# ---------------------------------------------------------------- redrive


def test_redrive_one_dead_run(pg_dsn, conn) -> None:
    job = add(conn)
    lease = uuid.uuid4()
    insert_run(
        conn,
        job,
        T0,
        state="dead",
        attempt=5,
        last_error="HTTP 503",
        lease_token=lease,
        leased_until=T0 + 40 * S,
        worker="w1",
        claimed_at=T0 + 9 * S,
        first_claimed_at=T0 + S,
        finished_at=T0 + 41 * S,
        retryable=True,
        available_at=T0,
    )
    insert_run(conn, job, T0 + 60 * S, state="dead", attempt=5, last_error="untouched")
    before = store_now(conn)
    result = run(["runs", "redrive", rid(job, T0)], pg_dsn)
    assert (result.exit_code, result.stdout, result.stderr) == (0, rid(job, T0) + "\n", "redrove 1 run\n")
    after = store_now(conn)
    row = run_row(conn, job, T0)
    assert before <= row.pop("available_at") <= after
    assert row == {
        "state": "pending",
        "attempt": 0,
        "lease_token": None,
        "leased_until": None,
        "worker": None,
        "claimed_at": None,
        "first_claimed_at": None,
        "finished_at": None,
        "retryable": None,
        "last_error": "HTTP 503",
    }
    assert run_row(conn, job, T0 + 60 * S)["state"] == "dead"


def test_redrive_a_canceled_run(conn) -> None:
    job = add(conn)
    insert_run(conn, job, T0, state="canceled", attempt=1, finished_at=T0 + S, last_error="replaced")
    assert views.redrive(conn, rid(job, T0)) == rid(job, T0)
    row = run_row(conn, job, T0)
    assert (row["state"], row["attempt"], row["finished_at"], row["last_error"]) == ("pending", 0, None, "replaced")


def assert_refused(pg_dsn: str, conn: psycopg.Connection, verb: str, states: tuple[str, ...], rule: str, **columns):
    """``runs <verb> RUN_ID`` refuses a run in each of ``states`` (written at T0 + k s with
    ``columns``), one fired before delivery existed (T0 + 9 s), a missing one (T0 + 5 s) and a
    malformed id: one line naming the state and ``rule``, exit status 2, ``runs`` unchanged.
    Returns the job's id."""
    job = add(conn)
    for k, state in enumerate(states):
        insert_run(conn, job, T0 + k * S, state=state, **columns)
    insert_run(conn, job, T0 + 9 * S, state=None)
    before = conn.execute("SELECT * FROM runs ORDER BY job_id, nominal_time").fetchall()
    for k, state in enumerate(states):
        one_line_error(
            run(["runs", verb, rid(job, T0 + k * S)], pg_dsn),
            2,
            f"error: run_id: run {rid(job, T0 + k * S)} is {state}; {rule} (nothing changed)",
        )
    one_line_error(
        run(["runs", verb, rid(job, T0 + 9 * S)], pg_dsn),
        2,
        f"error: run_id: run {rid(job, T0 + 9 * S)} has no delivery state (fired before delivery existed); "
        f"{rule} (nothing changed)",
    )
    one_line_error(
        run(["runs", verb, rid(job, T0 + 5 * S)], pg_dsn), 2, f"error: run_id: no run {rid(job, T0 + 5 * S)}"
    )
    one_line_error(
        run(["runs", verb, "nope"], pg_dsn),
        2,
        "error: run_id: must be <job id>.<nominal time in Unix microseconds> (as listed by `scheduler runs list`)"
        " (got 'nope')",
    )
    assert conn.execute("SELECT * FROM runs ORDER BY job_id, nominal_time").fetchall() == before
    return job


def test_redrive_refuses_a_run_that_is_not_dead_or_canceled(pg_dsn, conn) -> None:
    states = ("pending", "leased", "failed", "succeeded")
    assert_refused(
        pg_dsn, conn, "redrive", states, "only a dead or canceled run can be redriven", attempt=2, last_error="e"
    )


def test_redrive_a_jobs_dead_runs_oldest_first(pg_dsn, conn) -> None:
    job, other = add(conn), add(conn)
    for k in range(4):
        insert_run(conn, job, T0 + k * 60 * S, state="dead", attempt=5)
    insert_run(conn, job, T0 + 300 * S, state="canceled", attempt=1)
    insert_run(conn, other, T0, state="dead", attempt=5)
    result = run(["runs", "redrive", "--job", str(job), "--state", "dead", "--limit", "3", "--json"], pg_dsn)
    assert json.loads(result.stdout) == {"redriven": [rid(job, T0 + k * 60 * S) for k in range(3)]}
    states = conn.execute(
        "SELECT job_id, nominal_time, state, attempt FROM runs ORDER BY job_id = %s, nominal_time", (job,)
    ).fetchall()
    assert [(r["job_id"], r["nominal_time"], r["state"], r["attempt"]) for r in states] == [
        (other, T0, "dead", 5),
        (job, T0, "pending", 0),
        (job, T0 + 60 * S, "pending", 0),
        (job, T0 + 120 * S, "pending", 0),
        (job, T0 + 180 * S, "dead", 5),
        (job, T0 + 300 * S, "canceled", 1),
    ]
    canceled = run(["runs", "redrive", "--job", str(job), "--state", "canceled"], pg_dsn)
    assert canceled.stdout == rid(job, T0 + 300 * S) + "\n"
    none_left = run(["runs", "redrive", "--job", str(job), "--state", "canceled"], pg_dsn)
    assert (none_left.exit_code, none_left.stdout, none_left.stderr) == (0, "", "redrove 0 runs\n")
    one_line_error(
        run(["runs", "redrive", "--job", str(uuid.UUID(int=7)), "--state", "dead"], pg_dsn),
        2,
        f"error: job_id: no job {uuid.UUID(int=7)}",
    )
    one_line_error(
        run(["runs", "redrive", "--job", str(job)], pg_dsn),
        2,
        "error: state: --job needs --state dead or --state canceled",
    )
    one_line_error(run(["runs", "redrive"], pg_dsn), 2, "error: redrive: give exactly one of RUN_ID or --job")
    assert run(["runs", "redrive", "--job", str(job), "--state", "pending"], pg_dsn).exit_code == 2


def test_a_redriven_run_that_succeeds_no_longer_shows_why_it_died(pg_dsn, conn) -> None:
    """The trial: a dead run, redriven and then delivered, still showed its old last_error
    in `runs list` and `jobs describe`. While it is pending again it still says why it
    died; the ack that makes it succeeded clears it (a succeeded run has no error)."""
    job = add(conn)
    insert_run(conn, job, T0, state="dead", attempt=5, last_error="HTTP 503", finished_at=T0 + S)
    assert views.redrive(conn, rid(job, T0)) == rid(job, T0)
    assert (run_row(conn, job, T0)["state"], run_row(conn, job, T0)["last_error"]) == ("pending", "HTTP 503")
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1)
    assert run_row(conn, job, T0)["last_error"] == "HTTP 503"  # attempt 1 of the new budget is running
    assert lifecycle.ack(conn, [(claimed.run_id, claimed.token)]) == {rid(job, T0): "succeeded"}
    row = run_row(conn, job, T0)
    assert (row["state"], row["attempt"], row["last_error"]) == ("succeeded", 1, None)
    listed = json.loads(run(["runs", "list", "--job", str(job), "--json"], pg_dsn).stdout)
    assert [(r["run_id"], r["state"], r["last_error"]) for r in listed] == [(rid(job, T0), "succeeded", None)]
    described = json.loads(run(["jobs", "describe", str(job), "--json"], pg_dsn).stdout)
    assert [(r["run_id"], r["state"], r["last_error"]) for r in described["recent_runs"]] == [
        (rid(job, T0), "succeeded", None)
    ]


def test_a_run_of_a_deleted_job_is_not_redriven(pg_dsn, conn) -> None:
    """The trial: a dead run of a deleted job could be redriven, and was then delivered
    again to the deleted job's queue with its payload (or pushed to its URL), where
    nothing expects that job any more; once retention pruned the job, a pushed one had no
    target at all. A single run is refused, and so is a job's (``--job``: exit 2, as for
    one run; it used to exit 0 with "redrove 0 runs" and the count on stderr): nothing
    changed. A pruned job (no row left) counts as deleted."""
    job = add(conn, name="nightly", interval_s=60)
    for k in range(3):
        insert_run(conn, job, T0 + k * 60 * S, state="dead", attempt=5, last_error="HTTP 500")
    jobs.delete_job(conn, job)
    before = conn.execute("SELECT * FROM runs ORDER BY nominal_time").fetchall()
    rule = "only a run of a live job can be redriven (nothing changed)"
    one_line_error(
        run(["runs", "redrive", rid(job, T0)], pg_dsn),
        2,
        f"error: run_id: run {rid(job, T0)} is of job {job}, which is deleted; {rule}",
    )
    job_refused = f"error: job_id: job {job} is deleted; {rule}"
    one_line_error(
        run(["runs", "redrive", "--job", str(job), "--state", "dead", "--limit", "2"], pg_dsn), 2, job_refused
    )
    one_line_error(run(["runs", "redrive", "--job", str(job), "--state", "dead", "--json"], pg_dsn), 2, job_refused)
    # ... also when it has no run in that state (the trial: "redrove 0 runs", exit 0)
    one_line_error(run(["runs", "redrive", "--job", str(job), "--state", "canceled"], pg_dsn), 2, job_refused)
    assert conn.execute("SELECT * FROM runs ORDER BY nominal_time").fetchall() == before

    conn.execute("DELETE FROM jobs WHERE job_id = %s", (job,))  # pruned by retention
    with pytest.raises(ConflictError, match=f"^run_id: run {rid(job, T0)} is of job {job}, which is deleted; "):
        views.redrive(conn, rid(job, T0))
    with pytest.raises(ConflictError, match=f"^job_id: job {job} is deleted; "):
        views.redrive_job(conn, job, "dead", 100)
    assert conn.execute("SELECT * FROM runs ORDER BY nominal_time").fetchall() == before


# ---------------------------------------------------------------- describe


def push_job(conn: psycopg.Connection) -> uuid.UUID:
    """An interval-60 job anchored at T0 (next slot T0 + 60 s) pushed to a URL with a secret header."""
    job = add(conn, interval_s=60)
    conn.execute(
        "UPDATE jobs SET anchor_at = %(t)s, next_nominal_at = %(n)s, next_due_at = %(n)s, queue = NULL,"
        " overlap = 'forbid' WHERE job_id = %(j)s",
        {"t": T0, "n": T0 + 60 * S, "j": job},
    )
    conn.execute(
        "INSERT INTO job_delivery (partition_id, job_id, url, method, headers, timeout_s, payload, max_attempts,"
        " backoff_base_s, backoff_cap_s, max_age_s) VALUES (%s, %s, 'https://hooks.example.com/run', 'POST',"
        """ '{"X-Token": "s3cret-value", "Authorization": "Bearer hunter2"}', 2.5,"""
        """ '{"report": "daily", "n": [1, 2]}', 3, 0.5, 60, 3600)""",
        (partition_of(job), job),
    )
    return job


def test_describe_a_pushed_job(pg_dsn, conn) -> None:
    job = push_job(conn)
    base = T0 - 3600 * S
    for k in range(12):  # 12 runs, oldest first: the last 10 are shown, newest first
        nominal = base + k * 60 * S
        insert_run(
            conn,
            job,
            nominal,
            queue=None,
            state="succeeded" if k < 9 else ("dead" if k == 9 else "leased"),
            attempt=1 if k < 9 else 3,
            fired_at=nominal + k * 0.25 * S,
            first_claimed_at=nominal + (k + 1) * S,
            last_error="HTTP 500" if k == 9 else None,
        )
    insert_run(conn, job, base - 60 * S, state=None, fired_at=base - 60 * S)
    conn.execute(
        "INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots, reason, recorded_at,"
        " node_id, epoch) VALUES (%(p)s, %(j)s, %(a)s, %(b)s, 3, 'grace', %(b)s, 'n', 1),"
        " (%(p)s, %(j)s, %(c)s, %(d)s, 2, 'grace', %(d)s, 'n', 1),"
        " (%(p)s, %(j)s, %(e)s, %(f)s, NULL, 'paused', %(f)s, 'n', 1)",
        {
            "p": partition_of(job),
            "j": job,
            "a": base - 900 * S,
            "b": base - 720 * S,
            "c": base - 600 * S,
            "d": base - 480 * S,
            "e": base - 7200 * S,
            "f": base - 3600 * S,
        },
    )
    result = run(["jobs", "describe", str(job), "--json"], pg_dsn)
    assert result.exit_code == 0, result.stderr
    assert "s3cret" not in result.stdout and "hunter2" not in result.stdout
    got = json.loads(result.stdout)
    assert got["job"]["job_id"] == str(job)
    assert got["job"]["schedule"] == "every 60s"
    assert got["delivery"] == {
        "target": {
            "url": "https://hooks.example.com/run",
            "method": "POST",
            "header_names": ["Authorization", "X-Token"],
            "timeout_s": 2.5,
        },
        "payload_bytes": len(b'{"n":[1,2],"report":"daily"}'),
        "retry": {"max_attempts": 3, "backoff_base_s": 0.5, "backoff_cap_s": 60.0, "max_age_s": 3600},
        "overlap": "forbid",
    }
    fires = [T0 + k * 60 * S for k in range(1, 11)]
    assert got["next_fires"] == [{"nominal_time": format_instant(f), "scheduled_at": format_instant(f)} for f in fires]
    recent = got["recent_runs"]
    assert [r["run_id"] for r in recent] == [rid(job, base + k * 60 * S) for k in range(11, 1, -1)]
    assert [(r["state"], r["attempt"], r["lateness_s"], r["dispatch_lag_s"]) for r in recent] == [
        ("leased" if k > 9 else "dead" if k == 9 else "succeeded", 3 if k >= 9 else 1, k * 0.25, float(k + 1))
        for k in range(11, 1, -1)
    ]
    assert recent[2]["last_error"] == "HTTP 500"
    assert got["counters"] == {
        "runs": {
            "pending": 0,
            "leased": 2,
            "failed": 0,
            "succeeded": 9,
            "dead": 1,
            "canceled": 0,
            "predelivery": 1,
        },
        "in_flight": 2,
        "skips": {
            "grace": {"ranges": 2, "slots": 5, "uncounted": 0},
            "paused": {"ranges": 1, "slots": 0, "uncounted": 1},
        },
    }

    text = run(["jobs", "describe", str(job)], pg_dsn).stdout
    assert "s3cret" not in text and "hunter2" not in text
    lines = text.splitlines()
    assert f"{'target':17} POST https://hooks.example.com/run (headers: Authorization, X-Token; timeout 2.5s)" in lines
    assert f"{'payload':17} 28 bytes" in lines
    assert f"{'retry':17} max_attempts 3, backoff 0.5s to 60s, max_age 3600s" in lines
    assert f"{'overlap':17} forbid" in lines
    start = lines.index("next fires:")
    assert lines[start + 1 : start + 11] == [f"  {format_instant(f)}" for f in fires]
    assert lines[start + 11] == "recent runs:"
    assert lines[start + 12].split() == [
        "RUN_ID",
        "NOMINAL_TIME",
        "STATE",
        "ATTEMPT",
        "LATENESS_S",
        "DISPATCH_LAG_S",
        "ORIGIN",
        "LAST_ERROR",
    ]
    assert lines[start + 13].split() == [
        rid(job, base + 660 * S),
        format_instant(base + 660 * S),
        "leased",
        "3",
        "2.75",
        "12.0",
        "schedule",
        "-",
    ]
    assert (
        lines[-2] == "runs: pending 0, leased 2, failed 0, succeeded 9, dead 1, canceled 0, predelivery 1; in flight 2"
    )
    assert lines[-1] == "skipped: grace 5 slots in 2 ranges, paused 0 slots in 1 ranges (1 ranges too long to count)"


def test_describe_shows_each_recent_runs_id_which_redrive_takes(pg_dsn, conn) -> None:
    """The trial: `jobs describe`'s recent runs had no run id, so a dead run seen there
    could not be passed to `runs redrive`."""
    job = add(conn)
    insert_run(conn, job, T0, state="dead", attempt=5, last_error="HTTP 500")
    insert_run(conn, job, T0 + 60 * S, state="succeeded", attempt=1)
    lines = run(["jobs", "describe", str(job)], pg_dsn).stdout.splitlines()
    start = lines.index("recent runs:")
    assert lines[start + 1].split()[:3] == ["RUN_ID", "NOMINAL_TIME", "STATE"]
    assert [line.split()[:3] for line in lines[start + 2 : start + 4]] == [
        [rid(job, T0 + 60 * S), format_instant(T0 + 60 * S), "succeeded"],
        [rid(job, T0), format_instant(T0), "dead"],
    ]
    shown = lines[start + 3].split()[0]
    result = run(["runs", "redrive", shown], pg_dsn)
    assert (result.exit_code, result.stdout) == (0, rid(job, T0) + "\n")
    assert run_row(conn, job, T0)["state"] == "pending"


def test_describe_a_queue_job_with_defaults_and_no_runs(pg_dsn, conn) -> None:
    job = add(conn, cron="0 3 * * *", tz="Europe/Berlin")
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(n)s, next_due_at = %(n)s WHERE job_id = %(j)s",
        {"n": datetime(2030, 3, 30, 2, tzinfo=UTC), "j": job},
    )
    got = json.loads(run(["jobs", "describe", str(job), "--json"], pg_dsn).stdout)
    assert got["delivery"] == {
        "target": {"queue": "default"},
        "payload_bytes": None,
        "retry": {"max_attempts": 5, "backoff_base_s": 1.0, "backoff_cap_s": 300.0, "max_age_s": None},
        "overlap": "allow",
    }
    # 03:00 Berlin: CET (UTC+1) until the switch on 2030-03-31, then CEST (UTC+2)
    assert [f["nominal_time"] for f in got["next_fires"]] == [
        "2030-03-30T02:00:00Z",
        *(
            f"2030-{d}T01:00:00Z"
            for d in ("03-31", "04-01", "04-02", "04-03", "04-04", "04-05", "04-06", "04-07", "04-08")
        ),
    ]
    assert got["recent_runs"] == []
    assert got["counters"]["in_flight"] == 0 and got["counters"]["skips"] == {}
    jobs.set_paused(conn, job, True)
    assert json.loads(run(["jobs", "describe", str(job), "--json"], pg_dsn).stdout)["next_fires"] == []
    assert "  none (paused, deleted or no slot left)" in run(["jobs", "describe", str(job)], pg_dsn).stdout.splitlines()
    one_line_error(
        run(["jobs", "describe", str(uuid.UUID(int=3))], pg_dsn), 2, f"error: job_id: no job {uuid.UUID(int=3)}"
    )


def test_describe_reads_per_job_only(conn, monkeypatch) -> None:
    """Every statement describe sends is scoped by the job's (partition_id, job_id)."""
    from helpers import record_named_queries

    job = push_job(conn)
    sent = record_named_queries(monkeypatch)
    views.describe_job(conn, job)
    assert sorted(name for name, _ in sent) == sorted(
        ["get_job", "get_job_delivery", "count_job_runs_by_state", "count_job_skips_by_reason", "recent_job_runs"]
    )
    assert all(params["partition_id"] == partition_of(job) and params["job_id"] == job for _, params in sent)


# ---------------------------------------------------------------- verify --delivery


def delivery_window(conn: psycopg.Connection, lost: bool = False) -> tuple[datetime, datetime, uuid.UUID]:
    """An interval-60 job with a run at each of its 10 slots in [T, T + 10 min), T an hour
    before the store's now, in every delivery state; returns T, now, the job.

    The first run (T) has no state and fired before any run with one: predelivery. With
    ``lost`` the run at T + 8 min has no state either (fired after delivery existed).
    """
    now = store_now(conn).replace(microsecond=0)
    t = now - 3600 * S
    job = add(conn)
    conn.execute(
        "UPDATE jobs SET anchor_at = %(a)s, created_at = %(a)s, changed_at = %(a)s WHERE job_id = %(j)s",
        {"a": t - 3600 * S, "j": job},
    )
    insert_run(conn, job, t, state=None)
    insert_run(conn, job, t + 60 * S, state="succeeded", attempt=1)
    insert_run(conn, job, t + 120 * S, state="dead", attempt=5, last_error="HTTP 500")
    insert_run(conn, job, t + 180 * S, state="canceled", attempt=1)
    insert_run(conn, job, t + 240 * S, state="pending")
    insert_run(conn, job, t + 300 * S, state="leased", attempt=1, leased_until=now + 20 * S)  # valid lease
    insert_run(conn, job, t + 360 * S, state="leased", attempt=2, leased_until=now - 600 * S, worker="w9")  # stale
    insert_run(conn, job, t + 420 * S, state="failed", attempt=1, leased_until=now - 5 * S)  # settling
    insert_run(conn, job, t + 480 * S, state=None if lost else "succeeded", attempt=0 if lost else 1)
    insert_run(conn, job, t + 540 * S, state="succeeded", attempt=2)
    insert_run(conn, job, t + 900 * S, state="dead")  # outside the window
    return t, now, job


def test_verify_delivery_counts_every_state(conn) -> None:
    t, now, job = delivery_window(conn)
    report = verify_delivery(conn, t, t + 600 * S, lease_ttl_s=10.0)
    counts = {k: v for k, v in report.as_dict().items() if k not in ("findings", "findings_limit")}
    assert counts == {
        "runs": 10,
        "succeeded": 3,
        "dead": 1,
        "canceled": 1,
        "pending": 1,
        "leased": 2,
        "failed": 1,
        "lost": 0,
        "predelivery": 1,
        "stale": 1,
        "state_since": t + 60 * S,
    }
    assert report.ok
    assert [r["run_id"] for r in report.findings["dead"]] == [rid(job, t + 120 * S)]
    assert [r["run_id"] for r in report.findings["canceled"]] == [rid(job, t + 180 * S)]
    assert [(r["run_id"], r["worker"]) for r in report.findings["stale"]] == [(rid(job, t + 360 * S), "w9")]
    assert report.findings["lost"] == []
    # stale: ended more than TTL + 1 s before the store's now (pinned here)
    assert verify_delivery(conn, t, t + 600 * S, lease_ttl_s=598.0, now=now).stale == 1
    assert verify_delivery(conn, t, t + 600 * S, lease_ttl_s=599.0, now=now).stale == 0


def test_verify_delivery_finds_a_lost_run_and_exits_1(pg_dsn, conn) -> None:
    t, now, job = delivery_window(conn, lost=True)
    since, until = format_instant(t), format_instant(t + 600 * S)
    plain = run(["verify", "--since", since, "--until", until, "--json"], pg_dsn)
    assert plain.exit_code == 0 and "delivery" not in json.loads(plain.stdout)  # the firing audit passes
    result = run(["verify", "--since", since, "--until", until, "--delivery", "--json"], pg_dsn)
    assert result.exit_code == 1
    got = json.loads(result.stdout)["delivery"]
    assert (got["lost"], got["predelivery"], got["runs"], got["succeeded"]) == (1, 1, 10, 2)
    assert [r["run_id"] for r in got["findings"]["lost"]] == [rid(job, t + 480 * S)]
    text = run(["verify", "--since", since, "--until", until, "--delivery"], pg_dsn)
    assert text.exit_code == 1
    lines = text.stdout.splitlines()
    assert "delivery_lost: 1" in lines and "FAILED: 1 lost (runs without a delivery state)" in lines
    assert f"  lost {rid(job, t + 480 * S)} attempt=0" in lines
    assert f"  dead {rid(job, t + 120 * S)} attempt=5 last_error='HTTP 500'" in lines
    assert f"  stale {rid(job, t + 360 * S)} attempt=2 leased_until={format_instant(now - 600 * S)} worker=w9" in lines


def test_verify_delivery_passes_when_nothing_is_lost(pg_dsn, conn) -> None:
    t, now, job = delivery_window(conn)
    since, until = format_instant(t), format_instant(t + 600 * S)
    result = run(["verify", "--since", since, "--until", until, "--delivery"], pg_dsn)
    assert result.exit_code == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[-14:] == [
        "delivery_runs: 10",
        "delivery_succeeded: 3",
        "delivery_dead: 1",
        "delivery_canceled: 1",
        "delivery_pending: 1",
        "delivery_leased: 2",
        "delivery_failed: 1",
        "delivery_lost: 0",
        "delivery_predelivery: 1",
        "delivery_stale: 1",
        f"delivery_state_since: {format_instant(t + 60 * S)}",
        f"  dead {rid(job, t + 120 * S)} attempt=5 last_error='HTTP 500'",
        f"  canceled {rid(job, t + 180 * S)} attempt=1",
        f"  stale {rid(job, t + 360 * S)} attempt=2 leased_until={format_instant(now - 600 * S)} worker=w9",
    ]
    assert "delivery_lost: 0" in lines and not any(line.startswith("FAILED") for line in lines)


def test_verify_delivery_of_a_window_before_delivery(conn) -> None:
    now = store_now(conn).replace(microsecond=0)
    job = add(conn)
    for k in range(3):
        insert_run(conn, job, now - (3600 - k) * S, state=None)
    report = verify_delivery(conn, now - 3600 * S, now - 3000 * S, lease_ttl_s=10.0)
    assert (report.runs, report.predelivery, report.lost, report.state_since, report.ok) == (3, 3, 0, None, True)


# ---------------------------------------------------------------- gauges


def queue_depths(metrics: Metrics) -> dict[str, float]:
    """The queue-depth gauge's series: tenant label → runs."""
    return {
        sample.labels["tenant"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "scheduler_delivery_queue_depth_runs"
        for sample in family.samples
    }


def test_delivery_gauges_bound_the_tenant_labels(pg_dsn, conn) -> None:
    now = store_now(conn)
    expected: dict[str, int] = {}
    for n in range(23):  # tenant t00 has 1 pending run, t22 has 23
        tenant = f"t{n:02}"
        job = add(conn, tenant)
        for k in range(n + 1):
            insert_run(conn, job, now - (k + 1) * S, tenant=tenant, queue=None if k % 2 else "default")
        expected[tenant] = n + 1
    job = add(conn, "t22")
    insert_run(conn, job, now, tenant="t22", state="leased", leased_until=now)
    insert_run(conn, job, now - S, tenant="t22", state="failed")
    insert_run(conn, job, now - 2 * S, tenant="t22", state="failed")
    insert_run(conn, job, now - 3 * S, tenant="t22", state="dead")
    assert views.read_depths(conn) == (expected, {"leased": 1, "failed": 2})
    metrics = Metrics()
    gauges = views.DeliveryGauges(lambda: store.connect(pg_dsn), metrics)
    gauges.refresh()
    depth = queue_depths(metrics)
    assert depth == {**{f"t{n:02}": n + 1 for n in range(3, 23)}, "other": 1 + 2 + 3}
    assert metrics.value("scheduler_delivery_runs_in_flight", {"state": "leased"}) == 1
    assert metrics.value("scheduler_delivery_runs_in_flight", {"state": "failed"}) == 2
    # a tenant that leaves the top 20 leaves the exposition
    conn.execute("UPDATE runs SET state = 'succeeded' WHERE tenant = 't22'")
    gauges.refresh()
    depth = queue_depths(metrics)
    assert depth == {**{f"t{n:02}": n + 1 for n in range(2, 22)}, "other": 1 + 2}
    assert metrics.value("scheduler_delivery_runs_in_flight", {"state": "failed"}) == 0


def test_depth_labels_ties_by_name() -> None:
    assert views.depth_labels({"b": 2, "a": 2, "c": 1}, top=2) == {"a": 2, "b": 2, "other": 1}
    assert views.depth_labels({}, top=2) == {"other": 0}


def test_cancel_a_pending_leased_or_failed_run(pg_dsn, conn) -> None:
    """``runs cancel RUN_ID``: an unfinished run ends ``canceled`` (finished now, lease ended,
    why in last_error); a pending one is never claimed, a leased one's token answers
    ``canceled`` to its worker's heartbeat and ack (its handler learns it, as with
    overlap ``replace``). Nothing else changes."""
    job = add(conn)
    key = functools.partial(lifecycle.RunKey.of, job)
    insert_run(conn, job, T0, available_at=T0)
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, now=T0 + S)
    assert claimed.key == key(T0)
    insert_run(conn, job, T0 + 60 * S, available_at=T0)
    insert_run(conn, job, T0 + 120 * S, state="failed", attempt=1, last_error="HTTP 503", available_at=T0)
    insert_run(conn, job, T0 + 180 * S, available_at=T0)
    before = store_now(conn)
    result = run(["runs", "cancel", key(T0).run_id], pg_dsn)
    assert (result.exit_code, result.stdout, result.stderr) == (0, key(T0).run_id + "\n", "canceled 1 run\n")
    row = run_row(conn, job, T0)
    assert row["state"] == "canceled" and row["leased_until"] is None and row["finished_at"] >= before
    assert (row["lease_token"], row["attempt"]) == (claimed.token, 1)
    assert row["last_error"] == "canceled by scheduler runs cancel"
    assert lifecycle.heartbeat(conn, [(key(T0), claimed.token)]) == {key(T0).run_id: "canceled"}
    assert lifecycle.ack(conn, [(key(T0), claimed.token)]) == {key(T0).run_id: "canceled"}
    assert views.cancel(conn, key(T0 + 60 * S).run_id) == key(T0 + 60 * S).run_id
    assert views.cancel(conn, key(T0 + 120 * S).run_id, by="an API key") == key(T0 + 120 * S).run_id
    assert run_row(conn, job, T0 + 120 * S)["last_error"] == "canceled by an API key"
    claimable = lifecycle.claim(conn, tenant="acme", queue="default", worker="w2", limit=10, now=T0 + 2 * S)
    assert [c.key for c in claimable] == [key(T0 + 180 * S)]
    # A canceled run can be redriven like any other.
    assert views.redrive(conn, key(T0 + 60 * S).run_id) == key(T0 + 60 * S).run_id


def test_cancel_refuses_a_finished_or_unknown_run_changing_nothing(pg_dsn, conn) -> None:
    assert_refused(
        pg_dsn,
        conn,
        "cancel",
        ("succeeded", "dead", "canceled"),
        "only a pending, leased or failed run can be canceled",
        attempt=1,
        finished_at=T0,
    )
    theirs = add(conn, tenant="globex")
    insert_run(conn, theirs, T0, state="pending", available_at=T0, tenant="globex")
    with pytest.raises(NotFoundError, match=f"^run_id: no run {rid(theirs, T0)}$"):
        views.cancel(conn, rid(theirs, T0), tenant="acme")  # another tenant's run is a missing one
    assert run_row(conn, theirs, T0)["state"] == "pending"
