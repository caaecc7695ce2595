"""Cluster status: live nodes, partition ownership, orphaned partitions."""

from __future__ import annotations

from collections import defaultdict

import psycopg

from scheduler import store


def cluster_status(conn: psycopg.Connection, lease_ttl_s: float) -> dict:
    """Snapshot of membership and leases, judged by store time.

    Returns ``{"nodes": [{node_id, live, heartbeat_age_s, partitions, epochs}],
    "partitions_total", "partitions_owned_live", "partitions_orphaned",
    "orphaned_sample": [first 20 orphaned partition rows]}``. A partition is
    *owned live* when its owner has a fresh heartbeat and its lease has not
    expired; every other partition is orphaned (free, expired, or owned by a
    dead node). ``epochs`` is ``[min, max]`` of the node's partition epochs.
    """
    params = {"ttl_s": lease_ttl_s}
    nodes = store.execute(conn, "node_status", params)
    partitions = store.execute(conn, "partition_status", params)
    owned: dict[str, list[dict]] = defaultdict(list)
    orphaned = []
    for row in partitions:
        live = row["owner_live"] and row["lease_left_s"] is not None and row["lease_left_s"] > 0
        if live:
            owned[row["owner_node"]].append(row)
        else:
            orphaned.append(row)
    out_nodes = []
    for node in nodes:
        mine = owned.get(node["node_id"], [])
        epochs = [row["owner_epoch"] for row in mine]
        out_nodes.append({
            "node_id": node["node_id"],
            "live": node["heartbeat_age_s"] < lease_ttl_s,
            "heartbeat_age_s": round(node["heartbeat_age_s"], 3),
            "partitions": len(mine),
            "epochs": [min(epochs), max(epochs)] if epochs else [],
            "host": node["host"], "pid": node["pid"],
        })
    return {
        "nodes": out_nodes,
        "partitions_total": len(partitions),
        "partitions_owned_live": len(partitions) - len(orphaned),
        "partitions_orphaned": len(orphaned),
        "orphaned_sample": [
            {k: row[k] for k in ("partition_id", "owner_node", "owner_epoch", "lease_left_s", "lease_age_s")}
            for row in orphaned[:20]
        ],
    }
