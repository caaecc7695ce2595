"""A node's start-up check of its store (scheduler/node.py, store.check_node_store).

A fatal misconfiguration ends the node at start, before anything runs
(:class:`StoreSetupError`; ``scheduler node`` exits 2 with the fix in one
line): the schema missing or behind the code's head revision, the
authentication refused (an unknown role here: the test cluster trusts every
password), the database absent, a URI password with an unescaped ``@``. A
store that cannot be reached (a closed port) is transient: the node starts
and keeps retrying, as before. A schema newer than the code (a rolling
upgrade) is accepted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from scheduler.errors import StoreSetupError
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.settings import Settings

from helpers import closed_port

TIMINGS = {"lease_ttl_s": 2.0, "renew_interval_s": 0.5, "poll_interval_s": 0.25, "tick_interval_s": 0.5,
           "safety_margin_s": 0.5}
UPGRADE_HINT = "run `scheduler db upgrade` first"


def with_netloc(dsn: str, netloc: str | None = None, path: str | None = None) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=netloc or parts.netloc, path=path or parts.path))


def node_for(dsn: str) -> Node:
    return Node(Settings(dsn=dsn, node_id="starter", **TIMINGS), metrics=Metrics())


def refused(dsn: str) -> str:
    node = node_for(dsn)
    with pytest.raises(StoreSetupError) as caught:
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


def test_an_unescaped_at_in_the_password_is_refused_and_never_printed(pg_dsn):
    parts = urlsplit(pg_dsn)
    message = refused(with_netloc(pg_dsn, netloc=f"postgres:Pass@SuperSecret42@{parts.hostname}:{parts.port}"))
    assert "SuperSecret42" not in message and "Pass" not in message
    assert "failed to resolve host '***@127.0.0.1'" in message
    assert message.endswith("a URI password must percent-encode '@' as %40")


def _node_cli(dsn: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    flags = [arg for k, v in TIMINGS.items() for arg in (f"--{k.replace('_', '-')}", str(v))]
    return subprocess.Popen([sys.executable, "-m", "scheduler", "--log-format", "json", "node", "--node-id", "cli",
                             *flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("case", ["schema", "authentication"])
def test_the_node_command_exits_2_with_one_line_naming_the_fix(empty_pg_dsn, case):
    parts = urlsplit(empty_pg_dsn)
    dsn = empty_pg_dsn if case == "schema" else with_netloc(
        empty_pg_dsn, netloc=f"nobody_here:Pass@SuperSecret42@{parts.hostname}:{parts.port}")
    process = _node_cli(dsn)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 2, stderr
    (line,) = [line for line in stderr.splitlines() if not line.startswith("{")]
    assert line.startswith("error: store: ")
    if case == "schema":
        assert line.endswith(UPGRADE_HINT)
    else:
        assert "SuperSecret42" not in stdout + stderr
    assert not [json.loads(x) for x in stderr.splitlines() if x.startswith("{") and '"node_started"' in x]


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
