"""Push: the partition owner delivers runs of HTTP targets (docs/delivery.md, "Push").

Two layers:

* :class:`Pusher` (async, no store access): one libcurl client
  (:class:`~scheduler.delivery.curl.CurlClient`) per event loop with a
  keep-alive connection pool, sends one attempt
  (:meth:`Pusher.push`) and classifies what came back (:class:`Outcome`);
* :class:`PushLoop` (a node thread, like the retention loop): its own store
  connection and its own asyncio loop; claims pending push runs of the
  partitions the node may fire that hold runs due (``due_push_partitions``,
  then :func:`~scheduler.delivery.lifecycle.claim_push` fenced by those
  partitions' epochs) whenever a quarter of its capacity is free, hands them
  to the pusher, and records the outcomes in batches (``ack`` / ``nack``) on
  a second connection, while the next claim runs on the first.

The request
-----------
``POST`` (or the job's method, ``PUT``) to the job's URL, body the job's
payload as compact JSON (``null`` when the job has none: the body is always
JSON), ``Content-Type: application/json``, and the headers:

``Idempotency-Key``
    the run id (``<job id>.<nominal time in Unix µs>``): the same for every
    attempt of the run, whichever node sends it; deduplicate on it.
``Scheduler-Job-Id``, ``Scheduler-Job-Name`` (if the job has one,
percent-encoded UTF-8 when not printable ASCII), ``Scheduler-Nominal-Time``,
``Scheduler-Scheduled-Time`` (RFC 3339, UTC), ``Scheduler-Attempt`` (1, 2, ...)
``Scheduler-Signature``
    ``t=<unix s>,v1=<hex>[,v1=...]`` (:mod:`scheduler.delivery.signing`), one
    ``v1`` per valid secret of the run's tenant
    (:mod:`scheduler.delivery.tenant_secrets`).

plus the job's own headers (ours win on a clash). Header values are never
logged. Redirects are never followed (a 3xx is a failure).

Outcomes
--------
``2xx`` → ack (``succeeded``). ``408``, ``429``, ``5xx``, a timeout (the
job's ``timeout_s``, default 10 s, covers connecting, sending and reading
the response) or a connection error → nack, retryable (``retry``), with a
``Retry-After`` (delta-seconds or HTTP-date, capped at
:data:`MAX_RETRY_AFTER_S`) as the earliest retry. Any other status (``3xx``,
other ``4xx``) or a refused address → nack, not retryable (``failed``): the
run is dead. The settle step decides the backoff (docs/delivery.md, "Retry
policy").

SSRF at connect
---------------
Every address the client is about to connect to, after DNS, is checked by
:meth:`scheduler.delivery.ssrf.AddressPolicy.allows` (setting
``push_allow``; :mod:`scheduler.delivery.curl`, libcurl's
``OPENSOCKETFUNCTION``): a refused address is skipped, and a name left with
no allowed address fails the attempt, not retryable, as ``ssrf refused``. A
URL whose host is an IP literal is checked the same way before the request.
So a name that resolved to a public address when the job was saved and to
``169.254.169.254`` now is never connected to.

Bounds
------
At most ``push_concurrency`` attempts in flight per node (the claim asks for
no more than the free capacity) and ``push_per_host`` per target host; the
connection pool has the same limits, so a request never waits for a
connection inside its own deadline. An attempt waiting for its host's turn
keeps its lease alive (heartbeats, once it has waited ~3 s) and starts only
with its whole deadline ahead of it; one a heartbeat finds canceled (overlap
``replace``) is dropped unsent. A run canceled after its last heartbeat is
still sent; the receiver's answer is then not recorded (the ack is refused).
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import functools
import ipaddress
import json
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import psycopg
import pycurl

from scheduler import __version__, log, store
from scheduler.clock import Clock, SystemClock
from scheduler.delivery import lifecycle, signing, tenant_secrets
from scheduler.delivery.curl import MAX_IDLE_S, AddressRefused, CurlClient, TransferError
from scheduler.delivery.lifecycle import Claimed, Nack
from scheduler.delivery.ssrf import AddressPolicy, split_url
from scheduler.errors import SchedulerError, ValidationError
from scheduler.metrics import Metrics
from scheduler.settings import Settings

DEFAULT_TIMEOUT_S = lifecycle.DEFAULT_PUSH_TIMEOUT_S
"""Per-attempt deadline of a job that names none (seconds)."""

MAX_RETRY_AFTER_S = 3600.0
"""A ``Retry-After`` longer than this (seconds) is cut to it."""

POLL_INTERVAL_S = 0.25
"""With free capacity and nothing found, the loop claims again after this long (seconds)."""

CLAIM_SHARE = 4
"""The loop claims once at least 1/CLAIM_SHARE of ``push_concurrency`` is free, and
records outcomes once that many are finished (or :data:`RECORD_DELAY_S` passed):
a transaction per batch, not per attempt."""

STORE_RETRY_S = 1.0
"""After a failed store call the loop makes none for this long (seconds): attempts in
flight go on, their outcomes wait."""

TARGETS_KEPT = 4096
"""A pusher keeps what it found out about this many target URLs (their host, whether an
attempt may be sent), then starts over: a node pushes to few endpoints, many times each."""

RECORD_DELAY_S = 0.05
"""A finished attempt's outcome is recorded at most this long after it finished (seconds),
unless the store is slow (then with the next batch)."""

SEND_AHEAD_S = 1.0
"""An attempt starts only if its lease outlasts its deadline by this much (seconds, local clock)."""

REFRESH_AHEAD_S = 2.0
"""A waiting attempt's lease is extended when it outlasts the deadline by less than this (seconds)."""

MAX_RESPONSE_READ = 64 * 1024
"""Bytes of a response body read (and discarded) so its connection can be reused; a longer
body closes the connection (the status counts)."""

DNS_CACHE_S = 10
"""Seconds a target name's DNS answer is reused (each address is still checked at connect)."""

OUTCOMES = ("succeeded", "retry", "failed")

USER_AGENT = f"trigger-engine/{__version__}"
"""The ``User-Agent`` of every pushed request."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished attempt: ``outcome`` one of :data:`OUTCOMES`; ``status`` the HTTP status
    (None without a response); ``error`` (None on success; never header values);
    ``retry_after_s`` the receiver's wish (seconds, ``retry`` only); ``latency_s`` send to outcome."""

    run: Claimed
    outcome: str
    status: int | None = None
    error: str | None = None
    retry_after_s: float | None = None
    latency_s: float = 0.0


def classify(status: int) -> str:
    """``succeeded`` for 2xx; ``retry`` for 408, 429 and 5xx; ``failed`` for anything else."""
    if 200 <= status <= 299:
        return "succeeded"
    if status in (408, 429) or 500 <= status <= 599:
        return "retry"
    return "failed"


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait, from 0 to :data:`MAX_RETRY_AFTER_S`.

    ``value`` is delta-seconds (``120``) or an HTTP-date (``Wed, 21 Oct 2026
    07:28:00 GMT``, counted from ``now_wall``, Unix seconds); None if absent
    or neither.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        seconds = float(int(text[:12]))
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now_wall
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@functools.lru_cache(maxsize=4096)
def rfc3339(instant: datetime) -> str:
    """``2026-01-01T00:00:00Z`` (UTC; ``.ffffff`` only when there are microseconds).

    Cached: runs pushed together share their nominal and scheduled instants
    (a herd, every job due on the same second), and equal instants in any
    zone give the same text."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def request_body(payload: Any) -> bytes:
    """The body of every attempt: the payload as compact JSON (``null`` without one), UTF-8."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _header_text(value: str) -> str:
    return value if value.isascii() and value.isprintable() else quote(value, safe="")


def request_headers(run: Claimed, body: bytes, secrets: Sequence[str], timestamp: int) -> list[tuple[str, str]]:
    """The headers of one attempt (module doc) as ``(name, value)`` pairs: the job's own,
    then ours; a job header named like one of ours (any case) is left out: ours win.

    ``secrets``: the tenant's valid signing secrets, newest first;
    ``timestamp``: the signing instant, Unix seconds.
    """
    ours = {
        "Content-Type": "application/json",
        "Idempotency-Key": run.run_id,
        "Scheduler-Job-Id": str(run.job_id),
        "Scheduler-Nominal-Time": rfc3339(run.nominal_time),
        "Scheduler-Scheduled-Time": rfc3339(run.scheduled_at),
        "Scheduler-Attempt": str(run.attempt),
        signing.HEADER: signing.sign(body, secrets, timestamp),
    }
    if run.job_name:
        ours["Scheduler-Job-Name"] = _header_text(run.job_name)
    if not run.headers:
        return list(ours.items())
    taken = {name.lower() for name in ours}
    own = [(str(name), str(value)) for name, value in run.headers.items() if str(name).lower() not in taken]
    return own + list(ours.items())


_UNSAFE_IN_HEADER = re.compile(r"[\r\n\0]")


def _header_safe(headers: dict[str, str] | None) -> bool:
    """No CR, LF or NUL in a job's header names or values: they are checked when saved, and a
    row written past that check must not split the request (ours never hold one)."""
    return not headers or not any(
        _UNSAFE_IN_HEADER.search(str(name)) or _UNSAFE_IN_HEADER.search(str(value)) for name, value in headers.items()
    )


def _first_line(exc: BaseException) -> str:
    text = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Pusher:
    """Sends push attempts through one keep-alive libcurl client (create it inside the running loop).

    ``policy`` is the SSRF allowlist, checked at connect; ``concurrency`` and
    ``per_host`` bound the connection pool (the caller bounds attempts:
    :class:`PushLoop` claims no more than ``concurrency``); at most
    ``per_host`` attempts per host run at once (:meth:`push` waits for a
    turn). ``resolve`` pins host names to addresses (``{"name": ["10.0.0.1"]}``,
    tests); the policy still decides each address; ``max_idle_s``: a
    connection idle longer is not reused (:data:`scheduler.delivery.curl.MAX_IDLE_S`).
    Use as ``async with``.
    """

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        concurrency: int,
        per_host: int,
        clock: Clock | None = None,
        resolve: Mapping[str, Sequence[str]] | None = None,
        max_idle_s: int = MAX_IDLE_S,
    ) -> None:
        self._policy = policy
        self._per_host = per_host
        self._clock = clock or SystemClock()
        self._hosts: dict[str, tuple[asyncio.Semaphore, int]] = {}
        self._targets: dict[str, tuple[str, str | None]] = {}
        # One client sends every tenant's attempts; it keeps no cookies, so a cookie one
        # endpoint sets is never handed to the next request for that host.
        self._client = CurlClient(
            max_total=concurrency,
            max_per_host=per_host,
            allow=policy.allows,
            user_agent=USER_AGENT,
            max_body=MAX_RESPONSE_READ,
            resolve=resolve,
            dns_cache_s=DNS_CACHE_S,
            max_idle_s=max_idle_s,
        )

    async def __aenter__(self) -> Pusher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the client and its connections."""
        await self._client.close()

    async def _acquire(self, host: str) -> asyncio.Semaphore:
        """Wait for one of ``host``'s ``per_host`` turns (in arrival order); :meth:`_release` it.

        A host's semaphore lives while some attempt uses or awaits it."""
        sem, users = self._hosts.get(host) or (asyncio.Semaphore(self._per_host), 0)
        self._hosts[host] = (sem, users + 1)
        try:
            await sem.acquire()
        except BaseException:
            self._leave(host)
            raise
        return sem

    def _release(self, host: str, sem: asyncio.Semaphore) -> None:
        sem.release()
        self._leave(host)

    def _leave(self, host: str) -> None:
        sem, users = self._hosts[host]
        if users == 1:
            del self._hosts[host]
        else:
            self._hosts[host] = (sem, users - 1)

    def _target(self, url: str) -> tuple[str, str | None]:
        """``(host, refusal)`` of a target URL: the error of an attempt that must not be sent
        (a malformed URL, an IP literal the policy refuses), else None. Kept per URL (the
        policy never changes in a client's life; at most :data:`TARGETS_KEPT` URLs)."""
        known = self._targets.get(url)
        if known is not None:
            return known
        try:
            _, host, _ = split_url(url)
        except ValidationError as exc:  # the rule only: a URL may carry a token in its query
            known = ("", f"invalid target url: {exc.rule}")
        else:
            refused = _is_ip(host) and not self._policy.allows(host)
            known = (
                host,
                f"ssrf refused: {host} is an address push targets may not reach (push_allow)" if refused else None,
            )
        if len(self._targets) >= TARGETS_KEPT:
            self._targets.clear()
        self._targets[url] = known
        return known

    async def push(
        self,
        run: Claimed,
        secrets: Sequence[str],
        before_send: Callable[[], Awaitable[bool]] | None = None,
    ) -> Outcome | None:
        """Send one attempt of ``run`` signed with ``secrets``; return its :class:`Outcome`.

        Waits for a turn of the run's host first; then ``before_send()``
        (if given) may return False to drop the attempt unsent (None is
        returned). Never raises for what the target does (statuses,
        timeouts, connection errors, refused addresses are outcomes);
        raises ValueError if ``secrets`` is empty.
        """
        host, refusal = self._target(run.url or "")
        if refusal is not None:
            return Outcome(run, "failed", error=refusal)
        body = request_body(run.payload)
        timeout_s = run.timeout_s or DEFAULT_TIMEOUT_S
        sem = await self._acquire(host)
        try:
            if before_send is not None and not await before_send():
                return None
            headers = request_headers(run, body, secrets, int(self._clock.wall()))
            if not _header_safe(run.headers):
                return Outcome(run, "failed", error="invalid header: CR, LF or NUL in a name or value")
            started = time.monotonic()
            try:
                response = await self._client.request(run.method or "POST", run.url or "", body, headers, timeout_s)
            except AddressRefused:
                return Outcome(
                    run,
                    "failed",
                    error=f"ssrf refused: {host} resolves to no address push targets may reach (push_allow)",
                    latency_s=time.monotonic() - started,
                )
            except TransferError as exc:
                elapsed = time.monotonic() - started
                if exc.timed_out:
                    return Outcome(run, "retry", error=f"timeout after {timeout_s:g}s", latency_s=elapsed)
                if exc.code == pycurl.E_URL_MALFORMAT:
                    return Outcome(run, "failed", error="invalid target url", latency_s=elapsed)
                return Outcome(run, "retry", error=f"connection error: {exc.message}", latency_s=elapsed)
        finally:
            self._release(host, sem)
        elapsed = time.monotonic() - started
        status = response.status
        outcome = classify(status)
        if outcome == "succeeded":
            return Outcome(run, outcome, status, latency_s=elapsed)
        wait = parse_retry_after(response.retry_after, self._clock.wall()) if outcome == "retry" else None
        reason = f" {response.reason}" if response.reason else ""
        return Outcome(run, outcome, status, f"HTTP {status}{reason}", wait, elapsed)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(eq=False)
class _InFlight:
    """A claimed run inside the loop: its lease's local deadline and whether it was sent."""

    run: Claimed
    secrets: list[str]
    lease_s: float
    deadline_mono: float
    started: bool = False
    dropped: bool = False
    refreshed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def timeout_s(self) -> float:
        return self.run.timeout_s or DEFAULT_TIMEOUT_S


class PushLoop:
    """A node's push thread (module doc): claim, push, record, on its own connection and asyncio loop.

    ``firable()`` returns the partitions the node may act for now
    (``{partition: epoch}``, :meth:`~scheduler.coordination.table.LeaseTable.firable`).
    Lifecycle (CONTRIBUTING.md rule 6): :meth:`run` until ``stop`` is set,
    then it sends nothing new, lets attempts in flight finish for at most
    half of ``stop_timeout_s`` (then abandons them as retryable failures),
    records every outcome and returns; :meth:`close` frees the connection.
    Store failures are counted and logged, never raised: outcomes not yet
    recorded are recorded on a later try (ack and nack are idempotent per token).
    ``resolve`` pins target host names to addresses (tests; :class:`Pusher`).
    """

    def __init__(
        self,
        settings: Settings,
        firable: Callable[[], dict[int, int]],
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        *,
        resolve: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._s = settings
        self._firable = firable
        self._clock = clock or SystemClock()
        self._metrics = metrics or Metrics()
        self._policy = settings.push_policy
        self._resolve = resolve
        self._session = store.StoreSession(settings, self._metrics, self._clock, role="push")
        # Outcomes are recorded on a connection of their own, while the next claim runs on the
        # first: one loop cycle waited for both in turn (4 round trips), which held a node to
        # ~2,000 pushes/s with its thread half idle.
        self._record_session = store.StoreSession(settings, self._metrics, self._clock, role="push-record")
        self._recording: asyncio.Task[None] | None = None
        self._inflight: set[_InFlight] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outcomes: list[Outcome] = []
        self._oldest_outcome = 0.0
        self._store_down_until = 0.0
        self._wake: asyncio.Event | None = None
        self._counted: dict[str, tuple[Any, Any]] = {}

    # ------------------------------------------------------------ thread

    def run(self, stop: threading.Event) -> None:
        """Push until ``stop`` is set (see the class doc); a crash is logged and the loop restarted."""
        while not stop.is_set():
            try:
                asyncio.run(self._main(stop))
            except Exception as exc:  # a bug must not end pushing silently: log it loudly, go on
                log.event("push_crashed", logging.ERROR, exc_info=True, node=self._s.node_id, error=_first_line(exc))
                self.close()
                self._clock.wait(stop, 1.0)

    def run_once(self) -> list[Outcome]:
        """One claim (up to ``push_concurrency`` runs), every attempt to its end, the outcomes
        recorded; returns them in the order they finished (tests drive the loop with this).
        A store failure is logged, and its outcomes are left unrecorded."""
        return asyncio.run(self._once())

    def close(self) -> None:
        """Close the store connections."""
        self._session.close()
        self._record_session.close()

    def _pusher(self) -> Pusher:
        return Pusher(
            self._policy,
            concurrency=self._s.push_concurrency,
            per_host=self._s.push_per_host,
            clock=self._clock,
            resolve=self._resolve,
        )

    def _reset(self) -> None:
        self._wake = asyncio.Event()
        self._recording = None
        self._inflight.clear()
        self._tasks.clear()

    async def _once(self) -> list[Outcome]:
        self._reset()
        self._outcomes = []
        async with self._pusher() as pusher:
            await self._claim(pusher, min(self._s.push_concurrency, lifecycle.MAX_BATCH))
            while self._tasks:
                assert self._wake is not None
                self._wake.clear()
                await self._refresh_waiting()
                try:
                    await asyncio.wait_for(self._wake.wait(), POLL_INTERVAL_S)
                except TimeoutError:
                    pass
        done = list(self._outcomes)
        await self._record()
        return done

    # ------------------------------------------------------------ loop

    async def _store(self, call: Callable[[psycopg.Connection], Any], session: store.StoreSession | None = None) -> Any:
        """``call(conn)`` on a worker thread (the event loop keeps pushing), on ``session``
        (default: the claims' one); store errors → None, logged, that session closed, and no
        store call for :data:`STORE_RETRY_S` after one."""
        session = session or self._session

        def body() -> Any:
            return call(session.connection())

        if time.monotonic() < self._store_down_until:
            return None
        try:
            return await asyncio.to_thread(body)
        except (psycopg.Error, SchedulerError, OSError) as exc:
            self._store_error(exc)
            session.close()
            self._store_down_until = time.monotonic() + STORE_RETRY_S
            return None

    def _store_error(self, exc: BaseException) -> None:
        """Count and log a failed store call (``push_store_failed``)."""
        self._metrics.error(getattr(exc, "sqlstate", None))
        log.event("push_store_failed", logging.WARNING, node=self._s.node_id, error=_first_line(exc))

    async def _main(self, stop: threading.Event) -> None:
        self._reset()
        batch = max(1, self._s.push_concurrency // CLAIM_SHARE)
        next_claim = 0.0
        more = False
        stop_deadline: float | None = None
        async with self._pusher() as pusher:
            while True:
                assert self._wake is not None
                self._wake.clear()
                stopping = stop.is_set()
                if (
                    self._outcomes
                    and (self._recording is None or self._recording.done())
                    and (
                        stopping
                        or len(self._outcomes) >= batch
                        or time.monotonic() - self._oldest_outcome >= RECORD_DELAY_S
                    )
                ):
                    self._recording = asyncio.create_task(self._record_in_background())
                if stopping:
                    if stop_deadline is None:
                        stop_deadline = time.monotonic() + self._s.stop_timeout_s / 2
                        self._drop_unsent()
                    if not self._tasks:
                        if self._recording is not None:
                            await self._recording
                        if self._outcomes:
                            await self._record()
                        return
                    if time.monotonic() >= stop_deadline:
                        for task in list(self._tasks):
                            task.cancel()
                        await asyncio.gather(*self._tasks, return_exceptions=True)
                        continue
                else:
                    await self._refresh_waiting()
                    free = self._s.push_concurrency - len(self._inflight)
                    if free >= batch and (more or time.monotonic() >= next_claim):
                        more = await self._claim(pusher, min(free, lifecycle.MAX_BATCH))
                        next_claim = time.monotonic() + POLL_INTERVAL_S
                free = self._s.push_concurrency - len(self._inflight)
                if more and free >= batch and not stop.is_set():
                    await asyncio.sleep(0)
                    continue
                wait = RECORD_DELAY_S if self._outcomes else POLL_INTERVAL_S
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except TimeoutError:
                    pass

    async def _claim(self, pusher: Pusher, limit: int) -> bool:
        """Claim up to ``limit`` runs and start their attempts; True if the claim came back full.

        First reads which partitions hold the runs due (``due_push_partitions``,
        an index read), then claims fenced by those partitions only (the
        claim locks its partitions rows): an idle loop locks nothing.
        """
        held = self._firable()
        if not held:
            return False
        now = self._clock.store_now_or_none()
        params = {"pids": sorted(held), "now": now, "limit": limit}
        due = await self._store(lambda c: store.execute(c, "due_push_partitions", params))
        epochs = {row["partition_id"]: held[row["partition_id"]] for row in due or ()}
        if not epochs:
            return False
        sent = time.monotonic()

        def claim_and_secrets(c: psycopg.Connection) -> tuple[list[lifecycle.Claimed], dict[str, list[str]] | None]:
            # One hop to the store thread for both: the secrets are read right after the claim
            # commits (a failed read leaves the runs claimed: they retry, never go unsigned).
            runs = lifecycle.claim_push(c, node_id=self._s.node_id, epochs=epochs, limit=limit, now=now)
            if not runs:
                return runs, None
            try:
                return runs, tenant_secrets.signing_secrets(c, {r.tenant for r in runs}, now)
            except (psycopg.Error, SchedulerError, OSError) as exc:
                self._store_error(exc)
                return runs, None

        answer = await self._store(claim_and_secrets)
        if not answer or not answer[0]:
            return False
        claimed, secrets = answer
        for run in claimed:
            lease_s = (run.timeout_s or DEFAULT_TIMEOUT_S) + lifecycle.PUSH_LEASE_MARGIN_S
            item = _InFlight(run, (secrets or {}).get(run.tenant, []), lease_s, sent + lease_s)
            self._inflight.add(item)
            task = asyncio.create_task(self._attempt(pusher, item))
            self._tasks.add(task)
        return len(claimed) >= limit

    async def _attempt(self, pusher: Pusher, item: _InFlight) -> None:
        """One run's attempt; its outcome joins the next batch recorded."""
        outcome: Outcome | None
        try:
            if not item.secrets:  # the secrets read failed: retry later rather than send unsigned
                outcome = Outcome(item.run, "retry", error="signing secrets unavailable")
            else:
                outcome = await pusher.push(item.run, item.secrets, lambda: self._ready(item))
        except asyncio.CancelledError:  # the stop deadline passed (never for a run already given up)
            outcome = None if item.dropped else Outcome(item.run, "retry", error="node stopping during the attempt")
        except Exception as exc:  # noqa: BLE001 - a bug in one attempt must not strand the run leased
            log.event("push_attempt_crashed", logging.ERROR, exc_info=True, run_id=item.run.run_id)
            outcome = Outcome(item.run, "retry", error=f"push error: {_first_line(exc)}")
        finally:
            self._inflight.discard(item)
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]
        if outcome is not None:
            self._add(outcome)
            counted = self._counted.get(outcome.outcome)
            if counted is None:  # a child of each metric per outcome, looked up once (labels() locks)
                counted = self._counted[outcome.outcome] = (
                    self._metrics.push_attempts.labels(outcome=outcome.outcome),
                    self._metrics.push_latency.labels(outcome=outcome.outcome),
                )
            counted[0].inc()
            counted[1].observe(outcome.latency_s)
        if self._wake is not None:
            self._wake.set()

    def _add(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for the next batch recorded."""
        if not self._outcomes:
            self._oldest_outcome = time.monotonic()
        self._outcomes.append(outcome)

    async def _ready(self, item: _InFlight) -> bool:
        """Called when the run's host has a turn: True once its lease covers the whole deadline."""
        while not item.dropped and item.deadline_mono - time.monotonic() < item.timeout_s + SEND_AHEAD_S:
            item.refreshed.clear()
            if self._wake is not None:
                self._wake.set()
            await item.refreshed.wait()
        if item.dropped:
            return False
        item.started = True
        return True

    async def _refresh_waiting(self) -> None:
        """Extend the leases of runs still waiting for their host's turn, when they run short."""
        now_mono = time.monotonic()
        due = [
            i
            for i in self._inflight
            if not i.started and not i.dropped and i.deadline_mono - now_mono < i.timeout_s + REFRESH_AHEAD_S
        ]
        by_lease: dict[float, list[_InFlight]] = {}
        for item in due:
            by_lease.setdefault(item.lease_s, []).append(item)
        now = self._clock.store_now_or_none()
        for lease_s, items in by_lease.items():
            for chunk in _chunks(items, lifecycle.MAX_BATCH):
                sent = time.monotonic()
                pairs = [(i.run.key, i.run.token) for i in chunk]
                answers = await self._store(lambda c, p=pairs, s=lease_s: lifecycle.heartbeat(c, p, s, now=now))
                if answers is None:
                    continue
                for item in chunk:
                    if answers.get(item.run.run_id) == "leased":
                        item.deadline_mono = sent + lease_s
                    else:  # canceled (overlap replace, operator) or lost: never send it
                        item.dropped = True
                    item.refreshed.set()

    def _drop_unsent(self) -> None:
        """At stop: attempts still waiting for a turn give up (recorded as retryable failures)."""
        for item in self._inflight:
            if not item.started and not item.dropped:
                item.dropped = True
                item.refreshed.set()
                self._add(Outcome(item.run, "retry", error="node stopping before the attempt was sent"))

    async def _record_in_background(self) -> None:
        """:meth:`_record` as the loop's one recording task; wakes the loop when done (more
        outcomes may be waiting for it)."""
        try:
            await self._record()
        finally:
            if self._wake is not None:
                self._wake.set()

    async def _record(self) -> None:
        """Record the finished attempts (acks, then nacks, in batches) on the recording
        connection; keep them on a store failure."""
        if not self._outcomes:
            return
        batch, self._outcomes = self._outcomes, []
        now = self._clock.store_now_or_none()
        acks = [o for o in batch if o.outcome == "succeeded"]
        fails = [o for o in batch if o.outcome != "succeeded"]
        for chunk in _chunks(acks, lifecycle.MAX_BATCH):
            pairs = [(o.run.key, o.run.token) for o in chunk]
            answers = await self._store(lambda c, p=pairs: lifecycle.ack(c, p, now=now), self._record_session)
            self._after_record(chunk, answers)
        for chunk in _chunks(fails, lifecycle.MAX_BATCH):
            nacks = [Nack(o.run.run_id, o.run.token, o.error, o.outcome == "retry", o.retry_after_s) for o in chunk]
            answers = await self._store(lambda c, n=nacks: lifecycle.nack(c, n, now=now), self._record_session)
            self._after_record(chunk, answers)

    def _after_record(self, chunk: list[Outcome], answers: dict[str, str] | None) -> None:
        if answers is None:  # store failure: try again with a later batch
            for outcome in chunk:
                self._add(outcome)
            return
        for outcome in chunk:
            answer = answers.get(outcome.run.run_id)
            if outcome.outcome in ("failed", "retry"):
                # A failure that may be retried is DEBUG (one per attempt: a receiver down can
                # fail thousands a second); the run going dead is the settle step's run_dead.
                log.event(
                    "push_failed" if outcome.outcome == "failed" else "push_retry",
                    logging.WARNING if outcome.outcome == "failed" else logging.DEBUG,
                    node=self._s.node_id,
                    run_id=outcome.run.run_id,
                    attempt=outcome.run.attempt,
                    error=outcome.error,
                )
            if answer not in ("succeeded", "failed"):
                log.event(
                    "push_outcome_refused",
                    logging.INFO,
                    node=self._s.node_id,
                    run_id=outcome.run.run_id,
                    outcome=outcome.outcome,
                    answer=answer,
                )


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
