"""Client-side bounds on store calls: the node's watchdog (docs/design.md §2).

Server-side timeouts (``statement_timeout``, ``lock_timeout``) end a slow
statement only if the store can still answer. A connection that goes silent
(a hung pooler or proxy, a store host that vanished behind the same
address, a primary frozen with SIGSTOP) leaves the calling thread blocked in
the driver for as long as TCP keeps the socket open: ~15 min of
retransmissions, ~2 h of keepalive, forever when a middlebox still
acknowledges the bytes. Keepalives and ``tcp_user_timeout`` (set on every
node session by :func:`scheduler.store.node_connect`) cure the first two;
the bound that always holds lives here, in the node.

Every node session is a :class:`WatchedConnection`: each blocking driver
call (psycopg's ``Connection.wait``, through which every query, commit,
pipeline sync and result fetch passes) registers with the :class:`Watchdog`
for as long as it runs, and reports *progress* each time the store's socket
has bytes to read (:meth:`Watchdog.progress`). A call is judged on how long
the store has been silent while it owed an answer: since the call began, or
since the store last sent something, or, on a connection in pipeline mode
whose earlier calls left results owed (chunks sent, not yet answered), since
the store last sent something in those calls (the watchdog keeps that
instant per connection between calls; a call that finds an answer already
waiting in the socket or in libpq's buffer starts afresh). One statement is
bounded this way as before (the store sends nothing until it answers), and
so is a wait on many chunks of a pipeline, each bounded by its own silence:
the write pipeline asks the store to flush each chunk's results as it
commits (:meth:`scheduler.store.Pipeline.send`), and PostgreSQL applies
``statement_timeout`` per statement of a pipeline, so a lane collecting ten
healthy chunks of 0.6 s is never cancelled, while a lane whose store went
silent is cancelled after the same bound as a single statement, counted
from the silence, not from when the tick stopped queuing chunks on it and
began to wait. A thread of the watchdog checks the calls every
:data:`CHECK_INTERVAL_S`; a call silent past its :class:`CallBounds`
escalates, in order:

1. ``cancel_after_s`` (statement timeout + margin): a cancel request is sent
   on a new connection (libpq's non-blocking cancel, on a short-lived thread,
   abandoned after :data:`CANCEL_TIMEOUT_S`: a frozen store host accepts the
   connection and never answers), logged as ``store_call_cancelled``. A store that is alive ends the
   statement and the call returns an error.
2. ``break_after_s`` (statement timeout + 2 × margin): the connection's
   socket is shut down from the watchdog's thread (``shutdown(2)`` on the
   socket, never ``PQfinish``, which only the owning thread may call), logged
   as ``store_call_broken``. The blocked thread then reads end-of-file, gets
   an ``OperationalError``, closes the session and its loop reconnects
   through a new connection.
3. ``exit_after_s``: the call is still blocked after its socket was shut
   down. ``on_stuck(call)`` is called (the node logs ``store_call_stuck`` and
   exits with status 1, so an orchestrator restarts it).

The socket is shut down under the lock that the owning thread takes to
deregister the call, so the descriptor cannot have been closed (and its
number reused) meanwhile.

Time the whole process was suspended (SIGSTOP, a VM pause) does not count:
when one of the watchdog's own checks comes more than
:data:`PAUSE_SLACK_S` late, every call's start is moved forward by the gap,
so a node resumed after a freeze is judged on what its store does next.

A COMMIT waiting on synchronous replication (a standby that stopped
acknowledging) is such a call: PostgreSQL disarms ``statement_timeout``
before that wait, so only the cancel of step 1 ends it. The store then
answers with a WARNING (``canceling wait for synchronous replication``) and
the COMMIT succeeds: the transaction is committed on the primary, not yet
on the standby. The call returns as a success (a fired tick is committed and
is not fired again); :class:`WatchedConnection` recognises the warning and
the watchdog logs ``store_commit_wait_cancelled`` with the reason and the
bound (:meth:`Watchdog.commit_wait_cancelled`).

The watchdog also tells the node's liveness check (``/healthz``) which
threads are inside a store call silent since when, and when each thread
last completed one (:meth:`Watchdog.thread_state`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any

import psycopg
from psycopg.waiting import Ready

from scheduler import log

READY_R = int(Ready.R)
"""The bit psycopg's wait functions send an I/O generator when the socket has bytes to read."""

CHECK_INTERVAL_S = 0.1
"""How often the watchdog's thread looks at the calls in flight."""

SYNC_REP_CANCELLED = "canceling wait for synchronous replication"
"""The start of PostgreSQL's WARNING when a cancel request ends a COMMIT's wait on
synchronous replication (the transaction is committed locally)."""

PAUSE_SLACK_S = 1.0
"""A check this much later than :data:`CHECK_INTERVAL_S` means the process was
suspended: the gap is not counted against the calls in flight."""


@dataclasses.dataclass(frozen=True)
class CallBounds:
    """When a store call in flight is cancelled, broken, reported stuck (seconds since it started).

    Raises ``ValueError`` unless ``0 < cancel_after_s <= break_after_s <= exit_after_s``.
    """

    cancel_after_s: float
    break_after_s: float
    exit_after_s: float

    def __post_init__(self) -> None:
        if not 0 < self.cancel_after_s <= self.break_after_s <= self.exit_after_s:
            raise ValueError(f"call bounds must satisfy 0 < cancel <= break <= exit (got {self})")

    @classmethod
    def after_statement_timeout(cls, statement_timeout_s: float, margin_s: float) -> CallBounds:
        """Cancel at timeout + margin, break at timeout + 2 × margin, report stuck
        ``max(2 s, 2 × margin)`` after the break."""
        return cls(
            statement_timeout_s + margin_s,
            statement_timeout_s + 2 * margin_s,
            statement_timeout_s + 2 * margin_s + max(2.0, 2 * margin_s),
        )


@dataclasses.dataclass
class Call:
    """One blocking store call in flight (see :meth:`Watchdog.begin`).

    ``started`` is when it began, ``heard`` when the store last sent it
    something (set by :meth:`Watchdog.begin`, moved by
    :meth:`Watchdog.progress` while no step was taken): its bounds count from
    ``heard``. Both are the watchdog's clock, in seconds.
    """

    token: int
    conn: Any
    fd: int
    thread: int
    label: str
    started: float
    bounds: CallBounds
    heard: float
    stage: int = 0
    """0 running, 1 cancel sent, 2 socket shut down, 3 reported stuck."""


CANCEL_TIMEOUT_S = 5.0
"""A cancel request still unanswered after this is abandoned (the break follows anyway)."""


def send_cancel(cancel_conn: Any, timeout_s: float = CANCEL_TIMEOUT_S) -> None:
    """Send a cancel request through ``cancel_conn`` (libpq's ``PGcancelConn``), bounded by ``timeout_s``.

    Non-blocking libpq calls (``PQcancelStart``, ``PQcancelPoll``) and a
    ``select`` on the request's socket: the wait never holds the GIL, and a
    store host that accepts the connection but never answers (frozen:
    its kernel still completes the handshake) costs at most ``timeout_s``.
    Always finishes ``cancel_conn``. Raises ``psycopg.OperationalError`` if
    the request failed, ``TimeoutError`` if it was not answered in time.
    """
    deadline = time.monotonic() + timeout_s
    try:
        cancel_conn.start()
        while True:
            status = cancel_conn.poll()
            if status == psycopg.pq.PollingStatus.OK:
                return
            if status == psycopg.pq.PollingStatus.FAILED:
                raise psycopg.OperationalError(f"cancellation failed: {cancel_conn.get_error_message()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer to the cancel request within {timeout_s}s")
            fd = cancel_conn.socket
            if status == psycopg.pq.PollingStatus.READING:
                select.select([fd], [], [], remaining)
            else:
                select.select([], [fd], [], remaining)
    finally:
        cancel_conn.finish()


def _cancel_async(conn: Any) -> None:
    """Send a cancel request for ``conn``'s running statement.

    What the request needs is copied from the connection here (libpq's
    ``PQcancelCreate``, or ``PQgetCancel`` before libpq 17; on the
    watchdog's thread while the call is registered, so the connection is
    still open); the request itself (a new connection to the store, which
    may never be answered) runs on a short-lived daemon thread that never
    touches ``conn``: :func:`send_cancel`, bounded and without the GIL.
    Before libpq 17 it is the blocking ``PQcancel``, which psycopg's C
    implementation calls holding the GIL: a frozen store host then freezes
    the whole process until it answers.
    """
    try:
        if psycopg.capabilities.has_cancel_safe():
            cancel_conn = conn.pgconn.cancel_conn()

            def request() -> None:
                send_cancel(cancel_conn)

        else:  # pragma: no cover (libpq < 17)
            request = conn.pgconn.get_cancel().cancel
    except (psycopg.Error, AttributeError) as exc:
        log.event("store_cancel_failed", logging.DEBUG, error=(str(exc).splitlines() or [type(exc).__name__])[0])
        return

    def send() -> None:
        try:
            request()
        except Exception as exc:  # noqa: BLE001 (best effort: the break follows anyway)
            log.event("store_cancel_failed", logging.DEBUG, error=(str(exc).splitlines() or [type(exc).__name__])[0])

    threading.Thread(target=send, name="store-cancel", daemon=True).start()


def shutdown_socket(fd: int) -> None:
    """Shut down (both directions) the socket behind descriptor ``fd`` without closing ``fd``.

    The owner of ``fd`` sees end-of-file / a reset on its next read or wait
    and fails with a connection error; ``fd`` stays valid until it closes
    it. Raises ``OSError`` if ``fd`` is not a socket.
    """
    dup = os.dup(fd)
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        raise
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()


class Watchdog:
    """Bounds every registered store call in flight (see the module doc).

    ``clock`` is a monotonic clock in seconds (tests inject a manual one and
    call :meth:`check`); ``cancel(conn)`` and ``shutdown(fd)`` default to a
    cancel request on its own thread and :func:`shutdown_socket`;
    ``on_stuck(call)`` is called once per call still blocked past its
    ``exit_after_s`` (default: only the ``store_call_stuck`` log line).
    Thread-safe.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        check_interval_s: float = CHECK_INTERVAL_S,
        cancel: Callable[[Any], None] = _cancel_async,
        shutdown: Callable[[int], None] = shutdown_socket,
        on_stuck: Callable[[Call], None] | None = None,
    ) -> None:
        self.clock = clock
        self.check_interval_s = check_interval_s
        self.on_stuck = on_stuck
        self._cancel = cancel
        self._shutdown = shutdown
        self._calls: dict[int, Call] = {}
        self._owed: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        """Per connection whose last call left results owed: when the store last sent it something."""
        self._last_done: dict[int, float] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._last_check: float | None = None
        self._thread: threading.Thread | None = None
        self.commit_waits_cancelled = 0
        """COMMITs whose wait on synchronous replication a cancel ended (:meth:`commit_wait_cancelled`)."""

    # ---------------------------------------------------------------- calls

    def begin(self, conn: Any, bounds: CallBounds, label: str = "", *, owed: bool = True) -> int:
        """Register a blocking call on ``conn`` (a psycopg connection) by the current thread; return its token.

        Its silence counts from its start, or, if ``conn``'s last call ended
        with results owed (:meth:`end`) and ``owed`` is true (the caller
        found no answer waiting), from when the store last sent ``conn``
        something.
        """
        try:
            fd = conn.pgconn.socket
        except (psycopg.Error, AttributeError):
            fd = -1
        with self._lock:
            token = next(self._tokens)
            now = self.clock()
            since = self._owed.get(conn, now) if owed else now
            self._calls[token] = Call(token, conn, fd, threading.get_ident(), label, now, bounds, min(since, now))
        return token

    def progress(self, token: int) -> None:
        """The store sent the call ``token`` something: its bounds count from now.

        Ignored once a step was taken for it (a cancel sent: its answer is
        not progress) and for a call no longer in flight.
        """
        with self._lock:
            call = self._calls.get(token)
            if call is not None and call.stage == 0:
                call.heard = self.clock()

    def end(self, token: int, *, owed: bool = False) -> None:
        """Deregister the call ``token`` (it returned or raised).

        ``owed``: its connection still waits for results it sent for (a
        pipeline's chunks): the next call on it counts its silence from when
        the store last sent it something (:meth:`begin`), not from its own start.
        """
        with self._lock:
            call = self._calls.pop(token, None)
            if call is not None:
                self._last_done[call.thread] = self.clock()
                if owed:
                    self._owed[call.conn] = call.heard
                else:
                    self._owed.pop(call.conn, None)

    def cancelled(self, token: int | None) -> bool:
        """True if the call ``token`` is in flight and a cancel request was sent for it."""
        with self._lock:
            call = self._calls.get(token) if token is not None else None
            return call is not None and call.stage >= 1

    def commit_wait_cancelled(self, label: str, bounds: CallBounds) -> None:
        """Report a COMMIT whose wait on synchronous replication a cancel ended (see the module doc).

        Logs ``store_commit_wait_cancelled`` (WARNING) with the session
        ``label``, the bound it ran past (``bound_s``: ``bounds.cancel_after_s``,
        the statement timeout + margin) and the reason, and counts it in
        :attr:`commit_waits_cancelled`.
        """
        with self._lock:
            self.commit_waits_cancelled += 1
        log.event(
            "store_commit_wait_cancelled",
            logging.WARNING,
            session=label,
            bound_s=round(bounds.cancel_after_s, 3),
            reason=(
                "a COMMIT waited on synchronous replication past the watchdog's bound (statement_timeout_s + "
                "store_call_margin_s) and was cancelled: it is committed locally on the primary, "
                "but a standby may not have it yet"
            ),
        )

    def thread_state(self, thread: int) -> tuple[float | None, float | None]:
        """``(silent_since, last_call_done)`` of thread id ``thread`` (this watchdog's clock; None: never).

        ``silent_since``: the oldest ``heard`` of the thread's calls in
        flight (when the store last sent one of them something, or it began).
        """
        with self._lock:
            since = [call.heard for call in self._calls.values() if call.thread == thread]
            return (min(since) if since else None), self._last_done.get(thread)

    def in_flight(self) -> list[Call]:
        """A snapshot of the calls in flight, oldest first."""
        with self._lock:
            return sorted((dataclasses.replace(call) for call in self._calls.values()), key=lambda c: c.started)

    # ---------------------------------------------------------------- checks

    def check(self) -> None:
        """One look at the calls in flight: cancel, break or report those silent past their bounds.

        The logged ``seconds`` is how long the store has been silent in the
        call (what the bounds compare), ``call_s`` how long the call has run.
        """
        now = self.clock()
        stuck: list[Call] = []
        with self._lock:
            if self._last_check is not None:
                gap = now - self._last_check - self.check_interval_s
                if gap > PAUSE_SLACK_S:  # the process was suspended: not the store's fault
                    for call in self._calls.values():
                        call.started += gap
                        call.heard += gap
                    for conn, since in list(self._owed.items()):
                        self._owed[conn] = since + gap
            self._last_check = now
            for call in self._calls.values():
                age = now - call.heard
                if call.stage == 0 and age >= call.bounds.cancel_after_s:
                    call.stage = 1
                    _log_step("store_call_cancelled", logging.WARNING, call, now)
                    self._cancel(call.conn)
                if call.stage == 1 and age >= call.bounds.break_after_s:
                    call.stage = 2
                    _log_step("store_call_broken", logging.WARNING, call, now)
                    if call.fd >= 0:
                        try:  # under the lock: the owner cannot have closed the descriptor
                            self._shutdown(call.fd)
                        except OSError as exc:
                            log.event(
                                "store_break_failed",
                                logging.WARNING,
                                session=call.label,
                                error=exc.strerror or str(exc),
                            )
                if call.stage == 2 and age >= call.bounds.exit_after_s:
                    call.stage = 3
                    stuck.append(dataclasses.replace(call))
        for call in stuck:
            _log_step("store_call_stuck", logging.ERROR, call, now)
            if self.on_stuck is not None:
                self.on_stuck(call)

    def run(self, stop: threading.Event) -> None:
        """Check every ``check_interval_s`` until ``stop`` is set."""
        while not stop.wait(self.check_interval_s):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 (the watchdog must outlive a bug)
                log.event("watchdog_failed", logging.ERROR, exc_info=True, error=f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        """Run :meth:`run` on a daemon thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self.run, args=(threading.Event(),), name="store-watchdog", daemon=True
            )
        self._thread.start()


def _log_step(event: str, level: int, call: Call, now: float) -> None:
    """Log one escalation of ``call``: its session, ``seconds`` of silence (what the
    bounds compare) and ``call_s``, how long the call has run (at ``now``)."""
    log.event(
        event,
        level,
        session=call.label,
        seconds=round(now - call.heard, 3),
        call_s=round(now - call.started, 3),
    )


_shared: Watchdog | None = None
_shared_lock = threading.Lock()


def shared() -> Watchdog:
    """The process's watchdog (started on first use); every node session registers with it."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Watchdog()
            _shared.start()
        return _shared


class WatchedConnection(psycopg.Connection):
    """A psycopg connection whose blocking calls register with a :class:`Watchdog`.

    ``watch`` is ``(watchdog, bounds, label)``, set by :meth:`watch_with`
    (called by :func:`scheduler.store.connect`); ``None`` makes it a plain
    connection. The store's notices are read for the WARNING of a COMMIT
    whose wait on synchronous replication a cancel ended (:meth:`on_notice`).
    """

    watch: tuple[Watchdog, CallBounds, str] | None = None
    _call: int | None = None
    """The token of the call in flight (None between calls)."""

    def watch_with(self, watchdog: Watchdog, bounds: CallBounds, label: str) -> None:
        """Bound every blocking call of this connection by ``bounds`` (``label`` names it in the log)."""
        if self.watch is None:
            ref = weakref.ref(self)  # no cycle through the connection's own handler list

            def notice(diag: psycopg.errors.Diagnostic) -> None:
                conn = ref()
                if conn is not None:
                    conn.on_notice(diag)

            self.add_notice_handler(notice)
        self.watch = (watchdog, bounds, label)

    def on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A notice from the store: report a COMMIT whose wait on synchronous replication was cancelled.

        Recognised by PostgreSQL's message (:data:`SYNC_REP_CANCELLED`), or,
        whatever the server's ``lc_messages``, as a plain WARNING (SQLSTATE
        01000) on a call the watchdog has sent a cancel for.
        """
        watch = self.watch
        if watch is None:
            return
        watchdog, bounds, label = watch
        if (diag.message_primary or "").startswith(SYNC_REP_CANCELLED) or (
            diag.severity_nonlocalized == "WARNING" and diag.sqlstate == "01000" and watchdog.cancelled(self._call)
        ):
            watchdog.commit_wait_cancelled(label, bounds)

    def wait(self, gen, *args: Any, **kwargs: Any):  # type: ignore[override]
        watch = self.watch
        if watch is None:
            return super().wait(gen, *args, **kwargs)
        watchdog, bounds, label = watch
        token = self._call = watchdog.begin(self, bounds, label, owed=not self._answer_waiting())
        try:
            return super().wait(reporting_reads(gen, lambda: watchdog.progress(token)), *args, **kwargs)
        finally:
            self._call = None
            watchdog.end(token, owed=self._results_owed())

    def _results_owed(self) -> bool:
        """In pipeline mode with results not fetched yet (psycopg's queue of results to fetch)."""
        pipeline = self._pipeline
        return pipeline is not None and bool(pipeline.result_queue)

    def _answer_waiting(self) -> bool:
        """Whether the store's answer is already here: in libpq's buffer (a result is
        available without reading) or in the socket (readable). The store was not
        silent, however late this call comes to read it."""
        try:
            if not self.pgconn.is_busy():
                return True
            return bool(select.select([self.pgconn.socket], [], [], 0)[0])
        except (psycopg.Error, OSError, ValueError):
            return True


def reporting_reads(gen: Generator[Any, Any, Any], on_read: Callable[[], None]) -> Generator[Any, Any, Any]:
    """Drive psycopg's I/O generator ``gen`` unchanged, calling ``on_read()`` each time
    the socket is ready to read (the store sent something); return what ``gen`` returns.

    psycopg's wait functions send ``gen`` a readiness bit set (``Ready.R`` = 1,
    ``Ready.W`` = 2, 0 when an interval passed with neither) after each wait
    on the socket; only reads count (a socket is writable while the peer is
    frozen, until its buffers fill).
    """
    try:
        state = next(gen)
        while True:
            ready = yield state
            if ready & READY_R:
                on_read()
            state = gen.send(ready)
    except StopIteration as stop:
        return stop.value
