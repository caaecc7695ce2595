"""``scheduler status`` (scheduler/status.py): node states and the orphaned-partition list.

The store is set up by hand, relative to its own clock: three nodes whose
heartbeats are 1 s (live), 7 s (suspect: past the responsiveness bound of
5 s, renew 3 s + 2 polls of 1 s, but within the 10 s TTL) and 12 s (dead)
old, each bound ≥ 2 s away from every age, so the states are exact whatever
the test's own timing. Lease rows are written to the table ``renew_leases``
writes.
"""

from __future__ import annotations

import json
import os
import re

import psycopg
from click.testing import CliRunner

from scheduler import store
from scheduler.cli import cli

LEASE_TABLE = re.search(r"UPDATE\s+(\w+)", store.QUERIES["renew_leases"]).group(1)


def run(args: list[str], dsn: str):
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def lease(conn: psycopg.Connection, pids: range, owner: str, epoch: int, left_s: float) -> None:
    conn.execute(
        "UPDATE partitions SET owner_node = %s, owner_epoch = %s WHERE partition_id = ANY(%s)",
        (owner, epoch, list(pids)),
    )
    conn.execute(
        f"UPDATE {LEASE_TABLE} SET owner_node = %s, owner_epoch = %s,"
        f" lease_expires_at = now() + %s * interval '1 second', renewed_at = now()"
        f" WHERE partition_id = ANY(%s)",
        (owner, epoch, left_s, list(pids)),
    )


def setup_fleet(conn: psycopg.Connection) -> None:
    for node_id, age_s in (("n-fresh", 1), ("n-suspect", 7), ("n-dead", 12)):
        conn.execute(
            "INSERT INTO nodes (node_id, incarnation, host, pid, started_at, heartbeat_at)"
            " VALUES (%s, gen_random_uuid(), 'h', 1, now() - interval '1 hour',"
            "         now() - %s * interval '1 second')",
            (node_id, age_s),
        )
    lease(conn, range(0, 100), "n-fresh", 5, 9.0)
    lease(conn, range(100, 500), "n-suspect", 3, 4.0)
    lease(conn, range(500, 530), "n-dead", 2, -2.0)  # expired: orphaned, first in the list


def test_status_json_marks_a_node_past_the_responsiveness_bound_suspect(pg_dsn: str, conn: psycopg.Connection) -> None:
    setup_fleet(conn)
    result = run(["status", "--json"], pg_dsn)
    assert result.exit_code == 0, result.stderr
    status = json.loads(result.stdout)

    nodes = {node["node_id"]: node for node in status["nodes"]}
    assert {n: (v["state"], v["live"], v["partitions"], v["epochs"]) for n, v in nodes.items()} == {
        "n-dead": ("dead", False, 0, []),
        "n-fresh": ("live", True, 100, [5, 5]),
        "n-suspect": ("suspect", True, 400, [3, 3]),
    }
    for node_id, age_s in (("n-fresh", 1), ("n-suspect", 7), ("n-dead", 12)):
        assert age_s <= nodes[node_id]["heartbeat_age_s"] < age_s + 1.5, nodes[node_id]
    assert 2.5 < nodes["n-suspect"]["lease_left_s"] <= 4.0
    assert (status["lease_ttl_s"], status["responsive_s"]) == (10.0, 5.0)
    assert (
        status["partitions_total"],
        status["partitions_owned_live"],
        status["partitions_owned_suspect"],
        status["partitions_orphaned"],
    ) == (1024, 500, 400, 524)
    assert [row["partition_id"] for row in status["orphaned_sample"]] == list(range(500, 520))
    assert {row["owner_node"] for row in status["orphaned_sample"]} == {"n-dead"}


def test_status_text_says_heartbeat_age_against_the_ttl_and_how_many_orphans_are_not_listed(
    pg_dsn: str, conn: psycopg.Connection
) -> None:
    setup_fleet(conn)
    result = run(["status", "--renew-interval-s", "3", "--poll-interval-s", "1"], pg_dsn)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()

    assert re.split(r"\s{2,}", lines[0]) == ["NODE_ID", "STATE", "HEARTBEAT", "PARTITIONS", "EPOCHS", "LEASE_LEFT_S"]
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line) for line in lines[1:4])}
    assert [rows[n][1] for n in ("n-dead", "n-fresh", "n-suspect")] == ["dead", "live", "suspect"]
    assert re.fullmatch(r"7\.\ds of 10s TTL", rows["n-suspect"][2]), rows["n-suspect"]
    assert re.fullmatch(r"1\.\ds of 10s TTL", rows["n-fresh"][2]), rows["n-fresh"]
    assert (rows["n-suspect"][3], rows["n-suspect"][4]) == ("400", "[3, 3]")
    assert lines[4] == (
        "partitions: 1024 total, 500 owned by live nodes (400 of them by suspect nodes), 524 without a live owner"
    )
    assert lines[5].startswith("suspect: no heartbeat for 5s or more (renew + 2 polls)")
    orphan_lines = lines[6:]
    assert [line.split()[2] for line in orphan_lines[:20]] == [str(pid) for pid in range(500, 520)]
    assert orphan_lines[20:] == ["  and 504 more orphaned partitions"]


def test_status_of_a_healthy_fleet_lists_no_suspect_and_no_more_line(pg_dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO nodes (node_id, incarnation) VALUES ('n1', gen_random_uuid())")
    lease(conn, range(0, 1024), "n1", 1, 9.0)
    result = run(["status"], pg_dsn)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, lines
    assert re.split(r"\s{2,}", lines[1])[:2] == ["n1", "live"]
    assert lines[2] == "partitions: 1024 total, 1024 owned by live nodes, 0 without a live owner"
