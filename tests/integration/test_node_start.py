"""A node's start-up check of its store (scheduler/node.py, store.check_node_store).

A fatal misconfiguration ends the node at start, before anything runs
(:class:`StoreSetupError`; ``scheduler node`` exits 2 with the fix in one
line): the schema missing or behind the code's head revision, the
authentication refused (an unknown role here: the test cluster trusts every
password), the database absent. A DSN libpq would misparse (a URI with an
unescaped ``@`` in its password, with or without ``/ ? #``) or cannot parse
is a bad setting, refused before any connection (:class:`ConfigError` naming
``dsn``; exit status 2). A store that cannot be reached (a closed port) is
transient: the node starts and keeps retrying, as before. A schema newer
than the code (a rolling upgrade) is accepted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from helpers import closed_port

from scheduler import store
from scheduler.errors import ConfigError, StoreSetupError
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.settings import Settings

TIMINGS = {
    "lease_ttl_s": 2.0,
    "renew_interval_s": 0.5,
    "poll_interval_s": 0.25,
    "tick_interval_s": 0.5,
    "safety_margin_s": 0.5,
}
UPGRADE_HINT = "run `scheduler db upgrade` first"
DSN_RULE = (
    "dsn: a URI may hold '@' only once, between the user info and the host: percent-encode "
    "@ : / ? # in the user name and password (e.g. @ as %40)"
)


def with_netloc(dsn: str, netloc: str | None = None, path: str | None = None) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=netloc or parts.netloc, path=path or parts.path))


def node_for(dsn: str) -> Node:
    return Node(Settings(dsn=dsn, node_id="starter", **TIMINGS), metrics=Metrics())


def refused(dsn: str, error: type[ConfigError] = StoreSetupError) -> str:
    node = node_for(dsn)
    with pytest.raises(error) as caught:
        node.start()
    assert node._threads == []
    return str(caught.value)


def test_a_store_without_schema_is_refused_with_the_upgrade_hint(empty_pg_dsn):
    message = refused(empty_pg_dsn)
    assert message == f"store: the schema is missing (no alembic_version table); {UPGRADE_HINT}"


def test_a_schema_behind_head_is_refused(pg_dsn, conn):
    conn.execute("UPDATE alembic_version SET version_num = '0013'")
    from scheduler.migrate import script_revisions

    head = script_revisions()[0]
    assert refused(pg_dsn) == f"store: the schema is at revision 0013, behind this version's {head}; {UPGRADE_HINT}"


def test_a_schema_newer_than_the_code_is_accepted(pg_dsn, conn):
    conn.execute("UPDATE alembic_version SET version_num = '9999_from_a_newer_release'")
    node = node_for(pg_dsn)
    node.start()
    try:
        assert node._threads and node.check_store_again()
    finally:
        node.stop()
        node.join(15)


def test_a_missing_database_is_refused(pg_dsn):
    message = refused(with_netloc(pg_dsn, path="/no_such_database_here"))
    assert 'database "no_such_database_here" does not exist' in message
    assert message.endswith("create the database, then run `scheduler db upgrade`")


def test_refused_authentication_is_refused_with_a_hint(pg_dsn):
    parts = urlsplit(pg_dsn)
    message = refused(with_netloc(pg_dsn, netloc=f"nobody_here:Tr0ub4dor99@{parts.hostname}:{parts.port}"))
    assert 'role "nobody_here" does not exist' in message
    assert "check the DSN's user and password" in message and "Tr0ub4dor99" not in message


@pytest.mark.parametrize(
    "userinfo",
    [
        "postgres:Pass@SuperSecret42",
        "op:Sup3r@S3cret/Path",  # libpq: host 'S3cret', database 'Path@...': was retried as a store down
        "op:Sup3r?S3cret",  # libpq: a query parameter without '=': was retried as a store down
        "op:k3y@1",  # libpq echoed the short piece: host '1@127.0.0.1'
        "op:a@b@c-longersecret",
    ],
)
def test_a_uri_libpq_would_misparse_is_refused_before_connecting(pg_dsn, userinfo):
    parts = urlsplit(pg_dsn)
    assert refused(f"postgresql://{userinfo}@{parts.hostname}:{parts.port}{parts.path}", ConfigError) == DSN_RULE


def test_a_dsn_setting_libpq_refuses_is_refused_not_retried(pg_dsn):
    message = refused(f"{pg_dsn}?sslmode=bogus")
    assert message.endswith('invalid sslmode value: "bogus"; ' + store.SETUP_HINTS["setting"]), message


def test_a_dsn_libpq_cannot_parse_is_refused():
    assert refused("garbage", ConfigError) == (
        "dsn: must be a URI (postgresql://user:password@host:5432/dbname) or libpq keywords "
        '(host=... dbname=...); libpq: missing "=" after "garbage" in connection info string'
    )


def _node_cli(dsn: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    flags = [arg for k, v in TIMINGS.items() for arg in (f"--{k.replace('_', '-')}", str(v))]
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--log-format", "json", "node", "--node-id", "cli", *flags, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("case", ["schema", "authentication", "at and slash", "question mark", "garbage"])
def test_the_node_command_exits_2_with_one_line_naming_the_fix(empty_pg_dsn, case):
    parts = urlsplit(empty_pg_dsn)
    server = f"{parts.hostname}:{parts.port}"
    dsn = {
        "schema": empty_pg_dsn,
        "authentication": f"postgresql://nobody_here:SuperSecret42@{server}{parts.path}",
        "at and slash": f"postgresql://op:Pass@SuperSecret42/x@{server}{parts.path}",
        "question mark": f"postgresql://op:Pass?SuperSecret42@{server}{parts.path}",
        "garbage": "garbage",
    }[case]
    process = _node_cli(dsn)
    try:
        stdout, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:  # still retrying: the fault this test guards against
            process.kill()
            process.communicate()
    assert process.returncode == 2, stderr
    (line,) = [line for line in stderr.splitlines() if not line.startswith("{")]
    if case == "schema":
        assert line == f"error: store: the schema is missing (no alembic_version table); {UPGRADE_HINT}"
    elif case == "authentication":
        assert line.startswith("error: store: ") and 'role "nobody_here" does not exist' in line
    elif case == "garbage":
        assert line.startswith("error: dsn: must be a URI")
    else:  # the DSN came from SCHEDULER_DSN (_node_cli): the error says so
        assert line == f"error: {DSN_RULE}; set by SCHEDULER_DSN"
    assert "SuperSecret42" not in stdout + stderr
    assert not [json.loads(x) for x in stderr.splitlines() if x.startswith("{") and '"node_started"' in x]


@pytest.mark.parametrize("flag", ["--metrics-port", "--api-port"])
def test_a_port_in_use_is_a_bad_setting_exit_2_as_for_scheduler_api(pg_dsn, flag):
    """A node's --metrics-port or --api-port already in use exits 2 with one line, as
    `scheduler api --port` does (the node exited 1, a system failure; a trial)."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        process = _node_cli(pg_dsn, flag, str(port))
        try:
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 2, stderr
    (line,) = [line for line in stderr.splitlines() if not line.startswith("{")]
    field = flag[2:].replace("-", "_")
    assert line.startswith(f"error: {field}: cannot listen on 127.0.0.1:{port} ("), line


def test_an_unreachable_store_is_transient_the_node_keeps_retrying(pg_dsn):
    process = _node_cli(with_netloc(pg_dsn, netloc=f"postgres@127.0.0.1:{closed_port()}"))
    try:
        time.sleep(4.0)  # several start-up checks and loop retries
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert events[0] == "store_unavailable" and "node_started" in events and events[-1] == "node_stopped"
