"""Multi-host DSNs (a store behind a high-availability pair): every command, the migrations and the node.

libpq accepts several hosts, tried in turn, in three spellings: a URI
``postgresql://u:p@h1:p1,h2:p2/db``, a URI ``postgresql://u:p@/db?host=h1,h2&port=p1,p2``
and keywords ``host=h1,h2 port=p1,p2``; with ``target_session_attrs=read-write``
it skips a host whose sessions are read-only (a standby). Here the first host
is a closed port on 127.0.0.1 (a dead primary) and the second the test
cluster. When every host fails, the error names each host's failure on one
line, and never the password (the test cluster trusts every password, so
one can be written into the DSN).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from helpers import OneNode, closed_port, store_now, wait_for

from scheduler import jobs, migrate, store
from scheduler.api import keys
from scheduler.api.server import ApiThread
from scheduler.cli import cli
from scheduler.errors import StoreError
from scheduler.settings import ApiSettings
from scheduler.spec import JobSpec

SECRET = "SuperSecret42"
FORMS = ("uri hosts", "uri query", "keywords")


def multi_host(dsn: str, form: str, hosts: list[tuple[str, int]], **params: str) -> str:
    """``dsn`` (a test database's URI) with ``hosts`` in one of libpq's multi-host spellings,
    the password :data:`SECRET` and ``params`` (e.g. ``target_session_attrs``)."""
    parts = urlsplit(dsn)
    user, db = parts.username or "postgres", parts.path.lstrip("/")
    if form == "keywords":
        words = {
            "host": ",".join(h for h, _ in hosts),
            "port": ",".join(str(p) for _, p in hosts),
            "dbname": db,
            "user": user,
            "password": SECRET,
            **params,
        }
        return " ".join(f"{key}={value}" for key, value in words.items())
    query = "&".join(f"{key}={value}" for key, value in params.items())
    if form == "uri hosts":
        netloc = ",".join(f"{h}:{p}" for h, p in hosts)
        return f"postgresql://{user}:{SECRET}@{netloc}/{db}" + (f"?{query}" if query else "")
    assert form == "uri query"
    host_query = f"host={','.join(h for h, _ in hosts)}&port={','.join(str(p) for _, p in hosts)}"
    return f"postgresql://{user}:{SECRET}@/{db}?{host_query}" + (f"&{query}" if query else "")


def dead_then_live(dsn: str, form: str) -> str:
    """A dead first host, the test cluster second; read-write sessions only."""
    parts = urlsplit(dsn)
    live = (parts.hostname or "127.0.0.1", parts.port or 5432)
    return multi_host(dsn, form, [("127.0.0.1", closed_port()), live], target_session_attrs="read-write")


def run(args: list[str], dsn: str):
    """The CLI in process with ``SCHEDULER_DSN`` = ``dsn`` and no other SCHEDULER_* variable."""
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def one_error_line(result, status: int) -> str:
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    (line,) = result.stderr.splitlines()
    assert SECRET not in result.stdout + result.stderr
    return line


# ---------------------------------------------------------------- a dead first host


@pytest.mark.parametrize("form", FORMS)
def test_db_upgrade_and_current_go_to_the_live_host(empty_pg_dsn, form) -> None:
    dsn = dead_then_live(empty_pg_dsn, form)
    head = migrate.head_revision()
    upgraded = run(["db", "upgrade"], dsn)
    assert (upgraded.exit_code, upgraded.stdout) == (0, f"schema at {head} (head)\n"), upgraded.stderr
    current = run(["db", "current"], dsn)
    assert (current.exit_code, current.stdout) == (0, f"{head} (head)\n"), current.stderr
    with psycopg.connect(empty_pg_dsn) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
        assert c.execute("SELECT count(*) FROM partitions").fetchone() == (1024,)
    downgraded = run(["db", "downgrade", "0013", "--yes"], dsn)
    assert (downgraded.exit_code, downgraded.stdout) == (0, "schema at 0013\n"), downgraded.stderr


@pytest.mark.parametrize("form", FORMS)
def test_cli_commands_go_to_the_live_host(pg_dsn, conn, form) -> None:
    dsn = dead_then_live(pg_dsn, form)
    added = run(["jobs", "add", "--tenant", "acme", "--interval", "60", "--name", "ha"], dsn)
    assert added.exit_code == 0, added.stderr
    job_id = uuid.UUID(added.stdout.strip())
    listed = run(["jobs", "list", "--json"], dsn)
    assert listed.exit_code == 0, listed.stderr
    assert [row["job_id"] for row in json.loads(listed.stdout)] == [str(job_id)]
    assert conn.execute("SELECT name FROM jobs WHERE job_id = %s", (job_id,)).fetchone() == {"name": "ha"}


@pytest.mark.parametrize("form", FORMS)
def test_node_sessions_fire_through_the_live_host(pg_dsn, conn, form) -> None:
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
    anchor = store_now(conn).replace(microsecond=0) - timedelta(seconds=150)
    conn.execute(
        "UPDATE jobs SET anchor_at = %(a)s, created_at = %(a)s, changed_at = %(a)s, "
        "next_nominal_at = %(n)s, next_due_at = %(n)s",
        {"a": anchor, "n": anchor + timedelta(seconds=60)},
    )
    node = OneNode(dead_then_live(pg_dsn, form), node_id="ha-node")
    try:
        assert node.firer.tick().fired == 2
    finally:
        node.close()
    rows = conn.execute("SELECT nominal_time, node_id FROM runs WHERE job_id = %s ORDER BY 1", (job_id,)).fetchall()
    assert rows == [{"nominal_time": anchor + timedelta(seconds=60 * k), "node_id": "ha-node"} for k in (1, 2)]


def test_the_node_command_starts_and_claims_through_the_live_host(pg_dsn, conn) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dead_then_live(pg_dsn, "uri hosts")
    timings = ["--lease-ttl-s", "2", "--renew-interval-s", "0.5", "--poll-interval-s", "0.25"]
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--log-format", "json", "node", "--node-id", "ha", *timings],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        owned = wait_for(
            "the node to claim every partition",
            lambda: conn.execute("SELECT count(*) AS n FROM leases WHERE owner_node = 'ha'").fetchone()["n"],
            lambda n: n == 1024,
            timeout_s=30,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert owned == 1024
    assert process.returncode == 0, stderr
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "store_unavailable" not in events and "node_started" in events, stderr
    assert SECRET not in stderr


def test_the_http_api_serves_through_the_live_host(pg_dsn, conn) -> None:
    jobs.add_tenant(conn, "acme")
    token, _ = keys.create(conn, "acme", "worker", None)
    server = ApiThread(dead_then_live(pg_dsn, "uri hosts"), "127.0.0.1", 0, ApiSettings(pool_size=2)).start()
    try:
        resp = httpx.post(f"{server.url}/v1/runs:claim", json={"max": 10}, headers={"Authorization": f"Bearer {token}"})
    finally:
        server.stop()
    assert (resp.status_code, resp.json()) == (200, {"runs": []}), resp.text


# ---------------------------------------------------------------- every host failing


@pytest.mark.parametrize("form", FORMS)
def test_two_dead_hosts_are_named_on_one_line(empty_pg_dsn, form) -> None:
    first, second = closed_port(), closed_port()
    dsn = multi_host(empty_pg_dsn, form, [("127.0.0.1", first), ("127.0.0.1", second)])
    failures = f"127.0.0.1:{first}: Connection refused; 127.0.0.1:{second}: Connection refused"
    expected = f"cannot connect to the store at {store.redact_dsn(dsn)}: {failures}"
    with pytest.raises(StoreError) as caught:
        store.connect(dsn)
    assert str(caught.value) == expected
    for command in (["db", "upgrade"], ["db", "current"], ["jobs", "list"], ["status"]):
        assert one_error_line(run(command, dsn), 1) == f"error: {expected}", command


@pytest.mark.parametrize("form", FORMS)
def test_a_read_only_host_is_skipped_and_named_with_target_session_attrs(pg_dsn, conn, form) -> None:
    """A read-only host (a standby; here the database's sessions are read-only) fails a
    read-write session: the commands and the node sessions pass ``target_session_attrs`` to libpq."""
    db = urlsplit(pg_dsn).path.lstrip("/")
    conn.execute(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
    parts = urlsplit(pg_dsn)
    live, dead = (parts.hostname or "127.0.0.1", parts.port or 5432), closed_port()
    dsn = multi_host(pg_dsn, form, [live, ("127.0.0.1", dead)], target_session_attrs="read-write")
    failures = f"{live[0]}:{live[1]}: session is read-only; 127.0.0.1:{dead}: Connection refused"
    expected = f"cannot connect to the store at {store.redact_dsn(dsn)}: {failures}"
    for command in (["db", "upgrade"], ["jobs", "list"]):
        assert one_error_line(run(command, dsn), 1) == f"error: {expected}", command
    with pytest.raises(StoreError) as caught:
        OneNode(dsn, node_id="ha-node")
    assert str(caught.value) == expected
    # Without the attribute the read-only host is taken, as libpq does.
    listed = run(["jobs", "list"], multi_host(pg_dsn, form, [live, ("127.0.0.1", dead)]))
    assert (listed.exit_code, listed.stderr) == (0, "")


# ---------------------------------------------------------------- hosts whose names do not resolve

UNRESOLVED = "name does not resolve"


@pytest.mark.parametrize("form", FORMS)
def test_hosts_whose_names_do_not_resolve_are_each_named(form) -> None:
    """psycopg resolves names before libpq tries a host and drops those that fail (reporting only
    the last, and only when none resolved): the error still names every host. ``.invalid``
    names never resolve (RFC 2606), so no network is needed."""
    dsn = multi_host("postgresql://postgres@x/sched", form, [("nonexistent.invalid", 5432), ("other.invalid", 5433)])
    failures = f"nonexistent.invalid:5432: {UNRESOLVED}; other.invalid:5433: {UNRESOLVED}"
    expected = f"cannot connect to the store at {store.redact_dsn(dsn)}: {failures}"
    with pytest.raises(StoreError) as caught:
        store.connect(dsn)
    assert str(caught.value) == expected
    assert SECRET not in expected
    assert one_error_line(run(["jobs", "list", "--tenant", "t"], dsn), 1) == f"error: {expected}"


@pytest.mark.parametrize("form", FORMS)
def test_an_unresolved_host_and_a_dead_one_are_both_named_in_order(form) -> None:
    dead = closed_port()
    for hosts, failures in (
        (
            [("nonexistent.invalid", 5), ("127.0.0.1", dead)],
            f"nonexistent.invalid:5: {UNRESOLVED}; 127.0.0.1:{dead}: Connection refused",
        ),
        (
            [("127.0.0.1", dead), ("nonexistent.invalid", 5)],
            f"127.0.0.1:{dead}: Connection refused; nonexistent.invalid:5: {UNRESOLVED}",
        ),
    ):
        dsn = multi_host("postgresql://postgres@x/sched", form, hosts)
        expected = f"cannot connect to the store at {store.redact_dsn(dsn)}: {failures}"
        with pytest.raises(StoreError) as caught:
            store.connect(dsn)
        assert str(caught.value) == expected
        assert one_error_line(run(["jobs", "list", "--tenant", "t"], dsn), 1) == f"error: {expected}"


def test_a_single_host_that_does_not_resolve_is_named_with_its_port() -> None:
    dsn = f"postgresql://postgres:{SECRET}@nonexistent.invalid:5432/sched"
    with pytest.raises(StoreError) as caught:
        store.connect(dsn)
    assert str(caught.value) == (
        f"cannot connect to the store at postgresql://postgres:***@nonexistent.invalid:5432/sched: "
        f"nonexistent.invalid:5432: {UNRESOLVED}"
    )


def test_a_host_name_that_resolved_is_not_said_not_to(pg_dsn) -> None:
    # psycopg resolves a name and reports the addresses it tried: the name itself is then in
    # no failure, yet it resolved (a trial: "localhost:56810: name does not resolve; 127.0.0.1:56810: FATAL ...").
    dead = closed_port()
    port = psycopg.conninfo.conninfo_to_dict(pg_dsn).get("port") or "5432"
    for dsn, says in (
        (f"postgresql://postgres@localhost:{dead}/sched", "Connection refused"),
        (f"postgresql://postgres@localhost:{port}/no_such_database_here", 'database "no_such_database_here"'),
    ):
        with pytest.raises(StoreError) as caught:
            store.connect(dsn)
        assert UNRESOLVED not in str(caught.value) and says in str(caught.value), dsn
        after = str(caught.value).removeprefix(f"cannot connect to the store at {store.redact_dsn(dsn)}: ")
        assert after.startswith(("127.0.0.1:", "::1:")), after  # the address psycopg tried first
