"""Cluster status: nodes and their state, partition ownership, orphaned partitions.

Judged by store time, from the ``nodes`` heartbeat rows and the ``leases``
rows (the fence's epoch from ``partitions``). A node's **state**:

* ``live``: heartbeat younger than the responsiveness bound
  (``Settings.responsive_s``: renew + 2 polls, 5 s by default), the bound under
  which peers count it when they compute shares;
* ``suspect``: older than that but younger than the lease TTL. The node is
  dead or frozen as far as sharing goes (peers no longer count it), but its
  unexpired leases still protect its partitions: nobody else fires them
  until they expire (``lease_left_s`` says when, at the latest);
* ``dead``: heartbeat older than the TTL (its row is pruned after
  ``node_prune_after_s``).

With the etcd coordinator membership and leases live in etcd; this view then
shows only what claims wrote (docs/operations.md, "Running with etcd").
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import psycopg

from scheduler import store

ORPHANED_SAMPLE = 20
"""Orphaned partitions listed by :func:`cluster_status` (the total is always given)."""


def node_state(heartbeat_age_s: float, lease_ttl_s: float, responsive_s: float) -> str:
    """``"live"`` (age < ``responsive_s``), ``"suspect"`` (< ``lease_ttl_s``) or ``"dead"``; seconds."""
    if heartbeat_age_s < responsive_s:
        return "live"
    return "suspect" if heartbeat_age_s < lease_ttl_s else "dead"


def cluster_status(
    conn: psycopg.Connection, lease_ttl_s: float, responsive_s: float, now: datetime | None = None
) -> dict:
    """Snapshot of membership and leases, judged by store time (seconds throughout).

    ``now``: the store clock's pin (a test's, :meth:`scheduler.clock.Clock.store_now_or_none`);
    None (always, outside tests) judges by the store's ``now()``.

    Returns ``{"lease_ttl_s", "responsive_s", "nodes": [{node_id, state,
    live, heartbeat_age_s, partitions, epochs, lease_left_s, host, pid}]
    (by node id), "partitions_total", "partitions_owned_live",
    "partitions_owned_suspect", "partitions_orphaned", "orphaned_sample":
    [the first ORPHANED_SAMPLE orphaned partitions by id: partition_id,
    owner_node, owner_epoch, lease_left_s, lease_age_s]}``.

    ``state`` is :func:`node_state`; ``live`` is true unless the node is
    dead (heartbeat younger than the TTL). A partition is *owned live* when
    its lease has not expired and its owner is live or suspect
    (``partitions_owned_suspect`` counts those of suspect owners); every
    other partition is orphaned (free, expired, or its owner dead or gone).
    ``epochs`` is ``[min, max]`` of the node's partition epochs (the fence's),
    ``lease_left_s`` the longest time left on its leases (None without any).
    """
    nodes = store.execute(conn, "node_status", {"now": now})
    partitions = store.execute(conn, "partition_status", {"now": now})
    states = {node["node_id"]: node_state(node["heartbeat_age_s"], lease_ttl_s, responsive_s) for node in nodes}
    owned: dict[str, list[dict]] = defaultdict(list)
    orphaned = []
    for row in partitions:
        unexpired = row["lease_left_s"] is not None and row["lease_left_s"] > 0
        if unexpired and states.get(row["owner_node"], "dead") != "dead":
            owned[row["owner_node"]].append(row)
        else:
            orphaned.append(row)
    out_nodes = []
    for node in nodes:
        mine = owned.get(node["node_id"], [])
        epochs = [row["owner_epoch"] for row in mine]
        state = states[node["node_id"]]
        out_nodes.append(
            {
                "node_id": node["node_id"],
                "state": state,
                "live": state != "dead",
                "heartbeat_age_s": round(node["heartbeat_age_s"], 3),
                "partitions": len(mine),
                "epochs": [min(epochs), max(epochs)] if epochs else [],
                "lease_left_s": round(max(row["lease_left_s"] for row in mine), 3) if mine else None,
                "host": node["host"],
                "pid": node["pid"],
            }
        )
    return {
        "lease_ttl_s": lease_ttl_s,
        "responsive_s": responsive_s,
        "nodes": out_nodes,
        "partitions_total": len(partitions),
        "partitions_owned_live": len(partitions) - len(orphaned),
        "partitions_owned_suspect": sum(
            len(owned.get(n["node_id"], [])) for n in nodes if states[n["node_id"]] == "suspect"
        ),
        "partitions_orphaned": len(orphaned),
        "orphaned_sample": [
            {k: row[k] for k in ("partition_id", "owner_node", "owner_epoch", "lease_left_s", "lease_age_s")}
            for row in orphaned[:ORPHANED_SAMPLE]
        ],
    }
