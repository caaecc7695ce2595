"""The etcd coordinator's partition-key transactions: claim, delete (keyed on lease and epoch), list."""

from __future__ import annotations

from scheduler.coordination.etcd_keys import KeyLayout
from scheduler.coordination.etcd_link import EtcdLink, rpc

MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: operations per transaction branch."""


class PartitionKeys:
    """Transactions on the partition keys through ``link`` (coroutines: run them with ``link.call``)."""

    def __init__(self, link: EtcdLink, layout: KeyLayout) -> None:
        self._link = link
        self._layout = layout

    async def claim(self, pids: list[int], value: bytes, lease_id: int | None) -> tuple[bool, int, dict[int, int]]:
        """Put every key of ``pids`` (value ``value``, on ``lease_id``) if none exists, in one transaction.

        Returns ``(succeeded, revision, taken)``: the revision is the claim's
        epoch when it succeeded; otherwise ``taken`` maps each key that
        exists to its lease id.
        """
        keys = [self._layout.key(pid) for pid in pids]
        response = await self._link.txn(
            [rpc.Compare(key=k, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0) for k in keys],
            [rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=value, lease=lease_id)) for k in keys],
            [rpc.RequestOp(request_range=rpc.RangeRequest(key=k)) for k in keys],
        )
        if response.succeeded:
            return True, response.header.revision, {}
        taken = {}
        for op in response.responses:
            for kv in op.response_range.kvs:
                pid = self._layout.pid(kv.key)
                if pid is not None:
                    taken[pid] = kv.lease
        return False, response.header.revision, taken

    async def listed(self) -> set[int]:
        """Partitions whose key exists, listed from etcd itself (not the mirror)."""
        client = await self._link.client()
        self._link.requests += 1
        listed = await client.get_prefix(self._layout.partitions, keys_only=True)
        return {pid for pid in (self._layout.pid(kv.key) for kv in listed) if pid is not None}

    async def delete(self, items: list[tuple[int, int | None]], lease_id: int | None) -> list[int]:
        """Delete our keys: each only if it hangs on ``lease_id`` and, unless the epoch
        given is None, its create_revision is that epoch (keyed on node and epoch:
        another node's key, or ours from another claim, is left alone). Return the
        partitions whose key was deleted."""

        def compare(pid: int, epoch: int | None) -> list:
            key = self._layout.key(pid)
            ours = rpc.Compare(key=key, target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease_id or 0)
            if epoch is None:
                return [ours]
            return [
                ours,
                rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=epoch),
            ]

        def delete(pid: int):
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self._layout.key(pid)))

        deleted: list[int] = []
        step = MAX_TXN_OPS // 2  # up to two compares per key
        for start in range(0, len(items), step):
            chunk = items[start : start + step]
            response = await self._link.txn(
                [c for pid, epoch in chunk for c in compare(pid, epoch)], [delete(pid) for pid, _ in chunk], []
            )
            if response.succeeded:
                deleted += [pid for pid, _ in chunk]
                continue
            for pid, epoch in chunk:  # some key is not ours any more: one by one
                single = await self._link.txn(compare(pid, epoch), [delete(pid)], [])
                if single.succeeded:
                    deleted.append(pid)
        return deleted
