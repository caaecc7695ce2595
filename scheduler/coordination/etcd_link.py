"""The etcd coordinator's connection: a private event loop, the client, bounded calls.

The coordinator's interface is synchronous (called from the lease loop
thread); :class:`EtcdLink` runs an asyncio event loop on a daemon thread and
every call submits a coroutine with
``asyncio.run_coroutine_threadsafe(...).result(timeout)``. etcd failures
become :class:`~scheduler.errors.CoordinatorError`; a connection failure
moves to the next endpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable

import psycopg

from scheduler.coordination.etcd_keys import first_line
from scheduler.errors import CoordinatorError, SchedulerError

try:  # the optional 'etcd' extra
    import aetcd
    from aetcd import rpc
except ImportError:  # pragma: no cover - exercised only without the extra
    aetcd = None
    rpc = None


class EtcdLink:
    """One etcd client over ``endpoints`` (``[(host, port)]``, tried in turn), on a private event loop.

    ``timeout_s`` bounds each etcd request (a synchronous call waits at most
    ``4 * timeout_s + 1`` seconds). ``requests`` counts the etcd requests
    sent (watch events not counted); whoever sends one adds to it.
    """

    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float, thread_name: str) -> None:
        self._endpoints = endpoints
        self._endpoint_index = 0
        self._timeout_s = timeout_s
        self._client: aetcd.Client | None = None
        self.closed = False
        self.requests = 0
        """etcd requests sent through this link (watch events not counted)."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=thread_name[:40], daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """``host:port`` of the endpoint in use (or tried next)."""
        host, port = self._endpoints[self._endpoint_index % len(self._endpoints)]
        return f"{host}:{port}"

    async def client(self):
        """The connected client (connecting to the current endpoint if needed)."""
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
            raise CoordinatorError(f"etcd {endpoint}: {first_line(exc)}") from exc

    def call(self, fn, *args, what: str):
        """Run ``fn(*args)`` on the link's event loop; wait (bounded) for its result.

        Raises :class:`CoordinatorError` (``what`` names the call on a time-out)
        for etcd failures and once the link is closed; store and engine errors
        raised by ``fn`` pass through.
        """
        if self.closed:
            raise CoordinatorError("etcd coordinator is closed")
        future = asyncio.run_coroutine_threadsafe(self._guarded(fn, *args), self.loop)
        try:
            return future.result(self._timeout_s * 4 + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CoordinatorError(f"etcd {self.endpoint}: {what} timed out") from None

    async def txn(self, compare, success, failure):
        """One etcd transaction (``rpc`` compare and request lists); its response."""
        client = await self.client()
        self.requests += 1
        return await client.kvstub.Txn(
            rpc.TxnRequest(compare=compare, success=success, failure=failure),
            timeout=self._timeout_s,
            metadata=client.metadata,
        )

    async def _shutdown(self, first: Callable[[], Awaitable[None]]) -> None:
        await first()
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

    def close(self, first: Callable[[], Awaitable[None]]) -> None:
        """Run ``first()`` on the loop (the watch stops), close the client, stop the loop; idempotent."""
        if not self.closed:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(first), self.loop).result(5.0)
            self.closed = True
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self.loop.close()
