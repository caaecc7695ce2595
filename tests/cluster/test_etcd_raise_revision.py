"""``scheduler etcd raise-revision``: the switch from SQL epochs to the etcd coordinator
(docs/operations.md, 'Switching coordinators'), run as an operator runs it.

On the session's throwaway etcd (shared: each test reads its revision first)
and a fresh database whose epochs are set above that revision:

* the command raises etcd's revision exactly past the store's largest epoch
  (puts, then deletes the bump key), after which an etcd coordinator joins
  where it refused before; a second run changes nothing;
* the first endpoint that answers is used;
* bad input is one line on stderr and exit status 2, nothing written; an
  etcd that does not answer is exit status 1.
"""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from harness import run_cli
from helpers import closed_port

from scheduler.coordination.etcd_gateway import BUMP_KEY, range_prefix
from scheduler.devtools.etcd_server import ThrowawayEtcd
from scheduler.errors import EpochRegressionError
from scheduler.metrics import Metrics
from scheduler.settings import Settings

pytestmark = pytest.mark.cluster


def revision(server: ThrowawayEtcd) -> int:
    return range_prefix(server.endpoint, "/")[0]


def epochs_above(conn: psycopg.Connection, server: ThrowawayEtcd, by: int) -> int:
    """Set partition 17's epoch ``by`` above etcd's revision, partition 900's one below that; the top."""
    top = revision(server) + by
    conn.execute("UPDATE partitions SET owner_epoch = %s WHERE partition_id = 17", (top,))
    conn.execute("UPDATE partitions SET owner_epoch = %s WHERE partition_id = 900", (top - 1,))
    return top


def unraised(server: ThrowawayEtcd, before: int) -> bool:
    """etcd's revision did not jump since ``before``. The server is shared by the
    session: leases of earlier tests' coordinators expire (deleting their keys)
    whenever they do, so a few revisions may pass; a raise moves it hundreds."""
    return before <= revision(server) < before + 50


def one_line_error(result, status: int) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stdout == "", (result.stdout, result.stderr)
    return lines[0]


def join_etcd(pg_dsn: str, server: ThrowawayEtcd, prefix: str) -> None:
    """Join (and leave) an etcd coordinator: what a node does at start (EpochRegressionError if refused)."""
    from scheduler.coordination.etcd import EtcdCoordinator

    settings = Settings(
        dsn=pg_dsn, node_id="joiner", coordinator="etcd", etcd_endpoints=server.endpoint, etcd_prefix=prefix
    ).validated()
    coordinator = EtcdCoordinator(settings, Metrics())
    try:
        coordinator.join()
    finally:
        coordinator.close()


def test_raises_the_revision_past_the_stored_epochs_then_a_node_may_join(
    pg_dsn: str, conn: psycopg.Connection, etcd_server: ThrowawayEtcd, etcd_prefix: str
) -> None:
    top = epochs_above(conn, etcd_server, 300)
    with pytest.raises(EpochRegressionError, match=f"below the store's owner_epoch {top} "):
        join_etcd(pg_dsn, etcd_server, etcd_prefix)
    before = revision(etcd_server)

    result = run_cli("etcd", "raise-revision", "--dsn", pg_dsn, "--etcd-endpoints", etcd_server.endpoint)

    assert result.returncode == 0, result.stderr
    # puts up to top + 1 (the first revision above the top), then the delete of the bump key: top + 2.
    # The etcd server is shared by the session: leases of earlier tests' coordinators
    # expire (and delete their keys) whenever they do, so other writes may land between
    # these reads: revisions are bounded below, not pinned.
    said = re.fullmatch(
        rf"etcd revision (\d+) -> (\d+), above the store's largest owner_epoch "
        rf"{top} \(partition 17\): nodes may start with --coordinator etcd\n",
        result.stdout,
    )
    assert said is not None, result.stdout
    assert before <= int(said.group(1)) < top < top + 2 <= int(said.group(2))
    assert revision(etcd_server) >= top + 2
    assert range_prefix(etcd_server.endpoint, BUMP_KEY)[1] == []
    join_etcd(pg_dsn, etcd_server, etcd_prefix)  # no refusal now

    # Already above: a second run changes nothing (the joined coordinator's close may
    # still be deleting its keys, so etcd's revision is read from the run itself).
    again = run_cli("etcd", "raise-revision", "--dsn", pg_dsn, "--etcd-endpoints", etcd_server.endpoint, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["before"] == report["after"] > top + 1
    assert report == {
        "top_epoch": top,
        "partition": 17,
        "before": report["before"],
        "after": report["after"],
        "endpoint": etcd_server.endpoint,
    }
    assert revision(etcd_server) >= report["after"]


def test_the_first_endpoint_that_answers_is_used(
    pg_dsn: str, conn: psycopg.Connection, etcd_server: ThrowawayEtcd
) -> None:
    # Far enough above that the shared server's own writes (earlier tests' leases expiring:
    # 5 was overtaken once on a loaded machine) cannot reach it before the raise does.
    top = epochs_above(conn, etcd_server, 200)
    dead = f"127.0.0.1:{closed_port()}"

    result = run_cli(
        "etcd", "raise-revision", "--dsn", pg_dsn, "--etcd-endpoints", f"{dead},{etcd_server.endpoint}", "--json"
    )

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["endpoint"] == etcd_server.endpoint
    assert report["after"] >= top + 2 and revision(etcd_server) >= top + 2  # a shared etcd: see above


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [
        (
            "",
            "error: etcd_endpoints: the etcd coordinator needs at least one host:port "
            "(--etcd-endpoints / SCHEDULER_ETCD_ENDPOINTS)",
        ),
        ("etcd-1", "error: etcd_endpoints: each endpoint must be host:port (got 'etcd-1')"),
        ("etcd-1:99999", "error: etcd_endpoints: each endpoint must be host:port (got 'etcd-1:99999')"),
    ],
)
def test_bad_endpoints_are_one_line_and_status_2(
    pg_dsn: str, conn: psycopg.Connection, etcd_server: ThrowawayEtcd, endpoints: str, message: str
) -> None:
    before = revision(etcd_server)
    epochs_above(conn, etcd_server, 300)  # a raise would move etcd's revision 300 and more
    result = run_cli("etcd", "raise-revision", "--dsn", pg_dsn, "--etcd-endpoints", endpoints)
    assert one_line_error(result, 2) == message
    assert unraised(etcd_server, before)


def test_no_store_is_one_line_and_status_2(etcd_server: ThrowawayEtcd) -> None:
    before = revision(etcd_server)
    result = run_cli("etcd", "raise-revision", "--etcd-endpoints", etcd_server.endpoint)
    assert one_line_error(result, 2).startswith("error: dsn: no store configured; pass --dsn or set SCHEDULER_DSN")
    assert unraised(etcd_server, before)


def test_a_store_never_migrated_is_one_line_and_status_2(empty_pg_dsn: str, etcd_server: ThrowawayEtcd) -> None:
    before = revision(etcd_server)
    result = run_cli("etcd", "raise-revision", "--dsn", empty_pg_dsn, "--etcd-endpoints", etcd_server.endpoint)
    line = one_line_error(result, 2)
    assert line == (
        "error: store: the schema is missing (no alembic_version table); run `scheduler db upgrade` first"
    ), line
    assert unraised(etcd_server, before)


def test_no_etcd_answering_is_one_line_and_status_1(pg_dsn: str, conn: psycopg.Connection) -> None:
    port = closed_port()
    result = run_cli("etcd", "raise-revision", "--dsn", pg_dsn, "--etcd-endpoints", f"127.0.0.1:{port}")
    assert one_line_error(result, 1) == (
        f"error: etcd_endpoints: no endpoint answered (127.0.0.1:{port}: URLError: [Errno 111] Connection refused)"
    )
