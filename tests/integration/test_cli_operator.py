"""What a new operator hit (issue 11, item 10): idempotent import, bulk delete,
input that must be refused, one exit-code rule, guarded downgrade, ``db
current``, BOM CSVs and keyword DSNs, unknown tenants; and what a fresh-user
trial found after: every command exits 2 for a store it cannot use (a DSN
libpq would misparse or cannot parse, refused authentication, a missing
database, a schema missing or behind head), ``db upgrade REVISION``, a
downgrade target above the store's revision, a downgrade to where the store is.

Commands run in process through ``click.testing.CliRunner`` like
tests/integration/test_cli.py; every assertion is on exact output, exit
status and store contents.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from urllib.parse import urlsplit

import psycopg
import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from helpers import closed_port
from psycopg.conninfo import conninfo_to_dict

from scheduler import cli as climod
from scheduler import jobs, store
from scheduler.cli import cli
from scheduler.migrate import alembic_config
from scheduler.spec import JobSpec

HEAD = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()
"""The newest migration revision (scheduler db current prints it)."""


def run(args: list[str], dsn: str | None = None, input: str | None = None):
    """Invoke the CLI in process; no SCHEDULER_* variable leaks in from the environment."""
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    if dsn is not None:
        env["SCHEDULER_DSN"] = dsn
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False, input=input)


def one_line_error(result, status: int, prefix: str) -> str:
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def count(conn: psycopg.Connection, table: str, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) AS c FROM {table} WHERE {where}").fetchone()["c"]  # noqa: S608


def derived_name(tenant: str, expr: str, dialect: str, tz: str, occurrence: int) -> str:
    """The documented import name, computed independently of scheduler/jobs.py."""
    digest = hashlib.sha256("\x1f".join([tenant, expr, dialect, tz]).encode("utf-8")).hexdigest()
    return f"import:{digest[:16]}:{occurrence}"


def keyword_dsn(uri: str, **extra: str) -> str:
    params = {**conninfo_to_dict(uri), **extra}
    return " ".join(f"{key}={value}" for key, value in params.items())


# ---------------------------------------------------------------- idempotent import

SMALL = (
    "expr,dialect,timezone\n"
    "0 1 * * *,unix5,\n"
    "0 1 * * *,unix5,UTC\n"
    "*/10 * * * * *,seconds6,Europe/Berlin\n"
    "*/60 * * * *,unix5,\n"
)


def test_import_twice_creates_nothing_the_second_time(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(SMALL, encoding="utf-8")

    first = run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn)
    assert first.exit_code == 0, first.stderr
    assert first.stdout == "3 created, 0 unchanged, 1 rejected\n"
    names = sorted(r["name"] for r in conn.execute("SELECT name FROM jobs").fetchall())
    # Lines 2 and 3 are the same schedule (empty zone = UTC): occurrences 1 and 2.
    assert names == sorted(
        [
            derived_name("acme", "0 1 * * *", "unix", "UTC", 1),
            derived_name("acme", "0 1 * * *", "unix", "UTC", 2),
            derived_name("acme", "*/10 * * * * *", "seconds", "Europe/Berlin", 1),
        ]
    )
    before = conn.execute("SELECT job_id, xmin::text AS tx FROM jobs ORDER BY job_id").fetchall()

    second = run(["jobs", "import", str(path), "--tenant", "acme", "--json"], pg_dsn)
    assert second.exit_code == 0, second.stderr
    report = json.loads(second.stdout)
    assert (report["created"], report["unchanged"]) == (0, 3)
    assert [r["line"] for r in report["rejected"]] == [5]
    # Nothing was rewritten: same rows, same inserting transactions.
    assert conn.execute("SELECT job_id, xmin::text AS tx FROM jobs ORDER BY job_id").fetchall() == before

    # One more identical line: only its (third) occurrence is new.
    path.write_text(SMALL + "0 1 * * *,macro,\n", encoding="utf-8")
    third = run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn)
    assert third.stdout == "1 created, 3 unchanged, 1 rejected\n"
    assert count(conn, "jobs", f"name = '{derived_name('acme', '0 1 * * *', 'unix', 'UTC', 3)}'") == 1
    assert count(conn, "jobs") == 4

    # Another tenant gets its own jobs for the same file.
    other = run(["jobs", "import", str(path), "--tenant", "globex"], pg_dsn)
    assert other.stdout == "4 created, 0 unchanged, 1 rejected\n"


def test_import_with_a_different_policy_reports_the_conflict_and_changes_nothing(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("expr,dialect,timezone\n0 2 * * *,unix5,\n", encoding="utf-8")
    assert run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn).exit_code == 0
    job = conn.execute("SELECT job_id, misfire FROM jobs").fetchone()
    again = run(["jobs", "import", str(path), "--tenant", "acme", "--misfire", "once"], pg_dsn)
    assert again.exit_code == 2  # every line rejected: nothing imported
    assert again.stdout == "0 created, 0 unchanged, 1 rejected\n"
    name = derived_name("acme", "0 2 * * *", "unix", "UTC", 1)
    assert again.stderr == (
        f"{path}:2: '0 2 * * *': name: job {name!r} of tenant 'acme' already exists "
        f"with a different spec (id {job['job_id']})\n"
        f"error: every line of {path} was rejected: nothing imported\n"
    )
    assert conn.execute("SELECT job_id, misfire FROM jobs").fetchall() == [job]


def test_an_import_whose_every_line_is_rejected_exits_2(pg_dsn, conn, tmp_path) -> None:
    """Nothing imported and some line rejected is a wrong request (exit 2, README's table), with
    the report as usual (text or --json); an import with one line taken exits 0."""
    bad = tmp_path / "bad.csv"
    bad.write_text("expr,dialect,timezone\n*/60 * * * *,unix5,\n0 2 * * *,unix5,Mars/X\n", encoding="utf-8")
    text = run(["jobs", "import", str(bad), "--tenant", "acme"], pg_dsn)
    assert (text.exit_code, text.stdout) == (2, "0 created, 0 unchanged, 2 rejected\n")
    assert [line.split(": ")[0] for line in text.stderr.splitlines()] == [f"{bad}:2", f"{bad}:3", "error"]
    assert text.stderr.splitlines()[-1] == f"error: every line of {bad} was rejected: nothing imported"
    as_json = run(["jobs", "import", str(bad), "--tenant", "acme", "--json"], pg_dsn)
    assert as_json.exit_code == 2
    assert [r["line"] for r in json.loads(as_json.stdout)["rejected"]] == [2, 3]
    assert as_json.stderr == f"error: every line of {bad} was rejected: nothing imported\n"
    assert count(conn, "jobs") == 0 and count(conn, "tenants", "tenant = 'acme'") == 0  # nothing written
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("expr,dialect,timezone\n*/60 * * * *,unix5,\n0 2 * * *,unix5,\n", encoding="utf-8")
    assert run(["jobs", "import", str(mixed), "--tenant", "acme"], pg_dsn).exit_code == 0
    empty = tmp_path / "empty.csv"
    empty.write_text("expr,dialect,timezone\n", encoding="utf-8")
    assert run(["jobs", "import", str(empty), "--tenant", "acme"], pg_dsn).exit_code == 0


def test_import_name_column(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "named.csv"
    path.write_text(
        "job,expr,dialect,timezone\n"
        "nightly,0 2 * * *,unix5,Europe/Berlin\n"
        "hourly,0 * * * *,unix5,\n"
        ",0 3 * * *,unix5,\n"
        "nightly,0 4 * * *,unix5,\n",
        encoding="utf-8",
    )
    result = run(["jobs", "import", str(path), "--tenant", "acme", "--name-column", "job"], pg_dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "2 created, 0 unchanged, 2 rejected\n"
    assert result.stderr.splitlines() == [
        f"{path}:4: '0 3 * * *': name: the 'job' column is empty",
        f"{path}:5: '0 4 * * *': name: 'nightly' is already used by line 2 of this file",
    ]
    rows = conn.execute("SELECT name, cron_expr, tz FROM jobs ORDER BY name").fetchall()
    assert [(r["name"], r["cron_expr"], r["tz"]) for r in rows] == [
        ("hourly", "0 * * * *", "UTC"),
        ("nightly", "0 2 * * *", "Europe/Berlin"),
    ]
    again = run(["jobs", "import", str(path), "--tenant", "acme", "--name-column", "job"], pg_dsn)
    assert again.stdout == "0 created, 2 unchanged, 2 rejected\n"
    assert count(conn, "jobs") == 2

    missing = run(["jobs", "import", str(path), "--tenant", "acme", "--name-column", "nosuch"], pg_dsn)
    one_line_error(missing, 2, "error: name_column: the CSV header has no column 'nosuch'")


def test_an_import_refuses_a_header_with_an_unknown_or_repeated_column(pg_dsn, conn, tmp_path) -> None:
    """A misspelled column (``max_attemps``) would silently drop the setting it was meant to
    carry: the header is refused whole, naming the column and the nearest known one, and nothing
    is written. The corpus format's provenance columns (source_kind, repo, path) are known and
    not used; a column named twice is refused (which one counts would be a guess); a header
    cell left empty (a spreadsheet's trailing comma) names nothing and is not used."""
    cases = [
        (
            "expr,max_attemps,overlapp\n*/7 * * * *,1,forbid\n",
            "error: columns: 'max_attemps' is not a known column (did you mean 'max_attempts'?)",
        ),
        (
            "expr,notes\n*/7 * * * *,hello\n",
            "error: columns: 'notes' is not a known column (known: expr, dialect, timezone, queue, url, "
            "method, headers, timeout_s, payload, max_attempts, backoff_base_s, backoff_cap_s, max_age_s, "
            "overlap; read, not used: source_kind, repo, path; a column of job names: give it as --name-column)",
        ),
        (
            "expr,job\n*/7 * * * *,n1\n",
            "error: columns: 'job' is not a known column (known: expr, dialect, timezone, queue, url, "
            "method, headers, timeout_s, payload, max_attempts, backoff_base_s, backoff_cap_s, max_age_s, "
            "overlap; read, not used: source_kind, repo, path; a column of job names: give it as --name-column)",
        ),
        (
            "expr,timezone,Timeout_S\n*/7 * * * *,,5\n",
            "error: columns: 'Timeout_S' is not a known column (did you mean 'timeout_s'?)",
        ),
        ("expr,dialect,expr\n*/7 * * * *,unix,0 1 * * *\n", "error: columns: 'expr' is named twice"),
        (
            "expr,tz\n*/7 * * * *,Europe/Berlin\n",
            "error: columns: 'tz' is not a known column (the column is 'timezone')",
        ),
        ("expr,cron\n*/7 * * * *,*/8 * * * *\n", "error: columns: 'cron' is not a known column (the column is 'expr')"),
    ]
    for text, message in cases:
        path = tmp_path / "cols.csv"
        path.write_text(text, encoding="utf-8")
        assert one_line_error(run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn), 2, message) == message
        assert count(conn, "jobs") == 0 and count(conn, "tenants", "tenant = 'acme'") == 0  # nothing written

    path = tmp_path / "ok.csv"
    path.write_text(
        "expr,dialect,timezone,source_kind,repo,path,max_attempts,\n*/7 * * * *,unix5,,k8s,a/b,c.yaml,2,\n",
        encoding="utf-8",
    )
    result = run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "1 created, 0 unchanged, 0 rejected\n", "")
    [row] = conn.execute("SELECT d.max_attempts FROM job_delivery AS d").fetchall()
    assert row["max_attempts"] == 2
    # A value with no column to say what it is (past the header's end, or under an empty header
    # cell) rejects its line (the trial: dropped without a word); empty cells there are fine.
    extra = tmp_path / "extra.csv"
    extra.write_text("expr,,queue\n*/9 * * * *,,q1\n*/10 * * * *,3,q2\n*/11 * * * *,,q3,forbid\n", encoding="utf-8")
    result = run(["jobs", "import", str(extra), "--tenant", "acme"], pg_dsn)
    assert (result.exit_code, result.stdout) == (0, "1 created, 0 unchanged, 2 rejected\n")
    assert result.stderr.splitlines() == [
        f"{extra}:3: '*/10 * * * *': csv: a value under an unnamed column (cell 2)",
        f"{extra}:4: '*/11 * * * *': csv: more cells than the header names (4 > 3)",
    ]
    assert [r["queue"] for r in conn.execute("SELECT queue FROM jobs ORDER BY queue").fetchall()] == ["default", "q1"]
    named = tmp_path / "named.csv"
    named.write_text("job,expr\nn1,*/7 * * * *\n", encoding="utf-8")
    assert run(["jobs", "import", str(named), "--tenant", "acme", "--name-column", "job"], pg_dsn).exit_code == 0


def test_import_is_set_based_per_batch(conn, tmp_path, monkeypatch) -> None:
    path = tmp_path / "five.csv"
    path.write_text("expr,dialect,timezone\n" + "".join(f"{m} 1 * * *,unix5,\n" for m in range(5)), encoding="utf-8")
    calls: list[str] = []
    real = store.execute

    def execute(c, name, params=None, **kwargs):
        calls.append(name)
        return real(c, name, params, **kwargs)

    monkeypatch.setattr(store, "execute", execute)
    report = jobs.import_csv(conn, path, "acme", batch_size=2)
    assert (len(report.created), len(report.unchanged), report.rejected) == (5, 0, [])
    # Three batches (2 + 2 + 1): one lookup of existing names each, never one per line.
    assert calls.count("find_jobs_by_names") == 3
    assert "find_job_by_name" not in calls
    assert [
        r["n"]
        for r in conn.execute("SELECT count(*) AS n FROM jobs GROUP BY xmin::text ORDER BY count(*) DESC").fetchall()
    ] == [2, 2, 1]
    calls.clear()
    report = jobs.import_csv(conn, path, "acme", batch_size=2)
    assert (len(report.created), len(report.unchanged)) == (0, 5)
    assert calls.count("find_jobs_by_names") == 3


def test_import_accepts_a_utf8_bom(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("expr,dialect,timezone\r\n0 5 * * *,unix5,Europe/Zurich\r\n".encode("utf-8-sig"))
    result = run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "1 created, 0 unchanged, 0 rejected\n", "")
    row = conn.execute("SELECT cron_expr, tz FROM jobs").fetchone()
    assert (row["cron_expr"], row["tz"]) == ("0 5 * * *", "Europe/Zurich")


# ---------------------------------------------------------------- bulk delete


def add(conn: psycopg.Connection, tenant: str, name: str | None = None) -> uuid.UUID:
    return jobs.add_job(conn, JobSpec.build(tenant=tenant, interval_s=60, name=name)).job_id


def live(conn: psycopg.Connection) -> list[tuple[str, str | None]]:
    return [
        (r["tenant"], r["name"])
        for r in conn.execute("SELECT tenant, name FROM jobs WHERE deleted_at IS NULL ORDER BY tenant, name").fetchall()
    ]


def test_bulk_delete_all_of_a_tenant(pg_dsn, conn) -> None:
    for name in ("a", "b", None):
        add(conn, "acme", name)
    add(conn, "globex", "a")
    before = {r["job_id"]: r["revision"] for r in conn.execute("SELECT job_id, revision FROM jobs").fetchall()}

    result = run(["jobs", "delete", "--tenant", "acme", "--all", "--yes"], pg_dsn)
    assert (result.exit_code, result.stdout) == (0, "deleted 3 jobs of tenant acme\n"), result.stderr
    assert live(conn) == [("globex", "a")]
    rows = conn.execute("SELECT * FROM jobs WHERE tenant = 'acme'").fetchall()
    # The soft delete of a single `jobs delete`: row kept, no next slot, revision bumped.
    assert all(r["deleted_at"] is not None and r["deleted_at"] == r["changed_at"] for r in rows)
    assert all(r["next_nominal_at"] is None and r["next_due_at"] is None for r in rows)
    assert all(r["revision"] == before[r["job_id"]] + 1 for r in rows)

    again = run(["jobs", "delete", "--tenant", "acme", "--all", "--yes"], pg_dsn)
    assert (again.exit_code, again.stdout) == (0, "deleted 0 jobs of tenant acme\n")


def test_bulk_delete_by_name_prefix_takes_the_prefix_literally(pg_dsn, conn) -> None:
    for name in ("nightly-1", "nightly-2", "nightly_x", "nightlyX", "weekly", None):
        add(conn, "acme", name)
    add(conn, "globex", "nightly-1")
    result = run(["jobs", "delete", "--tenant", "acme", "--name-prefix", "nightly-", "--yes"], pg_dsn)
    assert (result.exit_code, result.stdout) == (0, "deleted 2 jobs of tenant acme named nightly-*\n")
    assert live(conn) == [
        ("acme", "nightlyX"),
        ("acme", "nightly_x"),
        ("acme", "weekly"),
        ("acme", None),
        ("globex", "nightly-1"),
    ]
    percent = run(["jobs", "delete", "--tenant", "acme", "--name-prefix", "nightly%", "--yes"], pg_dsn)
    assert percent.stdout == "deleted 0 jobs of tenant acme named nightly%*\n"
    under = run(["jobs", "delete", "--tenant", "acme", "--name-prefix", "nightly_", "--yes"], pg_dsn)
    assert under.stdout == "deleted 1 job of tenant acme named nightly_*\n"


def test_bulk_delete_of_imported_jobs(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(SMALL, encoding="utf-8")
    run(["jobs", "import", str(path), "--tenant", "acme"], pg_dsn)
    add(conn, "acme", "mine")
    result = run(["jobs", "delete", "--tenant", "acme", "--name-prefix", "import:", "--yes"], pg_dsn)
    assert result.stdout == "deleted 3 jobs of tenant acme named import:*\n"
    assert live(conn) == [("acme", "mine")]


def test_bulk_delete_needs_confirmation(pg_dsn, conn, monkeypatch) -> None:
    for name in ("a", "b"):
        add(conn, "acme", name)
    refused = run(["jobs", "delete", "--tenant", "acme", "--all"], pg_dsn)
    line = one_line_error(refused, 2, "error: yes: ")
    assert line == ("error: yes: deleting 2 jobs of tenant acme needs confirmation; pass --yes (no terminal to ask on)")
    assert refused.stdout == ""
    assert len(live(conn)) == 2

    monkeypatch.setattr(climod, "_stdin_is_tty", lambda: True)
    declined = run(["jobs", "delete", "--tenant", "acme", "--all"], pg_dsn, input="n\n")
    assert declined.exit_code == 2
    assert declined.stdout == "Delete 2 jobs of tenant acme? [y/N]: n\n"
    assert declined.stderr == "error: yes: not confirmed; nothing deleted\n"
    assert len(live(conn)) == 2
    confirmed = run(["jobs", "delete", "--tenant", "acme", "--all"], pg_dsn, input="y\n")
    assert confirmed.exit_code == 0
    assert confirmed.stdout == "Delete 2 jobs of tenant acme? [y/N]: y\ndeleted 2 jobs of tenant acme\n"
    assert live(conn) == []


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["--tenant", "acme"], "error: delete: give exactly one of JOB_ID, --all or --name-prefix"),
        (
            ["--tenant", "acme", "--all", "--name-prefix", "x"],
            "error: delete: give exactly one of JOB_ID, --all or --name-prefix",
        ),
        (
            [str(uuid.UUID(int=1)), "--all", "--tenant", "acme"],
            "error: delete: give exactly one of JOB_ID, --all or --name-prefix",
        ),
        (["--all"], "error: tenant: --all and --name-prefix need --tenant"),
        (["--tenant", "acme", "--name-prefix", ""], "error: name_prefix: must not be empty"),
        (["--tenant", "nosuch", "--all", "--yes"], "error: tenant: no tenant 'nosuch'"),
    ],
)
def test_bulk_delete_selectors(pg_dsn, conn, args, prefix) -> None:
    add(conn, "acme", "a")
    one_line_error(run(["jobs", "delete", *args], pg_dsn), 2, prefix)
    assert live(conn) == [("acme", "a")]


def test_bulk_delete_is_batched(conn, monkeypatch) -> None:
    for _ in range(5):
        add(conn, "acme")
    monkeypatch.setattr(jobs, "DELETE_BATCH", 2)
    assert jobs.delete_jobs(conn, "acme") == 5
    # Three transactions (2 + 2 + 1), each one statement for its batch.
    assert [
        r["n"]
        for r in conn.execute("SELECT count(*) AS n FROM jobs GROUP BY xmin::text ORDER BY count(*) DESC").fetchall()
    ] == [2, 2, 1]


# ---------------------------------------------------------------- refused input


def test_empty_tz_is_refused(pg_dsn, conn) -> None:
    one_line_error(
        run(["jobs", "add", "--tenant", "acme", "--cron", "0 1 * * *", "--tz", ""], pg_dsn),
        2,
        "error: tz: time zone must be a non-empty IANA zone name",
    )
    assert count(conn, "jobs") == 0


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (
            ["jobs", "add", "--tenant", "acme", "--interval", "٦٠"],
            "error: interval: must be a whole number of seconds in ASCII digits (got '٦٠')",
        ),
        (
            ["jobs", "add", "--tenant", "acme", "--interval", "60", "--jitter", "٣"],
            "error: jitter: must be a whole number of seconds in ASCII digits (got '٣')",
        ),
        (
            ["jobs", "add", "--tenant", "acme", "--interval", "1e3"],
            "error: interval: must be a whole number of seconds in ASCII digits (got '1e3')",
        ),
        (
            ["jobs", "list", "--limit", "١٠"],
            "error: limit: must be a whole number from 1 to 1000000 in ASCII digits (got '١٠')",
        ),
        (
            ["tenants", "add", "acme", "--weight", "٢"],
            "error: weight: must be a whole number from 1 to 1000 in ASCII digits (got '٢')",
        ),
        (
            ["tenants", "add", "acme", "--max-rate", "٥"],
            "error: max_rate: must be a number of runs per second > 0 and <= 1000000000 in ASCII digits (got '٥')",
        ),
    ],
)
def test_non_ascii_digits_are_refused(pg_dsn, conn, args, prefix) -> None:
    assert int("٦٠") == 60  # what Python alone would accept
    one_line_error(run(args, pg_dsn), 2, prefix)
    assert count(conn, "jobs") == 0 and count(conn, "tenants") == 0


def test_jobs_next_count_refuses_non_ascii_digits() -> None:
    result = run(["jobs", "next", "--cron", "0 1 * * *", "--after", "2030-01-01T00:00:00Z", "--count", "٣"])
    one_line_error(result, 2, "error: count: must be a whole number from 1 to 10000 in ASCII digits (got '٣')")


def test_huge_integers_are_echoed_as_typed(pg_dsn) -> None:
    result = run(["jobs", "add", "--tenant", "acme", "--interval", "99999999999999999999"], pg_dsn)
    assert one_line_error(result, 2, "error: interval:") == (
        "error: interval: must be at most 3153600000 seconds (100 years) (got '99999999999999999999')"
    )
    grace = run(
        [
            "jobs",
            "add",
            "--tenant",
            "acme",
            "--interval",
            "60",
            "--misfire",
            "skip",
            "--misfire-grace-s",
            "99999999999999999999",
        ],
        pg_dsn,
    )
    assert one_line_error(grace, 2, "error: misfire_grace_s:") == (
        "error: misfire_grace_s: must be at most 2147483647 seconds (got '99999999999999999999')"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--misfire-grace-s", "30"],
            "error: misfire_grace_s: --misfire-grace-s is ignored by --misfire all (it applies to once and skip)",
        ),
        (
            ["--misfire", "all", "--misfire-grace-s", "30"],
            "error: misfire_grace_s: --misfire-grace-s is ignored by --misfire all (it applies to once and skip)",
        ),
        (
            ["--misfire", "skip", "--catchup-window-s", "600"],
            "error: catchup_window_s: --catchup-window-s is ignored by --misfire skip (it applies to all only)",
        ),
        (
            ["--misfire", "once", "--catchup-window-s", "600"],
            "error: catchup_window_s: --catchup-window-s is ignored by --misfire once (it applies to all only)",
        ),
    ],
)
def test_an_option_the_policy_ignores_is_refused(pg_dsn, conn, args, line) -> None:
    result = run(["jobs", "add", "--tenant", "acme", "--interval", "60", *args], pg_dsn)
    assert one_line_error(result, 2, "error: ") == line
    assert count(conn, "jobs") == 0


def test_options_the_policy_uses_are_stored(pg_dsn, conn) -> None:
    for args in (
        ["--misfire", "all", "--catchup-window-s", "600"],
        ["--misfire", "skip", "--misfire-grace-s", "5"],
        ["--misfire", "once", "--misfire-grace-s", "7"],
    ):
        assert run(["jobs", "add", "--tenant", "acme", "--interval", "60", *args], pg_dsn).exit_code == 0
    rows = conn.execute("SELECT misfire, catchup_window_s, misfire_grace_s FROM jobs ORDER BY misfire").fetchall()
    assert [(r["misfire"], r["catchup_window_s"], r["misfire_grace_s"]) for r in rows] == [
        ("all", 600, 60),
        ("once", 86400, 7),
        ("skip", 86400, 5),
    ]
    with pytest.raises(Exception) as caught:
        JobSpec.build(tenant="acme", interval_s=60, misfire="all", misfire_grace_s=30)
    assert str(caught.value).startswith("misfire_grace_s: --misfire-grace-s is ignored by --misfire all")


def test_long_inputs_are_cut_in_errors(pg_dsn) -> None:
    expr = "1" * 10_000
    result = run(["jobs", "next", "--cron", expr, "--after", "2030-01-01T00:00:00Z"])
    line = one_line_error(result, 2, "error: cron: ")
    assert line.endswith(f"(got '{'1' * 80}…' (10000 characters))"), line
    assert len(line) < 300
    tz = run(["jobs", "add", "--tenant", "acme", "--cron", "0 1 * * *", "--tz", "Z" * 10_000], pg_dsn)
    assert len(one_line_error(tz, 2, "error: tz: ")) < 300
    misfire = run(["jobs", "add", "--tenant", "acme", "--interval", "60", "--misfire", "x" * 10_000], pg_dsn)
    assert len(one_line_error(misfire, 2, "error: ")) < 300
    interval = run(["jobs", "add", "--tenant", "acme", "--interval", "9" * 10_000], pg_dsn)
    assert len(one_line_error(interval, 2, "error: interval: ")) < 300


# ---------------------------------------------------------------- exit codes


def test_a_wrong_request_exits_2(pg_dsn, conn) -> None:
    missing = uuid.UUID(int=7)
    for command in (["show"], ["pause"], ["resume"], ["delete"]):
        one_line_error(run(["jobs", *command, str(missing)], pg_dsn), 2, f"error: job_id: no job {missing}")
    add(conn, "acme", "nightly")
    one_line_error(
        run(["jobs", "add", "--tenant", "acme", "--cron", "0 3 * * *", "--name", "nightly"], pg_dsn),
        2,
        "error: name: job 'nightly' of tenant 'acme' already exists",
    )
    one_line_error(run(["tenants", "set", "initech", "--weight", "2"], pg_dsn), 2, "error: tenant: no tenant")
    one_line_error(run(["db", "upgrade", "--revision", "nosuch"], pg_dsn), 2, "error: revision: ")
    one_line_error(run(["db", "downgrade", "nosuch", "--yes"], pg_dsn), 2, "error: revision: ")


def test_a_failed_system_exits_1(empty_pg_dsn) -> None:
    unreachable = f"postgresql://nobody:SuperSecret42@127.0.0.1:{closed_port()}/nowhere"
    line = one_line_error(run(["jobs", "list"], unreachable), 1, "error: cannot connect to the store")
    assert "SuperSecret42" not in line
    line = one_line_error(run(["db", "upgrade"], unreachable), 1, "error: cannot connect to the store")
    assert "SuperSecret42" not in line
    with psycopg.connect(empty_pg_dsn, autocommit=True) as c:  # a table in the way of revision 0006
        c.execute("CREATE TABLE jobs (x int)")
    one_line_error(run(["db", "upgrade"], empty_pg_dsn), 1, f"error: migration to {HEAD} failed")


def test_an_unmigrated_store_exits_2_with_the_hint(empty_pg_dsn) -> None:
    line = one_line_error(run(["jobs", "list"], empty_pg_dsn), 2, "error: store: the schema is missing")
    assert line == "error: store: the schema is missing (no alembic_version table); run `scheduler db upgrade` first"


STORE_COMMANDS = [
    ["db", "upgrade"],
    ["db", "current"],
    ["db", "downgrade", "0013", "--yes"],
    ["status"],
    ["jobs", "list"],
    ["jobs", "add", "--tenant", "acme", "--interval", "60"],
    ["verify", "--since", "2030-01-01T00:00:00Z", "--until", "2030-01-02T00:00:00Z"],
    ["tenants", "list"],
    ["runs", "prune", "--older-than", "7d"],
]
"""Commands that use the store, each in its own way of opening it (CLI session, migrations)."""

DSN_RULE = (
    "error: dsn: a URI may hold '@' only once, between the user info and the host: percent-encode "
    "@ : / ? # in the user name and password (e.g. @ as %40)"
)
SETTING_HINT = (
    "a setting of the DSN (or of PGOPTIONS, PGSSLMODE and the other PG* environment variables) "
    "has a value libpq or the server refuses: fix the one it names"
)
AUTH_HINT = "check the DSN's user and password (in a URI, percent-encode @ : / ? # % in the password, e.g. @ as %40)"


def _bad_setting(pg_dsn: str, case: str) -> tuple[str, str | tuple[str, str]]:
    """(DSN, the one error line of every store command: exact, or its (start, end))."""
    parts = urlsplit(pg_dsn)
    server = f"{parts.hostname}:{parts.port}"
    missing = f"postgresql://{parts.netloc}/no_such_database_here"
    return {
        "at and slash": (f"postgresql://op:Sup3r@S3cret/Path@{server}{parts.path}", DSN_RULE),
        "question mark": (f"postgresql://op:Sup3r?S3cret@{server}{parts.path}", DSN_RULE),
        "short piece": (f"postgresql://op:k3y@1@{server}{parts.path}", DSN_RULE),
        "garbage": (
            "garbage",
            "error: dsn: must be a URI (postgresql://user:password@host:5432/dbname) or libpq "
            'keywords (host=... dbname=...); libpq: missing "=" after "garbage" in connection '
            "info string",
        ),
        "mysql": (
            f"mysql://x:y@{server}/db",
            "error: dsn: must be a URI (postgresql://user:password@host:5432/"
            "dbname) or libpq keywords (host=... dbname=...); libpq: missing "
            f'"=" after "mysql://x:***@{server}/db" in connection info string',
        ),
        "unknown role": (
            f"postgresql://nobody_here:Sup3rS3cret@{server}{parts.path}",
            (
                f"error: store: cannot connect to the store at postgresql://nobody_here:***@{server}{parts.path}: ",
                f'role "nobody_here" does not exist; {AUTH_HINT}',
            ),
        ),
        "port out of range": (  # refused as written, before connecting (libpq: at connect)
            f"postgresql://{parts.username or 'postgres'}@{parts.hostname}:99999{parts.path}",
            "error: dsn: each port must be a whole number from 1 to 65535 (got '99999')",
        ),
        "bad sslmode": (
            f"{pg_dsn}?sslmode=bogus",
            (
                "error: store: cannot connect to the store at ",
                f'invalid sslmode value: "bogus"; {SETTING_HINT}',
            ),
        ),
        "bad server option": (
            f"{pg_dsn}?options=-cfoo",
            (
                "error: store: cannot connect to the store at ",
                f"-c foo requires a value; {SETTING_HINT}",
            ),
        ),
        "missing database": (
            missing,
            (
                f"error: store: cannot connect to the store at {store.redact_dsn(missing)}: ",
                'database "no_such_database_here" does not exist; create the database, then run `scheduler db upgrade`',
            ),
        ),
    }[case]


@pytest.mark.parametrize(
    "case",
    [
        "at and slash",
        "question mark",
        "short piece",
        "garbage",
        "mysql",
        "unknown role",
        "port out of range",
        "bad sslmode",
        "bad server option",
        "missing database",
    ],
)
def test_a_store_that_cannot_be_used_as_configured_exits_2_for_every_command(pg_dsn, conn, case) -> None:
    dsn, expected = _bad_setting(pg_dsn, case)
    for command in STORE_COMMANDS:
        result = run(command, dsn)
        line = one_line_error(result, 2, "error: ")
        if isinstance(expected, tuple):
            assert line.startswith(expected[0]) and line.endswith(expected[1]), (command, line)
        else:  # a DSN refused as written names where it was set (run() passes it as SCHEDULER_DSN)
            assert line == f"{expected}; set by SCHEDULER_DSN", (command, line)
        assert result.stdout == ""
        for piece in ("Sup3r", "S3cret", "k3y", "'1@", "x:y@"):
            assert piece not in line, (command, line)
    assert count(conn, "jobs") == 0 and count(conn, "tenants") == 0
    assert conn.execute("SELECT version_num FROM alembic_version").fetchone()["version_num"] == HEAD


SCHEMA_COMMANDS = [
    ["jobs", "add", "--tenant", "acme", "--interval", "60"],
    ["jobs", "add", "--tenant", "acme", "--interval", "60", "--name", "n", "--replace"],
    ["jobs", "list"],
    ["jobs", "show", str(uuid.UUID(int=1))],
    ["tenants", "list"],
    ["tenants", "add", "acme"],
    ["runs", "list"],
    ["runs", "prune", "--older-than", "7d"],
    ["verify", "--since", "2030-01-01T00:00:00Z", "--until", "2030-01-02T00:00:00Z"],
    ["status"],
]


def test_a_schema_behind_head_exits_2_for_every_command(pg_dsn, conn) -> None:
    conn.execute("UPDATE alembic_version SET version_num = '0012'")
    for command in SCHEMA_COMMANDS:
        line = one_line_error(run(command, pg_dsn), 2, "error: store: ")
        assert line == (
            f"error: store: the schema is at revision 0012, behind this version's {HEAD}; "
            "run `scheduler db upgrade` first"
        ), (command, line)
    assert count(conn, "jobs") == 0 and count(conn, "tenants") == 0


def test_a_schema_newer_than_the_code_is_used(pg_dsn, conn) -> None:
    conn.execute("UPDATE alembic_version SET version_num = '9999_from_a_newer_release'")
    added = run(["jobs", "add", "--tenant", "acme", "--interval", "60"], pg_dsn)
    assert added.exit_code == 0, added.stderr
    listed = run(["jobs", "list", "--json"], pg_dsn)
    assert listed.exit_code == 0, listed.stderr
    assert [row["job_id"] for row in json.loads(listed.stdout)] == [added.stdout.strip()]


# ---------------------------------------------------------------- db downgrade / current


def test_db_downgrade_of_a_store_with_jobs_needs_yes(pg_dsn, conn) -> None:
    add(conn, "acme", "a")
    add(conn, "acme", "b")
    jobs.delete_job(conn, add(conn, "acme", "c"))
    refused = run(["db", "downgrade", "base"], pg_dsn)
    assert one_line_error(refused, 2, "error: yes: ") == (
        "error: yes: the store holds 2 live jobs; downgrading to base drops the jobs table and loses them: "
        "pass --yes to confirm"
    )
    assert count(conn, "jobs") == 3
    partial = run(["db", "downgrade", "0013"], pg_dsn)
    assert one_line_error(partial, 2, "error: yes: ") == (
        "error: yes: the store holds 2 live jobs; downgrading to 0013 drops schema the running version "
        "needs: pass --yes to confirm"
    )
    done = run(["db", "downgrade", "0013", "--yes"], pg_dsn)
    assert (done.exit_code, done.stdout) == (0, "schema at 0013\n"), done.stderr
    assert count(conn, "jobs") == 3


def test_db_downgrade_to_the_stores_revision_does_nothing(pg_dsn, conn) -> None:
    add(conn, "acme", "a")
    result = run(["db", "downgrade", HEAD], pg_dsn)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"already at {HEAD}\n", "")
    assert run(["db", "current"], pg_dsn).stdout == f"{HEAD} (head)\n"
    assert live(conn) == [("acme", "a")]


def test_db_downgrade_above_the_stores_revision_exits_2(pg_dsn, conn) -> None:
    assert run(["db", "downgrade", "0012", "--yes"], pg_dsn).exit_code == 0
    line = one_line_error(run(["db", "downgrade", "0013", "--yes"], pg_dsn), 2, "error: revision: ")
    assert line == (
        "error: revision: must be at or below the store's revision 0012 "
        "(`scheduler db upgrade 0013` goes up) (got '0013')"
    )
    line = one_line_error(run(["db", "upgrade", "0010"], pg_dsn), 2, "error: revision: ")
    assert line == (
        "error: revision: must be at or above the store's revision 0012 "
        "(`scheduler db downgrade 0010` goes down) (got '0010')"
    )
    # a target only alembic resolves, which it refuses: the request was wrong too
    one_line_error(run(["db", "downgrade", "--yes", "--", "-99"], pg_dsn), 2, "error: revision: ")
    assert run(["db", "current"], pg_dsn).stdout == f"0012 (behind head {HEAD}: run `scheduler db upgrade`)\n"


def test_db_upgrade_takes_the_revision_as_an_argument(empty_pg_dsn) -> None:
    usage = CliRunner().invoke(cli, ["db", "upgrade", "--help"], prog_name="scheduler").stdout.splitlines()[0]
    assert usage == "Usage: scheduler db upgrade [OPTIONS] [REVISION]"
    result = run(["db", "upgrade", "0010"], empty_pg_dsn)
    assert (result.exit_code, result.stdout) == (0, "schema at 0010\n"), result.stderr
    assert run(["db", "current"], empty_pg_dsn).stdout == f"0010 (behind head {HEAD}: run `scheduler db upgrade`)\n"
    option = run(["db", "upgrade", "--revision", "0012"], empty_pg_dsn)
    assert (option.exit_code, option.stdout) == (0, "schema at 0012\n"), option.stderr
    one_line_error(
        run(["db", "upgrade", "0013", "--revision", "0014"], empty_pg_dsn),
        2,
        "error: revision: give it as REVISION or --revision, not both",
    )
    result = run(["db", "upgrade"], empty_pg_dsn)
    assert (result.exit_code, result.stdout) == (0, f"schema at {HEAD} (head)\n"), result.stderr
    assert run(["db", "current"], empty_pg_dsn).stdout == f"{HEAD} (head)\n"


def test_db_relative_revisions_are_resolved_before_anything_runs(pg_dsn, conn) -> None:
    """+N goes up, -N down, each resolved to the revision it reaches (printed);
    every other relative form is refused, so no warning is ever about a target
    that was not understood."""
    add(conn, "acme", "a")
    previous = f"{int(HEAD) - 1:04d}"
    for other in ("base+16", f"{previous}+1", "+1"):
        line = one_line_error(run(["db", "downgrade", "--yes", other], pg_dsn), 2, "error: revision: ")
        assert line == (
            "error: revision: a downgrade target is a revision id, base or -N "
            f"(N revisions below the store's) (got '{other}')"
        )
    one_line_error(run(["db", "upgrade", "--", "-1"], pg_dsn), 2, "error: revision: an upgrade target is a revision id")
    down = run(["db", "downgrade", "--yes", "--", "-2"], pg_dsn)
    assert (down.exit_code, down.stdout) == (0, f"schema at {int(HEAD) - 2:04d}\n"), down.stderr
    up = run(["db", "upgrade", "+1"], pg_dsn)
    assert (up.exit_code, up.stdout) == (0, f"schema at {previous}\n"), up.stderr
    beyond = one_line_error(run(["db", "upgrade", "+5"], pg_dsn), 2, "error: revision: ")
    assert beyond == f"error: revision: only 1 revision above the store's {previous} (got '+5')"
    assert live(conn) == [("acme", "a")]


def test_db_downgrade_of_an_empty_store_needs_no_yes(pg_dsn) -> None:
    result = run(["db", "downgrade", "base"], pg_dsn)
    assert (result.exit_code, result.stdout) == (0, "schema at base\n"), result.stderr


def test_db_current(pg_dsn, empty_pg_dsn) -> None:
    assert run(["db", "current"], pg_dsn).stdout == f"{HEAD} (head)\n"
    assert (
        run(["db", "current", "--json"], pg_dsn).stdout
        == json.dumps({"current": HEAD, "head": HEAD, "at_head": True}, indent=2) + "\n"
    )
    assert run(["db", "downgrade", "0012"], pg_dsn).exit_code == 0
    assert run(["db", "current"], pg_dsn).stdout == f"0012 (behind head {HEAD}: run `scheduler db upgrade`)\n"
    assert run(["db", "current"], empty_pg_dsn).stdout == (
        f"none (empty database; head is {HEAD}: run `scheduler db upgrade`)\n"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("UPDATE alembic_version SET version_num = '0099'")
    assert run(["db", "current"], pg_dsn).stdout == (
        f"0099 (unknown to this version, whose head is {HEAD}: a newer version migrated it)\n"
    )


# ---------------------------------------------------------------- keyword DSN, unknown tenant, weight rule


def test_db_upgrade_with_a_keyword_dsn(empty_pg_dsn, capfd) -> None:
    dsn = keyword_dsn(empty_pg_dsn, password="SuperSecret42")
    result = run(["db", "upgrade"], dsn)
    assert (result.exit_code, result.stdout) == (0, f"schema at {HEAD} (head)\n"), result.stderr
    assert run(["db", "current"], dsn).stdout == f"{HEAD} (head)\n"
    assert "SuperSecret42" not in result.stderr + capfd.readouterr().err
    unreachable = keyword_dsn(empty_pg_dsn, password="SuperSecret42", port=str(closed_port()))
    failed = run(["db", "upgrade"], unreachable)
    line = one_line_error(failed, 1, "error: cannot connect to the store")
    assert "SuperSecret42" not in line and "password=***" in line


def test_jobs_list_of_an_unknown_tenant(pg_dsn, conn) -> None:
    one_line_error(run(["jobs", "list", "--tenant", "nosuch"], pg_dsn), 2, "error: tenant: no tenant 'nosuch'")
    jobs.add_tenant(conn, "empty")
    result = run(["jobs", "list", "--tenant", "empty", "--json"], pg_dsn)
    assert (result.exit_code, json.loads(result.stdout)) == (0, [])


def test_tenant_weight_names_the_rule(pg_dsn, conn) -> None:
    for command in (["add", "acme"], ["set", "acme"]):
        line = one_line_error(run(["tenants", *command, "--weight", "abc"], pg_dsn), 2, "error: weight: ")
        assert line == "error: weight: must be a whole number from 1 to 1000 in ASCII digits (got 'abc')"
    one_line_error(
        run(["tenants", "add", "acme", "--weight", "1001"], pg_dsn),
        2,
        "error: weight: must be a whole number from 1 to 1000 in ASCII digits (got '1001')",
    )
    assert count(conn, "tenants") == 0


def test_a_role_without_privileges_on_the_schema_exits_2_with_the_fix(pg_dsn, conn) -> None:
    """A DSN whose role may log in but was granted nothing: a setting to fix, not an outage (exit 2)."""
    role = f"noperm_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{role}" LOGIN')  # noqa: S608 - a generated name
    try:
        parts = urlsplit(pg_dsn)
        dsn = f"postgresql://{role}@{parts.hostname}:{parts.port}{parts.path}"
        line = one_line_error(run(["jobs", "list"], dsn), 2, "error: ")
        assert line == (
            "error: store: permission denied for table alembic_version; the DSN's role lacks privileges on "
            'the scheduler\'s tables: grant them (docs/operations.md, "Deploy") or use the role that owns them'
        )
    finally:
        conn.execute(f'DROP ROLE "{role}"')  # noqa: S608
