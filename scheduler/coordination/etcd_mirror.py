"""The etcd coordinator's mirror of membership and partition keys, kept by a watch.

List the prefix, then watch it from the listed revision + 1; re-list after
any watch failure. A member joining or leaving, or a partition key deleted
(expired or released), calls the ``on_change`` callback (the lease loop's
``wake``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

from scheduler import log
from scheduler.coordination.etcd_keys import KeyLayout, first_line
from scheduler.coordination.etcd_link import EtcdLink
from scheduler.errors import CoordinatorError


class EtcdMirror:
    """Members and partition owners as the watch last saw them.

    Under ``lock``: ``members`` (node id → membership value) and ``owners``
    (partition → etcd lease id of its key). ``synced`` is set once the first
    listing is applied. The watch runs on ``link``'s event loop.
    """

    def __init__(self, link: EtcdLink, layout: KeyLayout, node_id: str) -> None:
        self._link = link
        self._layout = layout
        self._node_id = node_id
        self.lock = threading.Lock()
        self.members: dict[str, bytes] = {}
        self.owners: dict[int, int] = {}
        self.synced: asyncio.Event | None = None
        self.on_change: Callable[[], None] | None = None
        self.closing = False
        self._task: asyncio.Task | None = None

    def is_synced(self) -> bool:
        """True once the first listing has been applied."""
        return self.synced is not None and self.synced.is_set()

    def member_ids(self) -> list[str]:
        """Member node ids, sorted."""
        with self.lock:
            return sorted(self.members)

    def taken(self) -> set[int]:
        """Partitions whose key exists."""
        with self.lock:
            return set(self.owners)

    def _notify(self) -> None:
        callback = self.on_change
        if callback is not None:
            callback()

    def _apply_snapshot(self, kvs: Iterable) -> None:
        members: dict[str, bytes] = {}
        owners: dict[int, int] = {}
        for kv in kvs:
            node = self._layout.member(kv.key)
            if node is not None:
                members[node] = kv.value
            else:
                pid = self._layout.pid(kv.key)
                if pid is not None:
                    owners[pid] = kv.lease
        with self.lock:
            self.members = members
            self.owners = owners

    def _apply_event(self, event) -> bool:
        """Update the mirror; return True if the lease loop should rebalance."""
        key = event.kv.key
        put = event.kind == "PUT"
        with self.lock:
            node = self._layout.member(key)
            if node is not None:
                if put:
                    known = node in self.members
                    self.members[node] = event.kv.value
                    return not known
                return self.members.pop(node, None) is not None
            pid = self._layout.pid(key)
            if pid is None:
                return False
            if put:
                self.owners[pid] = event.kv.lease
                return False
            self.owners.pop(pid, None)
            return True

    async def start(self, timeout_s: float) -> None:
        """Start the watch (if not running) and wait up to ``timeout_s`` for the first listing."""
        if self.synced is None:
            self.synced = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch_loop())
        await asyncio.wait_for(self.synced.wait(), timeout_s)

    async def stop(self) -> None:
        """Stop the watch (on the link's loop)."""
        self.closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def _watch_loop(self) -> None:
        delay_s = 0.05
        while not self.closing:
            try:
                client = await self._link.client()
                self._link.requests += 1
                snapshot = await client.get_prefix(self._layout.prefix)
                self._apply_snapshot(snapshot)
                self.synced.set()
                self._notify()
                self._link.requests += 1
                watch = await client.watch_prefix(self._layout.prefix, start_revision=snapshot.header.revision + 1)
                delay_s = 0.05
                async for event in watch:
                    if self._apply_event(event):
                        self._notify()
                if not self.closing:
                    raise CoordinatorError("watch stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.closing:
                    return
                log.event(
                    "etcd_watch_failed",
                    logging.WARNING,
                    node=self._node_id,
                    endpoint=self._link.endpoint,
                    error=first_line(exc),
                    retry_in_s=delay_s,
                )
                await asyncio.sleep(delay_s)
                delay_s = min(1.0, delay_s * 2)
