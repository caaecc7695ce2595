"""The delivery side of ``bench deliver``: pull workers and the push receiver, as child processes.

Pull workers come in two implementations (``impl``, :func:`worker_plan`),
``workers`` processes each serving *every* tenant (the herd's 51 tenants
with 4 workers: 4 processes):

* ``scheduler`` (the default): the engine's own ``scheduler worker``
  processes (:mod:`scheduler.delivery.worker`, one ``--tenant`` per tenant:
  it claims them in turn) with the async no-op handler :func:`noop`
  (returning acks), ``--concurrency`` and ``--batch`` :data:`BATCH`;
* ``bench``: the bench's own loop below, the store's share of delivery
  without the worker's machinery (handler tasks, heartbeats, batching
  delays), to tell the two apart. Below, the processes this module runs itself:

* **Bench worker** (``python -m bench.consumers worker``): a loop over
  :func:`scheduler.delivery.lifecycle.claim` and
  :func:`~scheduler.delivery.lifecycle.ack` in batches, for the runs of a
  queue of *several* tenants. Each pass claims up to ``--batch`` runs of each
  tenant in turn (starting at a tenant that differs per worker, so workers do
  not all probe the same tenant first) and acks each claimed batch in one
  statement: a no-op handler. A pass that claimed nothing sleeps
  :data:`POLL_MIN_S` doubling to :data:`POLL_MAX_S`; one that claimed
  anything starts the next at once. SIGTERM/SIGINT stop it after the current
  batch is acked. Nothing it counts is used by the bench: the report reads
  the store (a worker that crashed cannot hide a loss).
* **Receiver** (``python -m bench.consumers receiver``): a server on
  127.0.0.1 (a free port; ``--impl`` :data:`RECEIVERS`: a minimal HTTP/1.1
  server by default, or aiohttp's) answering every request ``204`` after recording its
  ``Idempotency-Key`` header and arrival time (epoch seconds); it writes
  ``RECORDS.ready`` holding its port once listening, its request count to
  ``RECORDS.count`` every 0.25 s, and on SIGTERM/SIGINT the records to
  ``RECORDS`` (TSV: key, arrival) before it exits.

:class:`WorkerProcess` and :class:`ReceiverProcess` start them from the
bench (output to a log file; stopped with :func:`bench.process.stop_child`).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import click

from bench.process import stop_child

PUSH_CONCURRENCY = 256
"""The nodes' (push mode) ``push_concurrency`` (the engine's default is 64)."""

PUSH_PER_HOST = 64
"""The nodes' (push mode) ``push_per_host`` (the engine's default is 8). The receiver is one host:
with 8 attempts at once, 3,000 runs/s needs every attempt done in 2.7 ms, the event loop's
turns included; an operator pushing thousands a second to one endpoint raises it likewise."""

POLL_MIN_S = 0.02
"""A bench worker's first sleep after a pass that claimed nothing (seconds)."""
POLL_MAX_S = 0.5
"""A bench worker's longest sleep between passes over empty queues (seconds)."""
BATCH = 1000
"""Runs a worker claims (and acks) per statement by default (the engine's largest batch)."""
IMPLS = ("scheduler", "bench")


async def noop(run) -> None:
    """The ``scheduler worker`` handler of the bench: returns at once, so the run is acked."""


def check_impl(impl: str) -> str:
    """``impl`` if it is one of :data:`IMPLS`; raises ValueError otherwise."""
    if impl not in IMPLS:
        raise ValueError(f"worker impl {impl!r}: choose from {', '.join(IMPLS)}")
    return impl


def worker_plan(tenants: list[str], workers: int, impl: str, big: str = "big") -> list[tuple[str, list[str]]]:
    """The worker processes to start, as ``(worker id, tenants it serves)``, in start order
    (see the module doc; ``impl`` already resolved). ``[]`` for ``workers`` 0."""
    if workers <= 0:
        return []
    prefix = "bench-worker" if impl == "bench" else "worker"
    return [(f"{prefix}-{i}", list(tenants)) for i in range(workers)]


# ---------------------------------------------------------------- bench worker


def work(dsn: str, worker_id: str, tenants: list[str], queue: str, batch: int, stop: threading.Event) -> int:
    """Claim and ack the runs of ``queue`` of ``tenants`` until ``stop`` is set (see the module
    doc); return how many acks the store accepted. Raises what the store raises."""
    from scheduler import store
    from scheduler.delivery import lifecycle

    conn = store.connect(dsn, application_name=f"bench-worker-{worker_id}"[:63])
    start = sum(worker_id.encode()) % len(tenants)
    order = tenants[start:] + tenants[:start]
    acked = 0
    idle = POLL_MIN_S
    try:
        while not stop.is_set():
            got = 0
            for tenant in order:
                claimed = lifecycle.claim(conn, tenant=tenant, queue=queue, worker=worker_id, limit=batch)
                if claimed:
                    answers = lifecycle.ack(conn, [(c.run_id, c.token) for c in claimed])
                    acked += sum(1 for a in answers.values() if a == "succeeded")
                    got += len(claimed)
            if got:
                idle = POLL_MIN_S
            else:
                stop.wait(idle)
                idle = min(idle * 2, POLL_MAX_S)
    finally:
        conn.close()
    return acked


# ---------------------------------------------------------------- receiver


RECEIVERS = ("raw", "aiohttp")
"""Receiver implementations (``--receiver``): ``raw``, the default, a minimal HTTP/1.1 server
on :class:`asyncio.Protocol` (:class:`RawReceiver`); ``aiohttp``, aiohttp's web server (what
the bench used until 2026-12-04: ~160 µs of CPU per request on this machine, a quarter of a
push run's CPU, against ~70 µs for ``raw``; docs/performance.md, "2026-12-04")."""

_RESPONSE_204 = b"HTTP/1.1 204 No Content\r\n\r\n"
_RESPONSE_501 = b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_RESPONSE_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class RawReceiver(asyncio.Protocol):
    """One connection of the ``raw`` receiver: HTTP/1.1 requests with a ``Content-Length`` body
    (or none), kept alive and answered ``204`` in order, each recorded in ``seen`` as
    ``(Idempotency-Key or "", arrival in epoch seconds)`` once it has fully arrived.

    Just what the engine's pushes need (libcurl always sends ``Content-Length``, never
    chunked, never ``Expect``): a ``Transfer-Encoding`` body is answered ``501`` and a
    request without a valid head ``400``, each closing the connection; ``Connection: close``
    closes it after the answer. Not a general server: it exists so the receiver's own CPU
    stays small beside the node's on a shared machine.
    """

    def __init__(self, seen: list[tuple[str, float]]) -> None:
        self.seen = seen
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buffer = self.buffer + data if self.buffer else data
        answers = []
        close = False
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end].lower()
            length = _header(head, b"content-length")
            if _header(head, b"transfer-encoding") is not None:
                answers.append(_RESPONSE_501)
                close = True
                break
            if length is not None and not length.strip().isdigit():
                answers.append(_RESPONSE_400)
                close = True
                break
            total = end + 4 + (int(length) if length is not None else 0)
            if len(buffer) < total:
                break
            key = _header(buffer[:end], b"idempotency-key", head)
            self.seen.append((key.strip().decode("latin-1") if key is not None else "", time.time()))
            buffer = buffer[total:]
            answers.append(_RESPONSE_204)
            connection = _header(head, b"connection")
            if connection is not None and connection.strip() == b"close":
                close = True
                break
        self.buffer = b"" if close else buffer
        if answers:
            self.transport.write(b"".join(answers))
        if close:
            self.transport.close()


def _header(head: bytes, name: bytes, lowered: bytes | None = None) -> bytes | None:
    """The value of header ``name`` (lower case) in the request ``head`` (no final CRLFCRLF), or
    None. ``lowered``: ``head`` in lower case when ``head`` is not (the value is then cut
    from ``head``, keeping its case)."""
    at = (lowered if lowered is not None else head).find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    stop = head.find(b"\r\n", start)
    return head[start:] if stop < 0 else head[start:stop]


async def receive(records: Path, port: int, impl: str = "raw") -> None:
    """Serve on 127.0.0.1:``port`` (0: any free port) with the ``impl`` receiver (one of
    :data:`RECEIVERS`) until SIGTERM/SIGINT (see the module doc)."""
    seen: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    cleanup: Callable[[], Awaitable[None]]
    if impl == "raw":
        server = await loop.create_server(lambda: RawReceiver(seen), "127.0.0.1", port, backlog=1024)
        bound = server.sockets[0].getsockname()[1]

        async def cleanup() -> None:
            server.close()

    else:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            seen.append((request.headers.get("Idempotency-Key", ""), time.time()))
            await request.read()
            return web.Response(status=204)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
        await site.start()
        bound = runner.addresses[0][1]
        cleanup = runner.cleanup
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    records.with_suffix(".ready").write_text(f"{bound}\n")
    count_path = records.with_suffix(".count")
    while not stop.is_set():
        count_path.with_suffix(".tmp").write_text(f"{len(seen)}\n")
        count_path.with_suffix(".tmp").replace(count_path)
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass
    tmp = records.with_suffix(".tsv.tmp")
    with open(tmp, "w") as out:
        for key, arrived in seen:
            out.write(f"{key}\t{arrived:.6f}\n")
    tmp.replace(records)
    await cleanup()


# ---------------------------------------------------------------- parent side


class WorkerProcess:
    """A worker child process, output to ``log_dir/ID.log``: ``impl`` ``bench``, ``python -m
    bench.consumers worker`` over ``tenants``; ``scheduler``, ``python -m scheduler worker``
    over ``tenants`` with the handler :func:`noop` (JSON logs; the store from
    ``SCHEDULER_DSN`` in its environment). With ``api`` (``(url, key)``; impl
    ``scheduler``, one tenant: the key's): ``scheduler worker --api-url`` with the
    key in ``SCHEDULER_API_KEY`` and no DSN in its environment at all."""

    def __init__(
        self,
        dsn: str,
        worker_id: str,
        tenants: list[str],
        log_dir: Path,
        *,
        queue: str,
        batch: int,
        impl: str,
        api: tuple[str, str] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self._log = open(log_dir / f"{worker_id}.log", "ab")
        env = {**os.environ, "SCHEDULER_DSN": dsn, "SCHEDULER_LOG_FORMAT": "json"}
        if impl == "bench":
            args = ["bench.consumers", "worker", "--worker-id", worker_id, "--queue", queue, "--batch", str(batch)]
            args += tenants
        else:
            args = ["scheduler", "worker", "--queue", queue, "--handler", "bench.consumers:noop"]
            if api is None:
                args += [arg for tenant in tenants for arg in ("--tenant", tenant)]
            else:
                del env["SCHEDULER_DSN"]
                env.update(SCHEDULER_API_URL=api[0], SCHEDULER_API_KEY=api[1])
            args += ["--concurrency", str(batch), "--batch", str(batch), "--worker-id", worker_id]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; return the exit status."""
        return stop_child(self.proc, self._log, timeout_s)


CONNECTIONS = {"scheduler": 3, "bench": 1}
"""Store connections one worker process of each implementation holds (the
engine's worker: one each to claim, heartbeat and ack)."""


def start_workers(
    dsn: str, tenants: list[str], workers: int, log_dir: Path, *, impl: str, queue: str = "default", batch: int = BATCH
) -> list[WorkerProcess]:
    """Start the :func:`worker_plan` of ``impl`` (one of :data:`IMPLS`) for ``tenants``' ``queue``.

    Raises RuntimeError, starting none, if the server has fewer free
    connections than the plan's processes need (:data:`CONNECTIONS` each).
    """
    plan = worker_plan(tenants, workers, check_impl(impl))
    if plan:
        from bench import queries
        from scheduler import store

        with store.connect(dsn, application_name="bench-workers") as conn:
            free = queries.execute(conn, "free_connections")[0]["free"]
        need = len(plan) * CONNECTIONS[impl]
        if need > free:
            raise RuntimeError(
                f"{len(plan)} {impl} worker processes need about {need} store connections and the server has "
                f"{free} free: raise PostgreSQL's max_connections, or use fewer workers or the bench's workers"
            )
    return [
        WorkerProcess(dsn, worker_id, served, log_dir, queue=queue, batch=batch, impl=impl)
        for worker_id, served in plan
    ]


def start_api_workers(
    dsn: str,
    api_url: str,
    keys: dict[str, str],
    workers: int,
    log_dir: Path,
    *,
    queue: str = "default",
    batch: int = BATCH,
) -> list[WorkerProcess]:
    """Start ``workers`` ``scheduler worker --api-url`` processes; ``keys`` is tenant → a worker
    key's token. An HTTP worker serves its key's tenant only: worker ``i`` serves the
    ``i % len(keys)``-th tenant, so ``workers`` must be at least ``len(keys)`` (ValueError)."""
    tenants = sorted(keys)
    if workers < len(tenants):
        raise ValueError(
            f"--workers {workers}: over the API each worker serves one tenant (its key's); give >= {len(tenants)}"
        )
    return [
        WorkerProcess(
            dsn,
            f"api-worker-{i}",
            [tenants[i % len(tenants)]],
            log_dir,
            queue=queue,
            batch=batch,
            impl="scheduler",
            api=(api_url, keys[tenants[i % len(tenants)]]),
        )
        for i in range(workers)
    ]


class ReceiverProcess:
    """The receiver child process (``python -m bench.consumers receiver``); :meth:`wait_ready`
    gives its port, :meth:`stop` its records."""

    def __init__(self, records: Path, log_path: Path, impl: str = "raw") -> None:
        self.records = records
        self.log_path = log_path
        for path in (records, records.with_suffix(".ready"), records.with_suffix(".count")):
            path.unlink(missing_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.consumers", "receiver", "--records", str(records), "--impl", impl],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> int:
        """The port it listens on, once it does. Raises RuntimeError if it exits, TimeoutError."""
        ready = self.records.with_suffix(".ready")
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"receiver exited ({self.proc.returncode}); see {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for the receiver to listen")
            time.sleep(0.05)
        return int(ready.read_text())

    def count(self) -> int:
        """Requests received so far (as of its last 0.25 s report)."""
        try:
            return int(self.records.with_suffix(".count").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def stop(self, timeout_s: float = 30.0) -> list[tuple[str, float]]:
        """SIGTERM, wait (SIGKILL after ``timeout_s``); return its ``(key, arrival)`` records in
        arrival order. Raises RuntimeError if it wrote none."""
        stop_child(self.proc, self._log, timeout_s)
        if not self.records.exists():
            raise RuntimeError(f"the receiver wrote no records; see {self.log_path}")
        out = []
        for line in self.records.read_text().splitlines():
            key, arrived = line.split("\t")
            out.append((key, float(arrived)))
        return out


def receiver_duplicates(records: list[tuple[str, float]]) -> int:
    """Requests beyond the first per ``Idempotency-Key`` (0 when every key came once)."""
    return sum(n - 1 for n in collections.Counter(key for key, _ in records).values())


# ---------------------------------------------------------------- CLI (child processes)


@click.group()
def cli() -> None:
    """The delivery side of ``python -m bench deliver`` (one child process each)."""


@cli.command("worker")
@click.option("--dsn", envvar="SCHEDULER_DSN", required=True)
@click.option("--worker-id", required=True)
@click.option("--queue", default="default", show_default=True)
@click.option("--batch", type=click.IntRange(1, 1000), default=BATCH, show_default=True)
@click.argument("tenants", nargs=-1, required=True)
def worker_cmd(dsn: str, worker_id: str, queue: str, batch: int, tenants: tuple[str, ...]) -> None:
    """Claim and ack the runs of QUEUE of TENANTS until SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    start = time.monotonic()
    acked = work(dsn, worker_id, list(tenants), queue, batch, stop)
    click.echo(f"{worker_id}: acked {acked} runs in {time.monotonic() - start:.1f}s")


@cli.command("receiver")
@click.option("--records", type=click.Path(path_type=Path), required=True)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True)
@click.option("--impl", type=click.Choice(RECEIVERS), default="raw", show_default=True)
def receiver_cmd(records: Path, port: int, impl: str) -> None:
    """Answer every request 204 on 127.0.0.1:PORT, recording Idempotency-Key, until SIGTERM."""
    asyncio.run(receive(records, port, impl))


if __name__ == "__main__":
    cli()
