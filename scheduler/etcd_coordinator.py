"""The etcd coordinator: leases and membership in etcd, epochs in the store (docs/design.md §2, the seed).

Keys, under ``settings.etcd_prefix`` (default ``/scheduler/``)::

    <prefix>members/<node id>        {"incarnation", "host", "pid"}   attached to the node's lease
    <prefix>partitions/<0000-1023>   <node id>                        attached to the node's lease

One etcd lease per node process (TTL ``lease_ttl_s`` rounded up to whole
seconds; etcd raises it to its own minimum, 2 s with the default election
timeout), kept alive every ``renew_interval_s``. The membership key and every
partition key hang on it, so when a node dies they all expire together.

* **Membership by watching.** A watch task on the prefix keeps a mirror of
  the members and of the partition keys (list, then watch from the listed
  revision + 1; re-list after any watch failure). ``live_nodes()`` reads the
  mirror: no membership polling. A member joining or leaving, or a
  partition key deleted (expired or released), wakes the lease loop
  (:meth:`set_on_change`), which rebalances at once rather than at its next
  poll: this is what makes etcd failover faster than the SQL poll.
* **Claim** = one etcd transaction per chunk of ≤ 128 free keys (etcd's
  default ``--max-txn-ops``): ``create_revision == 0`` for every key, then
  put each with our lease; on failure the transaction returns the keys' current
  values, the taken ones are dropped and the rest retried in smaller chunks.
  Free keys are tried in rendezvous-hash order over the live members (each
  node first tries the partitions it "wins"), so racing claimers rarely
  collide. The mirror picks the candidates; if it shows nothing free while
  the node is under its share, etcd is listed at most once per TTL (timed by
  the node's injected clock, like every local time here). The claim's
  revision is the **epoch**, written with ``claim_partitions_at_epoch``
  (``SET owner_epoch = :rev WHERE owner_epoch < :rev`` on the fence row, and
  the store's lease row with it), so a new owner that pauses before writing
  cannot overwrite a newer one.
* **Epoch regression.** A partition whose stored epoch is already ≥ the
  revision (a reset etcd, or a switch from the SQL coordinator's counters)
  is not fenced by our write: it is logged at ERROR (``epoch_regression``
  with the partition, the stored epoch and the revision), not returned (so
  never fired) and its key is deleted (so it is not held unfenced). At join,
  if etcd's current revision is below the store's largest
  ``owner_epoch``, the node refuses to start (:meth:`preflight`) or, if it
  learns it later, to join. See docs/operations.md for the way out.
* **Renew** = one keep-alive plus one ``LeaseTimeToLive(keys=True)``: the
  partitions returned are those whose key still hangs on our lease. If the
  lease has expired (a paused process), every key is gone: nothing is
  returned (the lease loop logs ``lease_lost``), and a new lease and
  membership key are made at once. Keys on our lease that the lease loop
  does not hold (a claim whose store write failed) are deleted.
* **Release** = the store's lease row first (``release_leases``, so it
  reads free; the fence row keeps its epoch), then the keys (a transaction
  per chunk of 64, each delete conditional on the key hanging on our lease
  and its ``create_revision`` being the lease's epoch: keyed on node and
  epoch, so a stale epoch or another node's lease releases nothing).
  **Leave** revokes the lease.

Store writes per second are only claims and releases; the steady state costs
the store nothing (the fence is the same as with the SQL coordinator). etcd
requests in the steady state: 2 per node per ``renew_interval_s``.

Threading: the interface is synchronous (called from the lease loop
thread). The coordinator runs a private asyncio event loop on a daemon
thread; every call submits a coroutine with
``asyncio.run_coroutine_threadsafe(...).result(timeout)``. etcd failures
become :class:`~scheduler.errors.CoordinatorError`, which the lease loop logs
and retries; a connection failure moves to the next endpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Iterable

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.errors import ConfigError, CoordinatorError, EpochRegressionError, SchedulerError
from scheduler.lease import Lease, StoreSession
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings

try:  # the optional 'etcd' extra
    import aetcd
    from aetcd import rpc
except ImportError:  # pragma: no cover - exercised only without the extra
    aetcd = None
    rpc = None

DEFAULT_PREFIX = "/scheduler/"
MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: operations per transaction branch."""
CLAIM_TXNS_MAX = 24
"""Claim transactions one ``claim()`` call may send (lost races included)."""
SWITCHING_COORDINATORS_DOC = "docs/operations.md, 'Switching coordinators'"
"""Where raising etcd's revision above the stored epochs is explained."""
EPOCH_REGRESSION_HINT = (
    "etcd's revision must exceed every stored owner_epoch (a reset etcd, or a switch "
    f"from the SQL coordinator): run `scheduler etcd raise-revision`, see "
    f"{SWITCHING_COORDINATORS_DOC}"
)
"""The ``hint`` of every ``epoch_regression`` record."""


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``"host:port[,host:port]"`` (an ``http://`` prefix is allowed) → ``[(host, port)]``.

    Raises :class:`ConfigError` naming ``etcd_endpoints`` on bad input.
    """
    out: list[tuple[str, int]] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        item = item.removeprefix("http://").rstrip("/")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"etcd_endpoints: each endpoint must be host:port (got {item!r})")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ConfigError(
            "etcd_endpoints: the etcd coordinator needs at least one host:port "
            "(--etcd-endpoints / SCHEDULER_ETCD_ENDPOINTS)"
        )
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class EtcdCoordinator(StoreSession):
    """Ownership decisions in etcd; epochs written to the store. See the module docstring.

    ``clock`` (default :class:`~scheduler.clock.SystemClock`) is the node's
    injected clock; its ``monotonic()`` times the coordinator's local
    decisions (how long ago etcd itself was last listed), so tests can step it,
    and its store pin is the ``now`` of the store queries it sends
    (:class:`~scheduler.store.StoreSession`).
    """

    def __init__(self, settings: Settings, metrics: Metrics, clock: Clock | None = None) -> None:
        if aetcd is None:
            raise ConfigError(
                "coordinator: 'etcd' needs the optional etcd extra "
                "(pip install 'trigger-engine[etcd]', which brings aetcd)"
            )
        super().__init__(settings, metrics, clock)
        self.node_id = settings.node_id
        self.incarnation = uuid.uuid4()
        self._endpoints = parse_endpoints(getattr(settings, "etcd_endpoints", ""))
        self._endpoint_index = 0
        prefix = getattr(settings, "etcd_prefix", "") or DEFAULT_PREFIX
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._prefix = prefix.encode()
        self._members_prefix = f"{prefix}members/".encode()
        self._partitions_prefix = f"{prefix}partitions/".encode()
        self._ttl_s = max(1, math.ceil(settings.lease_ttl_s))
        # Each etcd request is bounded like a store statement: well below the TTL.
        self._timeout_s = settings.effective_statement_timeout_s
        self._scores: dict[str, list[bytes]] = {}  # member -> rendezvous score of each partition
        self._mirror_lock = threading.Lock()
        self._members: dict[str, bytes] = {}
        self._owners: dict[int, int] = {}  # partition -> lease id of its key (the mirror)
        self._held: dict[int, int] = {}  # partition -> epoch (claim revision) this process holds
        self._lease_id: int | None = None
        self._granted_ttl_s: int | None = None
        self._join_revision = 0
        self._last_listed = self._clock.monotonic()
        self._epochs_checked = False
        self._on_change = None
        self._closing = False
        self._closed = False
        self.requests = 0
        """etcd requests this coordinator sent (watch events not counted)."""
        self._loop = asyncio.new_event_loop()
        self._synced: asyncio.Event | None = None
        self._client: aetcd.Client | None = None
        self._watch_task: asyncio.Task | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"etcd-{self.node_id}"[:40], daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ plumbing

    @property
    def endpoint(self) -> str:
        host, port = self._endpoints[self._endpoint_index % len(self._endpoints)]
        return f"{host}:{port}"

    def set_on_change(self, callback) -> None:
        """Call ``callback()`` (from the watch thread) when membership changes or a key is freed."""
        self._on_change = callback

    def _notify(self) -> None:
        callback = self._on_change
        if callback is not None:
            callback()

    def _key(self, pid: int) -> bytes:
        return self._partitions_prefix + f"{pid:04d}".encode()

    def _pid(self, key: bytes) -> int | None:
        if not key.startswith(self._partitions_prefix):
            return None
        try:
            return int(key[len(self._partitions_prefix) :])
        except ValueError:
            return None

    async def _get_client(self):
        if self._client is None:
            host, port = self._endpoints[self._endpoint_index % len(self._endpoints)]
            client = aetcd.Client(host=host, port=port, timeout=self._timeout_s)
            await client.connect()
            self._client = client
        return self._client

    async def _drop_client(self) -> None:
        """Close the client after a connection failure; the next call tries the next endpoint."""
        client, self._client = self._client, None
        self._endpoint_index += 1
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def _guarded(self, fn, *args):
        try:
            return await fn(*args)
        except asyncio.CancelledError:
            raise
        except (SchedulerError, psycopg.Error):
            raise
        except Exception as exc:  # the client's, grpc's and asyncio's errors alike
            endpoint = self.endpoint
            if aetcd is not None and isinstance(
                exc, (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, asyncio.TimeoutError, OSError)
            ):
                await self._drop_client()
            raise CoordinatorError(f"etcd {endpoint}: {_first_line(exc)}") from exc

    def _call(self, fn, *args, what: str):
        """Run ``fn(*args)`` on the coordinator's event loop; wait (bounded) for its result."""
        if self._closed:
            raise CoordinatorError("etcd coordinator is closed")
        future = asyncio.run_coroutine_threadsafe(self._guarded(fn, *args), self._loop)
        try:
            return future.result(self._timeout_s * 4 + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CoordinatorError(f"etcd {self.endpoint}: {what} timed out") from None

    async def _txn(self, compare, success, failure):
        client = await self._get_client()
        self.requests += 1
        return await client.kvstub.Txn(
            rpc.TxnRequest(compare=compare, success=success, failure=failure),
            timeout=self._timeout_s,
            metadata=client.metadata,
        )

    # ------------------------------------------------------------------ watch

    def _apply_snapshot(self, kvs: Iterable) -> None:
        members: dict[str, bytes] = {}
        owners: dict[int, int] = {}
        for kv in kvs:
            if kv.key.startswith(self._members_prefix):
                members[kv.key[len(self._members_prefix) :].decode(errors="replace")] = kv.value
            else:
                pid = self._pid(kv.key)
                if pid is not None:
                    owners[pid] = kv.lease
        with self._mirror_lock:
            self._members = members
            self._owners = owners

    def _apply_event(self, event) -> bool:
        """Update the mirror; return True if the lease loop should rebalance."""
        key = event.kv.key
        put = event.kind == "PUT"
        with self._mirror_lock:
            if key.startswith(self._members_prefix):
                node = key[len(self._members_prefix) :].decode(errors="replace")
                if put:
                    known = node in self._members
                    self._members[node] = event.kv.value
                    return not known
                return self._members.pop(node, None) is not None
            pid = self._pid(key)
            if pid is None:
                return False
            if put:
                self._owners[pid] = event.kv.lease
                return False
            self._owners.pop(pid, None)
            return True

    async def _watch_loop(self) -> None:
        delay_s = 0.05
        while not self._closing:
            try:
                client = await self._get_client()
                self.requests += 1
                snapshot = await client.get_prefix(self._prefix)
                self._apply_snapshot(snapshot)
                self._synced.set()
                self._notify()
                self.requests += 1
                watch = await client.watch_prefix(self._prefix, start_revision=snapshot.header.revision + 1)
                delay_s = 0.05
                async for event in watch:
                    if self._apply_event(event):
                        self._notify()
                if not self._closing:
                    raise CoordinatorError("watch stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closing:
                    return
                log.event(
                    "etcd_watch_failed",
                    logging.WARNING,
                    node=self.node_id,
                    endpoint=self.endpoint,
                    error=_first_line(exc),
                    retry_in_s=delay_s,
                )
                await asyncio.sleep(delay_s)
                delay_s = min(1.0, delay_s * 2)

    # ------------------------------------------------------------------ membership

    async def _register(self) -> None:
        """Grant our lease if we have none and (re)put the membership key on it."""
        client = await self._get_client()
        if self._lease_id is None:
            self.requests += 1
            lease = await client.lease(self._ttl_s)
            self._lease_id, self._granted_ttl_s = lease.id, lease.ttl
            if lease.ttl != self._ttl_s:
                log.event(
                    "etcd_lease_ttl_adjusted",
                    logging.WARNING,
                    node=self.node_id,
                    requested_ttl_s=self._ttl_s,
                    granted_ttl_s=lease.ttl,
                    note="etcd enforces a minimum TTL; local deadlines still use lease_ttl_s",
                )
        value = json.dumps(
            {"incarnation": str(self.incarnation), "host": socket.gethostname(), "pid": os.getpid()}
        ).encode()
        self.requests += 1
        put = await client.put(self._members_prefix + self.node_id.encode(), value, lease=self._lease_id)
        self._join_revision = put.header.revision

    async def _join(self) -> None:
        await self._register()
        if self._synced is None:
            self._synced = asyncio.Event()
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_loop())
        await asyncio.wait_for(self._synced.wait(), self._timeout_s * 2)

    def join(self) -> None:
        """Grant the lease, put the membership key, start the watch; check epochs once.

        Raises :class:`EpochRegressionError` if etcd's revision is not above the
        store's largest ``owner_epoch`` (see :meth:`check_epochs`).
        """
        self._call(self._join, what="join")
        if not self._epochs_checked:
            self.check_epochs()
            self._epochs_checked = True

    async def _current_revision(self) -> int:
        client = await self._get_client()
        self.requests += 1
        return (await client.get_prefix(self._members_prefix, keys_only=True)).header.revision

    def check_epochs(self) -> None:
        """Refuse (ERROR ``epoch_regression`` + :class:`EpochRegressionError`) if etcd's
        current revision is below an ``owner_epoch`` in the store (its next
        claims would not be above it).

        The store is read first, then etcd: an epoch written by a peer's claim
        in between came from a revision etcd has already passed, so racing
        joiners never refuse each other.
        """
        rows = self._tx(lambda conn: store.execute(conn, "partition_status", {"now": self._clock.store_now_or_none()}))
        if not rows:
            return
        top = max(rows, key=lambda row: row["owner_epoch"])
        revision = self._call(self._current_revision, what="revision")
        # Every epoch this etcd produced is ≤ its current revision, and every
        # later claim is above it: only a revision *below* a stored epoch is a
        # regression (an epoch equal to it was this etcd's own last claim).
        if revision < top["owner_epoch"]:
            self._log_regression(top["partition_id"], top["owner_epoch"], revision)
            raise EpochRegressionError(
                f"etcd revision {revision} is below the store's owner_epoch {top['owner_epoch']} "
                f"(partition {top['partition_id']}): claims would not fence the previous owners; raise the "
                f"etcd revision above {top['owner_epoch']} first: `scheduler etcd raise-revision` "
                f"({SWITCHING_COORDINATORS_DOC})"
            )

    def _log_regression(self, partition_id: int, stored_epoch: int | None, revision: int) -> None:
        """ERROR ``epoch_regression``: ``partition_id``'s stored epoch (None: unread) is not below ``revision``."""
        log.event(
            "epoch_regression",
            logging.ERROR,
            node=self.node_id,
            partition=partition_id,
            stored_epoch=stored_epoch,
            revision=revision,
            hint=EPOCH_REGRESSION_HINT,
        )

    def preflight(self) -> None:
        """Called by the node before it starts its loops: join and check epochs now.

        An :class:`EpochRegressionError` propagates (the node refuses to start);
        an unreachable etcd or store is only logged (the lease loop keeps trying).
        """
        try:
            self.join()
        except EpochRegressionError:
            raise
        except (CoordinatorError, psycopg.Error, SchedulerError, OSError) as exc:
            log.event(
                "coordinator_unavailable",
                logging.WARNING,
                node=self.node_id,
                endpoint=self.endpoint,
                error=_first_line(exc),
                note="the lease loop keeps trying",
            )

    def live_nodes(self) -> list[str]:
        if self._synced is None or not self._synced.is_set():
            raise CoordinatorError(f"etcd {self.endpoint}: membership not known yet (watch not synced)")
        with self._mirror_lock:
            return sorted(self._members)

    def leave(self) -> None:
        """Revoke the lease: the membership key and any remaining partition keys go at once."""
        if self._lease_id is None:
            return
        self._call(self._revoke, what="revoke")

    async def _revoke(self) -> None:
        client = await self._get_client()
        lease_id, self._lease_id = self._lease_id, None
        self._held.clear()
        self.requests += 1
        await client.revoke_lease(lease_id)

    # ------------------------------------------------------------------ renew

    def heartbeat(self) -> bool:
        """Nothing on its own: the keep-alive in :meth:`renew` is the heartbeat; returns False."""
        return False

    async def _keepalive(self) -> set[bytes] | None:
        """One keep-alive, then the keys on our lease; None if the lease is gone."""
        if self._lease_id is None:
            return None
        client = await self._get_client()
        self.requests += 1
        reply = await client.refresh_lease(self._lease_id)
        if reply is None or reply.TTL <= 0:
            return None
        self.requests += 1
        info = await client.get_lease_info(self._lease_id, keys=True)
        if info.TTL <= 0:
            return None
        return set(info.keys)

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        attached = self._call(self._keepalive, what="keep-alive")
        if attached is None:
            lost = len(self._held)
            had_lease = self._lease_id is not None
            self._lease_id = None
            self._held.clear()
            if had_lease:
                log.event(
                    "etcd_lease_expired",
                    logging.WARNING,
                    node=self.node_id,
                    partitions=lost,
                    note="every key on it is gone; joining again with a new lease",
                )
            self._call(self._register, what="re-register")
            return []
        mine = {pid for pid in map(self._pid, attached) if pid is not None}
        held = {lease.partition_id for lease in leases}
        for pid in [pid for pid in self._held if pid not in mine]:
            del self._held[pid]
        orphans = sorted(mine - held)
        if orphans:  # on our lease but not held by the loop (a claim whose store write failed)
            log.event(
                "etcd_orphan_keys",
                logging.WARNING,
                node=self.node_id,
                partitions=len(orphans),
                sample=orphans[:8],
                note="deleting keys this node holds but does not fire",
            )
            self._call(self._delete_keys, [(pid, None) for pid in orphans], what="delete orphans")
            for pid in orphans:
                self._held.pop(pid, None)
        return [
            (lease.partition_id, lease.epoch)
            for lease in leases
            if lease.partition_id in mine and self._held.get(lease.partition_id) == lease.epoch
        ]

    # ------------------------------------------------------------------ claim

    async def _claim_chunk(self, pids: list[int]) -> tuple[bool, int, dict[int, int]]:
        keys = [self._key(pid) for pid in pids]
        value = self.node_id.encode()
        response = await self._txn(
            [rpc.Compare(key=k, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0) for k in keys],
            [rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=value, lease=self._lease_id)) for k in keys],
            [rpc.RequestOp(request_range=rpc.RangeRequest(key=k)) for k in keys],
        )
        if response.succeeded:
            return True, response.header.revision, {}
        taken = {}
        for op in response.responses:
            for kv in op.response_range.kvs:
                pid = self._pid(kv.key)
                if pid is not None:
                    taken[pid] = kv.lease
        return False, response.header.revision, taken

    def _score(self, member: str) -> list[bytes]:
        scores = self._scores.get(member)
        if scores is None:
            scores = [hashlib.md5(f"{member}/{pid}".encode()).digest() for pid in range(PARTITION_COUNT)]
            if len(self._scores) > 1000:
                self._scores.clear()
            self._scores[member] = scores
        return scores

    def _candidates(self, taken: set[int], members: list[str]) -> list[int]:
        """Free partitions in claim order: first those this node wins by rendezvous
        hashing over the live members (disjoint between nodes that agree on the
        members, so racing claimers rarely collide), then the rest, each group in
        this node's own pseudo-random order."""
        mine = self._score(self.node_id)
        others = [self._score(m) for m in members if m != self.node_id]
        free = [pid for pid in range(PARTITION_COUNT) if pid not in taken and pid not in self._held]
        return sorted(free, key=lambda pid: (any(o[pid] > mine[pid] for o in others), mine[pid]))

    async def _list_partitions(self) -> set[int]:
        client = await self._get_client()
        self.requests += 1
        listed = await client.get_prefix(self._partitions_prefix, keys_only=True)
        return {pid for pid in (self._pid(kv.key) for kv in listed) if pid is not None}

    def claim(self, limit: int) -> list[tuple[int, int]]:
        if limit <= 0:
            return []
        if self._lease_id is None:
            self._call(self._register, what="register")
        with self._mirror_lock:
            taken = set(self._owners)
            members = sorted(self._members)
        candidates = self._candidates(taken, members)
        now = self._clock.monotonic()
        if not candidates and now - self._last_listed > self._settings.lease_ttl_s:
            # Under share and the mirror says nothing is free: check etcd itself now and
            # then (bounds the harm of a stalled watch; never written into the mirror).
            self._last_listed = now
            candidates = self._candidates(self._call(self._list_partitions, what="list"), members)
        claimed: list[tuple[int, int]] = []
        error: Exception | None = None
        txns = 0
        size = MAX_TXN_OPS
        while candidates and len(claimed) < limit and txns < CLAIM_TXNS_MAX:
            txns += 1
            chunk = candidates[: min(size, limit - len(claimed))]
            try:
                ok, revision, now_taken = self._call(self._claim_chunk, chunk, what="claim")
            except CoordinatorError as exc:
                error = exc
                break
            if not ok:  # lost a race for some keys: drop those, retry the rest in smaller chunks
                # (Not written into the mirror: the watch may already have applied a
                # later delete of the same key, and would never correct it.)
                lost = set(now_taken)
                with self._mirror_lock:  # the watch has probably seen more by now
                    lost |= set(self._owners)
                candidates = [pid for pid in candidates if pid not in lost]
                size = max(1, size // 4)
                continue
            size = min(MAX_TXN_OPS, size * 2)
            candidates = candidates[len(chunk) :]
            try:
                fenced = self._write_epochs(chunk, revision)
            except (psycopg.Error, SchedulerError) as exc:
                # Held in etcd but not fenced in the store: give the keys back.
                with contextlib.suppress(SchedulerError):
                    self._call(self._delete_keys, [(pid, revision) for pid in chunk], what="undo claim")
                error = exc
                break
            regressed = [pid for pid in chunk if pid not in fenced]
            if regressed:
                self._regressed(regressed, revision)
            for pid in chunk:
                if pid in fenced:
                    self._held[pid] = revision
                    claimed.append((pid, revision))
        if error is not None:
            if not claimed:
                raise error
            log.event(
                "claim_partial", logging.WARNING, node=self.node_id, claimed=len(claimed), error=_first_line(error)
            )
        return claimed

    def _write_epochs(self, pids: list[int], revision: int) -> set[int]:
        rows = self._tx(
            lambda conn: store.execute(
                conn,
                "claim_partitions_at_epoch",
                {
                    "node_id": self.node_id,
                    "epoch": revision,
                    "ttl_s": self._settings.lease_ttl_s,
                    "partition_ids": pids,
                    "now": self._clock.store_now_or_none(),
                },
            )
        )
        return {row["partition_id"] for row in rows}

    def _regressed(self, pids: list[int], revision: int) -> None:
        """Stored epoch ≥ our revision: say so loudly, never fire them, give the keys back."""
        try:
            rows = self._tx(
                lambda conn: store.execute(conn, "partition_status", {"now": self._clock.store_now_or_none()})
            )
            stored = {row["partition_id"]: row["owner_epoch"] for row in rows}
        except (psycopg.Error, SchedulerError):
            stored = {}
        for pid in pids:
            self._log_regression(pid, stored.get(pid), revision)
        with contextlib.suppress(SchedulerError):
            self._call(self._delete_keys, [(pid, revision) for pid in pids], what="drop regressed")

    # ------------------------------------------------------------------ release

    async def _delete_keys(self, items: list[tuple[int, int | None]]) -> list[int]:
        """Delete our keys: each only if it hangs on our lease and, unless the epoch
        given is None, its create_revision is that epoch (keyed on node and epoch:
        another node's key, or ours from another claim, is left alone). Return the
        partitions whose key was deleted."""

        def compare(pid: int, epoch: int | None) -> list:
            ours = rpc.Compare(
                key=self._key(pid), target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=self._lease_id or 0
            )
            if epoch is None:
                return [ours]
            return [
                ours,
                rpc.Compare(
                    key=self._key(pid), target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=epoch
                ),
            ]

        def delete(pid: int):
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self._key(pid)))

        deleted: list[int] = []
        step = MAX_TXN_OPS // 2  # up to two compares per key
        for start in range(0, len(items), step):
            chunk = items[start : start + step]
            response = await self._txn(
                [c for pid, epoch in chunk for c in compare(pid, epoch)], [delete(pid) for pid, _ in chunk], []
            )
            if response.succeeded:
                deleted += [pid for pid, _ in chunk]
                continue
            for pid, epoch in chunk:  # some key is not ours any more: one by one
                single = await self._txn(compare(pid, epoch), [delete(pid)], [])
                if single.succeeded:
                    deleted.append(pid)
        return deleted

    def release(self, leases: list[Lease]) -> list[int]:
        if not leases:
            return []
        self._tx(
            lambda conn: store.execute(
                conn,
                "release_leases",
                {
                    "node_id": self.node_id,
                    "partition_ids": [lease.partition_id for lease in leases],
                    "epochs": [lease.epoch for lease in leases],
                },
            )
        )
        deleted = self._call(self._delete_keys, [(lease.partition_id, lease.epoch) for lease in leases], what="release")
        for lease in leases:  # a stale epoch releases nothing: the lease held stays held
            if self._held.get(lease.partition_id) == lease.epoch:
                del self._held[lease.partition_id]
        return deleted

    # ------------------------------------------------------------------ close

    async def _shutdown(self) -> None:
        self._closing = True
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(BaseException):
                await self._watch_task
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None
        # Let grpc's own tasks see their calls end, so none is destroyed pending.
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        if pending:
            await asyncio.wait(pending, timeout=0.5)
        for task in pending:
            task.cancel()

    def close(self) -> None:
        """Stop the watch, close the etcd client and the event loop, then the store session."""
        if not self._closed:
            self._closing = True
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5.0)
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()
        super().close()
