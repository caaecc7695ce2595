"""Targets and payload against a real store (issue 14, item 1; docs/delivery.md, "Targets").

``jobs add`` with each delivery option stores exactly the expected ``jobs``
columns and ``job_delivery`` row; bad input (a payload over 64 kB, a URL
that reaches a loopback, private, link-local or metadata address without
``push_allow``) is one line on stderr and writes nothing (rows counted
before and after); changing a target or payload under ``--name`` is an
edit (``--replace``, revision bumped, pending slot kept), a rejected edit
changes no row; ``jobs import`` reads the same fields from CSV columns;
``jobs show``/``jobs list`` print the target, header names and never a
header value.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from click.testing import CliRunner
from helpers import OneNode

from scheduler import jobs, retention
from scheduler.cli import cli
from scheduler.delivery import lifecycle
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.ssrf import AddressPolicy
from scheduler.delivery.targets import DeliverySpec
from scheduler.errors import ValidationError
from scheduler.partition import partition_of
from scheduler.spec import JobSpec

PUBLIC = "https://93.184.216.34/hook"
DEFAULT_ROW = {
    "url": None,
    "method": None,
    "headers": None,
    "timeout_s": None,
    "payload": None,
    "max_attempts": 5,
    "backoff_base_s": 1.0,
    "backoff_cap_s": 300.0,
    "max_age_s": None,
}
SSRF = (
    "url: resolves to an address push targets may not reach (loopback, private, link-local, metadata "
    "or reserved); an operator may allow a network with push_allow"
)
METADATA = (
    "url: resolves to a cloud metadata address, which push targets may not reach; push_allow opens it only "
    "with an entry of /16 or narrower (/64 for IPv6), never through a wider network such as 0.0.0.0/0"
)


def run(args: list[str], dsn: str | None = None, input: str | bytes | None = None, env: dict | None = None):
    """Invoke the CLI in process; no SCHEDULER_* variable leaks in from the environment."""
    clean: dict[str, str | None] = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    if dsn is not None:
        clean["SCHEDULER_DSN"] = dsn
    clean.update(env or {})
    return CliRunner().invoke(cli, args, env=clean, catch_exceptions=False, input=input)


def add(dsn: str, *args: str, input: str | bytes | None = None, env: dict | None = None):
    return run(["jobs", "add", "--tenant", "acme", "--cron", "0 0 * * *", *args], dsn, input=input, env=env)


def one_line_error(result, status: int, line: str) -> None:
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    assert result.stderr.splitlines() == [line]


def tables(conn: psycopg.Connection) -> tuple[list[dict], ...]:
    """Every row the write paths could touch, for before/after comparisons."""
    return tuple(
        conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()  # noqa: S608
        for table in ("jobs", "job_delivery", "job_revisions", "tenants", "skips")
    )


def delivery_row(conn: psycopg.Connection, job_id: uuid.UUID) -> dict | None:
    row = conn.execute(
        "SELECT * FROM job_delivery WHERE partition_id = %s AND job_id = %s", (partition_of(job_id), job_id)
    ).fetchone()
    if row is None:
        return None
    assert (row.pop("partition_id"), row.pop("job_id")) == (partition_of(job_id), job_id)
    return row


def job_columns(conn: psycopg.Connection, job_id: uuid.UUID) -> tuple:
    row = conn.execute("SELECT queue, overlap, revision FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    return row["queue"], row["overlap"], row["revision"]


# ---------------------------------------------------------------- jobs add, option by option


@pytest.mark.parametrize(
    ("args", "queue", "overlap", "row"),
    [
        ([], "default", "allow", None),
        (["--queue", "emails"], "emails", "allow", None),
        (["--overlap", "forbid"], "default", "forbid", None),
        (["--overlap", "replace", "--queue", "q.1"], "q.1", "replace", None),
        (["--url", PUBLIC], None, "allow", {**DEFAULT_ROW, "url": PUBLIC, "method": "POST", "timeout_s": 10.0}),
        (
            ["--url", PUBLIC, "--method", "put", "--timeout-s", "2.5"],
            None,
            "allow",
            {**DEFAULT_ROW, "url": PUBLIC, "method": "PUT", "timeout_s": 2.5},
        ),
        (
            ["--url", PUBLIC, "--header", "Authorization: Bearer s3cret", "--header", "X-Team:blue"],
            None,
            "allow",
            {
                **DEFAULT_ROW,
                "url": PUBLIC,
                "method": "POST",
                "timeout_s": 10.0,
                "headers": {"Authorization": "Bearer s3cret", "X-Team": "blue"},
            },
        ),
        (
            ["--payload", '{"to": "ops", "n": [1, 2.5]}'],
            "default",
            "allow",
            {**DEFAULT_ROW, "payload": {"to": "ops", "n": [1, 2.5]}},
        ),
        (["--max-attempts", "9"], "default", "allow", {**DEFAULT_ROW, "max_attempts": 9}),
        (["--backoff-base-s", "0.25"], "default", "allow", {**DEFAULT_ROW, "backoff_base_s": 0.25}),
        (["--backoff-cap-s", "60"], "default", "allow", {**DEFAULT_ROW, "backoff_cap_s": 60.0}),
        (["--max-age-s", "1d12h"], "default", "allow", {**DEFAULT_ROW, "max_age_s": 129_600}),
        (["--max-age-s", "3600"], "default", "allow", {**DEFAULT_ROW, "max_age_s": 3_600}),
    ],
)
def test_add_stores_each_option_exactly(pg_dsn, conn, args, queue, overlap, row) -> None:
    result = add(pg_dsn, *args)
    assert (result.exit_code, result.stderr) == (0, ""), result.stderr
    job_id = uuid.UUID(result.stdout.strip())
    assert job_columns(conn, job_id) == (queue, overlap, 1)
    assert delivery_row(conn, job_id) == row
    assert conn.execute("SELECT count(*) AS c FROM job_delivery").fetchone()["c"] == (row is not None)


def test_method_is_post_or_put_in_any_case_and_help_says_so(pg_dsn, conn) -> None:
    helped = run(["jobs", "add", "--help"])
    assert "--method [POST|PUT]" in helped.stdout
    assert "its own push_allow" in " ".join(helped.stdout.split())
    mixed = add(pg_dsn, "--url", PUBLIC, "--method", "Put")
    assert (mixed.exit_code, mixed.stderr) == (0, "")
    assert delivery_row(conn, uuid.UUID(mixed.stdout.strip()))["method"] == "PUT"
    one_line_error(
        add(pg_dsn, "--url", PUBLIC, "--method", "get"), 2, "error: method: must be one of POST, PUT (got 'get')"
    )


def test_add_payload_from_a_file_and_from_stdin(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "payload.json"
    path.write_bytes(b'\xef\xbb\xbf{\n  "report": "daily",\n  "to": ["a@example.com"]\n}\n')
    from_file = uuid.UUID(add(pg_dsn, "--payload-file", str(path)).stdout.strip())
    from_stdin = uuid.UUID(add(pg_dsn, "--payload-file", "-", input='[1, "two"]').stdout.strip())
    assert delivery_row(conn, from_file)["payload"] == {"report": "daily", "to": ["a@example.com"]}
    assert delivery_row(conn, from_stdin)["payload"] == [1, "two"]


def test_bulk_add_writes_delivery_rows(conn) -> None:
    specs = [
        JobSpec.build(tenant="acme", interval_s=60),
        JobSpec.build(tenant="acme", interval_s=60, delivery=DeliverySpec.build(queue="q", payload='{"i": 2}')),
        JobSpec.build(tenant="acme", interval_s=60, delivery=DeliverySpec.build(url=PUBLIC, overlap="buffer_one")),
    ]
    ids = jobs.add_jobs(conn, specs)
    assert [job_columns(conn, i)[:2] for i in ids] == [("default", "allow"), ("q", "allow"), (None, "buffer_one")]
    assert [delivery_row(conn, i) for i in ids] == [
        None,
        {**DEFAULT_ROW, "payload": {"i": 2}},
        {**DEFAULT_ROW, "url": PUBLIC, "method": "POST", "timeout_s": 10.0},
    ]


# ---------------------------------------------------------------- refused: nothing written


def test_payload_over_64_kb_is_refused_with_its_size_and_nothing_written(pg_dsn, conn, tmp_path) -> None:
    add(pg_dsn, "--name", "kept", "--payload", "[1]")
    before = tables(conn)
    big = json.dumps({"blob": "x" * 70_000})
    message = "error: payload: is 70,011 bytes as compact UTF-8 JSON; the limit is 65,536 bytes (64 kB)"
    one_line_error(add(pg_dsn, "--payload", big), 2, message)
    path = tmp_path / "big.json"
    path.write_text(big, encoding="utf-8")
    one_line_error(add(pg_dsn, "--payload-file", str(path)), 2, message)
    one_line_error(add(pg_dsn, "--payload-file", "-", input=big), 2, message)
    # An edit of an existing job to the oversized payload changes no row either.
    one_line_error(add(pg_dsn, "--name", "kept", "--replace", "--payload", big), 2, message)
    assert tables(conn) == before
    assert [len(rows) for rows in before[:2]] == [1, 1]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--payload", "{"],
            "error: payload: must be valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)",
        ),
        (["--payload", "[" * 10_000], "error: payload: must nest arrays and objects at most 64 deep"),
        (["--payload", "NaN"], "error: payload: must be valid JSON (NaN and Infinity are not JSON) (got 'NaN')"),
        (["--payload", '{"a":1,"a":2}'], "error: payload: must not give an object key twice (got 'a')"),
        (["--payload", "[1]", "--payload-file", "-"], "error: payload: give --payload or --payload-file, not both"),
        (["--queue", "q", "--url", PUBLIC], "error: target: give either --queue or --url, not both"),
        (
            ["--queue", "bad queue"],
            "error: queue: must be 1-100 characters of letters, digits and . _ - (got 'bad queue')",
        ),
        (["--header", "X: y"], "error: header: applies to --url targets only"),
        (
            ["--url", PUBLIC, "--header", "Host: evil"],
            "error: header: name is set by the engine or breaks HTTP (Host, Content-*, Scheduler-*, ...) (got 'Host')",
        ),
        (
            ["--max-attempts", "0"],
            "error: max_attempts: must be a whole number from 1 to 100 in ASCII digits (got '0')",
        ),
        (
            ["--url", PUBLIC, "--timeout-s", "nan"],
            "error: timeout_s: must be a number of seconds above 0 and at most 300, in ASCII digits (got 'nan')",
        ),
        (["--backoff-base-s", "400"], "error: backoff_base_s: must not exceed --backoff-cap-s (300 s) (got '400')"),
        (
            ["--max-age-s", "31d"],
            "error: max_age_s: must be a duration from 1 second to 30 days (2592000 s): whole seconds, "
            "or e.g. 90m, 12h, 7d, 1d12h (ASCII digits) (got '31d')",
        ),
        (
            ["--url", "http://u:p@93.184.216.34/"],
            "error: url: must not carry user:password (send credentials as a header) (got '93.184.216.34')",
        ),
        (
            ["--url", PUBLIC, "--push-allow", "not-a-net"],
            "error: push_allow: must be a comma-separated list of networks or addresses (e.g. 10.0.0.0/8) "
            "(got 'not-a-net')",
        ),
    ],
)
def test_bad_delivery_input_is_one_line_and_writes_nothing(pg_dsn, conn, args, line) -> None:
    before = tables(conn)
    one_line_error(add(pg_dsn, *args), 2, line)
    assert tables(conn) == before


def test_payload_file_that_is_not_utf8_or_missing(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'"caf\xe9"')
    before = tables(conn)
    one_line_error(
        add(pg_dsn, "--payload-file", str(path)), 2, "error: payload: must be UTF-8 text (bad byte at offset 4)"
    )
    one_line_error(
        add(pg_dsn, "--payload-file", str(tmp_path / "none.json")),
        2,
        f"error: payload_file: cannot read it (No such file or directory) (got '{tmp_path / 'none.json'}')",
    )
    assert tables(conn) == before


@pytest.mark.parametrize(
    ("url", "got", "allow"),
    [
        ("http://127.0.0.1:8080/hook", "127.0.0.1 -> 127.0.0.1", "127.0.0.1/32"),
        ("http://10.0.0.1/hook", "10.0.0.1 -> 10.0.0.1", "10.0.0.0/8"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 -> 169.254.169.254", "169.254.169.254"),
        ("http://[::1]:9000/hook", "::1 -> ::1", "::1/128"),
        ("http://localhost:8080/hook", "localhost -> 127.0.0.1", "127.0.0.0/8,::1/128"),
    ],
)
def test_ssrf_refused_at_save_without_push_allow_accepted_with_it(pg_dsn, conn, url, got, allow) -> None:
    before = tables(conn)
    rule = METADATA if "169.254.169.254" in url else SSRF
    one_line_error(add(pg_dsn, "--url", url), 2, f"error: {rule} (got '{got}')")
    assert tables(conn) == before
    with pytest.raises(ValidationError) as info:
        jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60, delivery=DeliverySpec.build(url=url)))
    assert str(info.value) == f"{rule} (got '{got}')"
    assert tables(conn) == before

    flag = add(pg_dsn, "--url", url, "--push-allow", allow)
    assert (flag.exit_code, flag.stderr) == (0, "")
    env = add(pg_dsn, "--url", url, env={"SCHEDULER_PUSH_ALLOW": allow})
    assert (env.exit_code, env.stderr) == (0, "")
    api = jobs.add_job(
        conn,
        JobSpec.build(tenant="acme", interval_s=60, delivery=DeliverySpec.build(url=url)),
        push_policy=AddressPolicy.parse(allow),
    )
    for job_id in (uuid.UUID(flag.stdout.strip()), uuid.UUID(env.stdout.strip()), api.job_id):
        assert job_columns(conn, job_id)[0] is None
        assert delivery_row(conn, job_id)["url"] == url


def test_ssrf_is_checked_by_bulk_add_and_import_jobs_too(conn) -> None:
    before = tables(conn)
    bad = JobSpec.build(tenant="acme", interval_s=60, name="n", delivery=DeliverySpec.build(url="http://10.0.0.1/"))
    for call in (lambda: jobs.add_jobs(conn, [bad]), lambda: jobs.import_jobs(conn, [bad])):
        with pytest.raises(ValidationError) as info:
            call()
        assert str(info.value) == f"{SSRF} (got '10.0.0.1 -> 10.0.0.1')"
    assert tables(conn) == before


# ---------------------------------------------------------------- --name: idempotent, conflicts, edits


def revisions(conn: psycopg.Connection, job_id: uuid.UUID) -> list[int]:
    return [
        r["revision"]
        for r in conn.execute(
            "SELECT revision FROM job_revisions WHERE job_id = %s ORDER BY revision", (job_id,)
        ).fetchall()
    ]


def test_same_delivery_is_idempotent_a_different_one_conflicts(pg_dsn, conn) -> None:
    args = ["--name", "nightly", "--url", PUBLIC, "--header", "X-A: 1", "--payload", '{"a": 1, "b": 1e2}']
    first = add(pg_dsn, *args)
    job_id = uuid.UUID(first.stdout.strip())
    # The same spec, the payload's keys in another order and its number spelled otherwise: exists.
    again = add(pg_dsn, "--name", "nightly", "--url", PUBLIC, "--header", "X-A:1", "--payload", '{"b": 100, "a": 1.0}')
    assert (again.exit_code, again.stdout, again.stderr) == (0, f"{job_id}\n", "(exists)\n")
    before = tables(conn)
    conflict = (
        f"error: name: job 'nightly' of tenant 'acme' already exists with a different spec (id {job_id}); "
        "pass --replace to change it"
    )
    for other in (
        ["--url", PUBLIC, "--header", "X-A: 2", "--payload", '{"a": 1, "b": 1e2}'],
        ["--url", PUBLIC, "--header", "X-A: 1", "--payload", '{"a": 2, "b": 1e2}'],
        ["--url", PUBLIC, "--header", "X-A: 1", "--payload", '{"a": 1, "b": 1e2}', "--method", "PUT"],
        ["--url", PUBLIC, "--header", "X-A: 1", "--payload", '{"a": 1, "b": 1e2}', "--max-attempts", "2"],
        ["--url", PUBLIC, "--header", "X-A: 1", "--payload", '{"a": 1, "b": 1e2}', "--overlap", "forbid"],
        ["--payload", '{"a": 1, "b": 1e2}'],
    ):
        one_line_error(add(pg_dsn, "--name", "nightly", *other), 2, conflict)
    assert tables(conn) == before


def test_replace_edits_target_and_payload_like_any_edit(pg_dsn, conn) -> None:
    job_id = uuid.UUID(add(pg_dsn, "--name", "n", "--payload", '{"v": 1}').stdout.strip())
    pending = conn.execute("SELECT next_nominal_at FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[
        "next_nominal_at"
    ]
    assert (job_columns(conn, job_id), delivery_row(conn, job_id)) == (
        ("default", "allow", 1),
        {**DEFAULT_ROW, "payload": {"v": 1}},
    )

    payload = add(pg_dsn, "--name", "n", "--replace", "--payload", '{"v": 2}')
    assert (payload.stdout, payload.stderr) == (f"{job_id}\n", "(replaced)\n")
    assert (job_columns(conn, job_id), delivery_row(conn, job_id)) == (
        ("default", "allow", 2),
        {**DEFAULT_ROW, "payload": {"v": 2}},
    )
    assert revisions(conn, job_id) == [1]

    target = add(pg_dsn, "--name", "n", "--replace", "--url", PUBLIC, "--header", "X-K: v", "--overlap", "replace")
    assert target.stderr == "(replaced)\n"
    assert (job_columns(conn, job_id), delivery_row(conn, job_id)) == (
        (None, "replace", 3),
        {**DEFAULT_ROW, "url": PUBLIC, "method": "POST", "timeout_s": 10.0, "headers": {"X-K": "v"}},
    )

    back = add(pg_dsn, "--name", "n", "--replace")
    assert back.stderr == "(replaced)\n"
    assert (job_columns(conn, job_id), delivery_row(conn, job_id)) == (("default", "allow", 4), None)
    assert revisions(conn, job_id) == [1, 2, 3]
    # Delivery is not the schedule: every edit kept the pending slot and recorded no skip.
    row = conn.execute("SELECT next_nominal_at FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row["next_nominal_at"] == pending
    assert conn.execute("SELECT count(*) AS c FROM skips").fetchone()["c"] == 0
    assert conn.execute("SELECT count(*) AS c FROM job_delivery").fetchone()["c"] == 0


def test_a_rejected_edit_changes_no_row(pg_dsn, conn) -> None:
    add(pg_dsn, "--name", "n", "--url", PUBLIC, "--payload", "[1]", "--max-attempts", "3")
    before = tables(conn)
    one_line_error(
        add(pg_dsn, "--name", "n", "--replace", "--url", "http://169.254.169.254/"),
        2,
        f"error: {METADATA} (got '169.254.169.254 -> 169.254.169.254')",
    )
    one_line_error(
        add(pg_dsn, "--name", "n", "--replace", "--url", PUBLIC, "--header", "Content-Length: 0"),
        2,
        "error: header: name is set by the engine or breaks HTTP (Host, Content-*, Scheduler-*, ...) "
        "(got 'Content-Length')",
    )
    one_line_error(
        add(pg_dsn, "--name", "n", "--replace", "--max-attempts", "101"),
        2,
        "error: max_attempts: must be a whole number from 1 to 100 in ASCII digits (got '101')",
    )
    assert tables(conn) == before


# ---------------------------------------------------------------- import


def test_import_reads_the_delivery_columns(pg_dsn, conn, tmp_path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(
        "expr,dialect,timezone,job,queue,url,method,headers,timeout_s,payload,max_attempts,backoff_base_s,"
        "backoff_cap_s,max_age_s,overlap\n"
        "0 1 * * *,unix5,,plain,,,,,,,,,,,\n"
        '0 2 * * *,unix5,,mail,emails,,,,,"{""to"": ""ops""}",3,,,,forbid\n'
        f'0 3 * * *,unix5,,push,,{PUBLIC},PUT,"Authorization: Bearer s3cret\nX-Team: blue",2.5,[1],,0.5,60,2h,\n'
        "0 4 * * *,unix5,,badheader,,,,X: y,,,,,,,\n"
        "0 5 * * *,unix5,,inside,,http://10.0.0.1/,,,,,,,,,\n"
        '0 6 * * *,unix5,,bigpayload,,,,,,"""' + "x" * 70_000 + '""",,,,,\n'
        '0 7 * * *,unix5,,dupkey,,,,,,"{""a"": {""b"": 1, ""b"": 2}}",,,,,\n'
        "0 8 * * *,unix5,,lowcap,,,,,,,,,0.5,,\n",
        encoding="utf-8",
    )
    result = run(["jobs", "import", str(path), "--tenant", "acme", "--name-column", "job"], pg_dsn)
    assert (result.exit_code, result.stdout) == (0, "3 created, 0 unchanged, 5 rejected\n")  # rejected lines: still 0
    assert result.stderr.splitlines() == [
        f"{path}:6: '0 4 * * *': headers: applies to url targets only",  # the columns' words, not the flags'
        f"{path}:7: '0 5 * * *': {SSRF} (got '10.0.0.1 -> 10.0.0.1')",
        f"{path}:8: '0 6 * * *': payload: is 70,002 bytes as compact UTF-8 JSON; the limit is 65,536 bytes (64 kB)",
        f"{path}:9: '0 7 * * *': payload: must not give an object key twice (got 'b')",
        f"{path}:10: '0 8 * * *': backoff_cap_s: must not be below backoff_base_s (1 s, its default) (got '0.5')",
    ]
    rows = {
        r["name"]: r for r in conn.execute("SELECT name, job_id, queue, overlap FROM jobs ORDER BY name").fetchall()
    }
    assert sorted(rows) == ["mail", "plain", "push"]
    assert [(rows[n]["queue"], rows[n]["overlap"]) for n in ("plain", "mail", "push")] == [
        ("default", "allow"),
        ("emails", "forbid"),
        (None, "allow"),
    ]
    assert delivery_row(conn, rows["plain"]["job_id"]) is None
    assert delivery_row(conn, rows["mail"]["job_id"]) == {**DEFAULT_ROW, "payload": {"to": "ops"}, "max_attempts": 3}
    assert delivery_row(conn, rows["push"]["job_id"]) == {
        **DEFAULT_ROW,
        "url": PUBLIC,
        "method": "PUT",
        "headers": {"Authorization": "Bearer s3cret", "X-Team": "blue"},
        "timeout_s": 2.5,
        "payload": [1],
        "backoff_base_s": 0.5,
        "backoff_cap_s": 60.0,
        "max_age_s": 7_200,
    }

    before = tables(conn)
    again = run(["jobs", "import", str(path), "--tenant", "acme", "--name-column", "job"], pg_dsn)
    assert again.stdout == "0 created, 3 unchanged, 5 rejected\n"
    assert tables(conn) == before

    # A changed payload is a conflict (rejected, nothing replaced); push_allow admits the private URL.
    path.write_text(
        path.read_text(encoding="utf-8").replace('""ops""', '""dev""'),
        encoding="utf-8",
    )
    changed = run(
        ["jobs", "import", str(path), "--tenant", "acme", "--name-column", "job", "--push-allow", "10.0.0.0/8"],
        pg_dsn,
    )
    assert changed.stdout == "1 created, 2 unchanged, 5 rejected\n"
    assert changed.stderr.splitlines()[0] == (
        f"{path}:3: '0 2 * * *': name: job 'mail' of tenant 'acme' already exists with a different spec "
        f"(id {rows['mail']['job_id']})"
    )
    assert delivery_row(conn, rows["mail"]["job_id"])["payload"] == {"to": "ops"}
    inside = conn.execute("SELECT job_id, queue FROM jobs WHERE name = 'inside'").fetchone()
    assert inside["queue"] is None
    assert delivery_row(conn, inside["job_id"])["url"] == "http://10.0.0.1/"


# ---------------------------------------------------------------- show / list


def test_show_and_list_print_the_target_and_header_names_never_values(pg_dsn, conn) -> None:
    url = PUBLIC + "?token=abc"
    pushed = uuid.UUID(
        add(pg_dsn, "--url", url, "--header", "Authorization: Bearer s3cret", "--payload", '{"a": 1}').stdout.strip()
    )
    queued = uuid.UUID(add(pg_dsn, "--queue", "emails", "--overlap", "forbid").stdout.strip())

    shown = run(["jobs", "show", str(pushed)], pg_dsn).stdout
    assert "s3cret" not in shown
    lines = shown.splitlines()
    assert "queue             -" in lines
    assert "overlap           allow" in lines
    for expected in (
        "target            POST https://93.184.216.34",
        f"url               {url}",
        "method            POST",
        "header_names      Authorization",
        "timeout_s         10.0",
        'payload           {"a":1}',
        "max_attempts      5",
        "backoff_base_s    1.0",
        "backoff_cap_s     300.0",
        "max_age_s         -",
    ):
        assert expected in lines, expected
    as_json = json.loads(run(["jobs", "show", str(queued), "--json"], pg_dsn).stdout)
    assert as_json["delivery"] == {
        "target": "queue emails",
        "queue": "emails",
        "payload": None,
        "max_attempts": 5,
        "backoff_base_s": 1.0,
        "backoff_cap_s": 300.0,
        "max_age_s": None,
        "overlap": "forbid",
    }
    assert "s3cret" not in run(["jobs", "show", str(pushed), "--json"], pg_dsn).stdout

    listed = json.loads(run(["jobs", "list", "--json"], pg_dsn).stdout)
    assert [(r["job_id"], r["target"], r["overlap"]) for r in listed] == [
        (str(pushed), "POST https://93.184.216.34", "allow"),
        (str(queued), "queue emails", "forbid"),
    ]
    text = run(["jobs", "list"], pg_dsn).stdout
    assert "token" not in text and "s3cret" not in text
    assert "POST https://93.184.216.34" in text and "queue emails" in text


def test_help_explains_every_delivery_option() -> None:
    text = run(["jobs", "add", "--help"]).stdout
    for option in (
        "--queue",
        "--url",
        "--method",
        "--header",
        "--timeout-s",
        "--payload",
        "--payload-file",
        "--max-attempts",
        "--backoff-base-s",
        "--backoff-cap-s",
        "--max-age-s",
        "--overlap",
        "--push-allow",
    ):
        assert f"{option} " in text, option
    assert "SCHEDULER_PUSH_ALLOW" in text


# ---------------------------------------------------------------- retention


def test_pruning_a_deleted_job_deletes_its_delivery_row(conn) -> None:
    gone = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60, delivery=DeliverySpec.build(payload="[1]")))
    live = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60, delivery=DeliverySpec.build(payload="[2]")))
    jobs.delete_job(conn, gone.job_id)
    deleted_at = conn.execute("SELECT deleted_at FROM jobs WHERE job_id = %s", (gone.job_id,)).fetchone()["deleted_at"]

    kept = retention.prune(conn, 60, now=deleted_at + timedelta(seconds=59))
    assert (kept.jobs, delivery_row(conn, gone.job_id)) == (0, {**DEFAULT_ROW, "payload": [1]})
    report = retention.prune(conn, 60, now=deleted_at + timedelta(seconds=61))
    assert report.jobs == 1
    assert delivery_row(conn, gone.job_id) is None
    assert delivery_row(conn, live.job_id) == {**DEFAULT_ROW, "payload": [2]}


# ---------------------------------------------------------------- what a claim hands over


@pytest.fixture
def node(pg_dsn: str):
    n = OneNode(pg_dsn)
    yield n
    n.close()


def pending_run(conn: psycopg.Connection, job_id: uuid.UUID, nominal: datetime, queue: str | None) -> RunKey:
    """A pending run as the firing statement writes it."""
    key = RunKey.of(job_id, nominal)
    conn.execute(
        """
        INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at, fired_at, node_id, epoch,
                          state, queue, origin, available_at)
        VALUES (%s, %s, %s, 'acme', %s, %s, 't1', 1, 'pending', %s, 'schedule', %s)
        """,
        (key.partition_id, job_id, nominal, nominal, nominal, queue, nominal),
    )
    return key


def test_a_claim_hands_over_the_saved_target_and_payload(conn, node) -> None:
    t0 = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
    queued = jobs.add_job(
        conn,
        JobSpec.build(tenant="acme", interval_s=3600, delivery=DeliverySpec.build(queue="mail", payload='{"a": [1]}')),
    ).job_id
    pushed = jobs.add_job(
        conn,
        JobSpec.build(
            tenant="acme",
            interval_s=3600,
            delivery=DeliverySpec.build(url=PUBLIC, method="PUT", headers=["X-K: v"], timeout_s=3, payload='"hi"'),
        ),
    ).job_id
    pending_run(conn, queued, t0, "mail")
    push_key = pending_run(conn, pushed, t0, None)

    (claimed,) = lifecycle.claim(
        conn, tenant="acme", queue="mail", worker="w1", limit=10, now=t0 + timedelta(seconds=1)
    )
    assert (claimed.payload, claimed.url, claimed.headers) == ({"a": [1]}, None, None)
    epochs = {push_key.partition_id: node.epoch(push_key.partition_id)}
    (push,) = lifecycle.claim_push(conn, node_id="t1", epochs=epochs, limit=10, now=t0 + timedelta(seconds=1))
    assert (push.url, push.method, push.headers, push.timeout_s, push.payload) == (
        PUBLIC,
        "PUT",
        {"X-K": "v"},
        3.0,
        "hi",
    )
