"""A node's etcd lease and membership key (the etcd coordinator's membership room).

One etcd lease per node process, TTL ``ttl_s`` (whole seconds; etcd may
raise it to its own minimum, which is logged); the membership key
``<prefix>members/<node id>`` (``{"incarnation", "host", "pid"}``) and every
partition key the node claims hang on it, so they all expire together.
Coroutines run on the coordinator's :class:`~scheduler.coordination.etcd_link.EtcdLink`
loop; each counts the etcd requests it sends.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid

from scheduler import log
from scheduler.coordination.etcd_keys import KeyLayout
from scheduler.coordination.etcd_link import EtcdLink


class EtcdMember:
    """The lease (``lease_id``: None when the node has none) and the membership key
    of node ``node_id`` (process ``incarnation``)."""

    def __init__(self, link: EtcdLink, layout: KeyLayout, node_id: str, ttl_s: int) -> None:
        self._link = link
        self._layout = layout
        self.node_id = node_id
        self.ttl_s = ttl_s
        self.incarnation = uuid.uuid4()
        self.lease_id: int | None = None
        self.granted_ttl_s: int | None = None
        self.join_revision = 0
        """etcd's revision when the membership key was last put."""

    async def register(self) -> None:
        """Grant a lease if there is none and (re)put the membership key on it."""
        client = await self._link.client()
        if self.lease_id is None:
            self._link.requests += 1
            lease = await client.lease(self.ttl_s)
            self.lease_id, self.granted_ttl_s = lease.id, lease.ttl
            if lease.ttl != self.ttl_s:
                log.event(
                    "etcd_lease_ttl_adjusted",
                    logging.WARNING,
                    node=self.node_id,
                    requested_ttl_s=self.ttl_s,
                    granted_ttl_s=lease.ttl,
                    note="etcd enforces a minimum TTL; local deadlines still use lease_ttl_s",
                )
        value = json.dumps(
            {"incarnation": str(self.incarnation), "host": socket.gethostname(), "pid": os.getpid()}
        ).encode()
        self._link.requests += 1
        put = await client.put(self._layout.member_key(self.node_id), value, lease=self.lease_id)
        self.join_revision = put.header.revision

    async def revoke(self) -> None:
        """Revoke the lease: the membership key and every key on it go at once."""
        client = await self._link.client()
        lease_id, self.lease_id = self.lease_id, None
        self._link.requests += 1
        await client.revoke_lease(lease_id)

    async def keepalive(self) -> set[bytes] | None:
        """One keep-alive, then the keys on the lease; None if there is no lease or it is gone."""
        if self.lease_id is None:
            return None
        client = await self._link.client()
        self._link.requests += 1
        reply = await client.refresh_lease(self.lease_id)
        if reply is None or reply.TTL <= 0:
            return None
        self._link.requests += 1
        info = await client.get_lease_info(self.lease_id, keys=True)
        if info.TTL <= 0:
            return None
        return set(info.keys)
