"""The composition root of a scheduler node (CONTRIBUTING.md rule 6).

A node is two loops on two threads, each with its own store connection:

* the lease loop (:class:`scheduler.coordination.loop.LeaseLoop`): heartbeat + renewal
  every ``renew_interval_s``, membership poll + claim/release every
  ``poll_interval_s``;
* the firing loop (:class:`scheduler.firing.Firer`): one fenced firing
  transaction per ``tick_interval_s``.

They share only the :class:`~scheduler.coordination.table.LeaseTable`. Optional
pieces complete a production node:

* the tenant HTTP API (:mod:`scheduler.api`, ``api_port`` set): uvicorn on
  its own thread with its own store pool (docs/api.md), stopped first at
  shutdown;
* the HTTP endpoint (:mod:`scheduler.health`, ``metrics_port`` set):
  ``/metrics``, ``/healthz`` (loops make progress, :meth:`Node.liveness`)
  and ``/readyz`` (store answers + heartbeat fresh + loops alive + not
  stopping);
* the delivery loop (:class:`scheduler.delivery.loop.SettleLoop`): the
  partition owner's settle step (expired leases, failed attempts → retry
  or dead; docs/delivery.md) every ``SETTLE_INTERVAL_S``, fenced by the
  epochs of the partitions it holds, on its own thread and connection;
* the retention loop (:class:`scheduler.retention.RetentionLoop`,
  ``retention_s`` set): one bounded DELETE batch at most every
  ``retention_batch_interval_s`` over the partitions this node holds, on a
  third thread with its own connection, so it never stalls firing;
* the push loop (:class:`scheduler.delivery.push.PushLoop`): delivers the
  runs of HTTP targets of the partitions this node may fire, on its own
  thread, connection and asyncio loop (docs/delivery.md, "Push"); at stop
  it sends nothing new and records its outcomes before the leases go.

Two daemon threads, not joined at stop, prepare zones (see
:meth:`Node._prepare_zones`) and read the delivery gauges every 10 s
(:class:`scheduler.delivery.views.DeliveryGauges`).

Graceful stop (SIGTERM/SIGINT, docs/design.md §6): ``/readyz`` turns 503, the
firing loop finishes its tick and exits, then the lease loop releases every
lease and deletes the heartbeat, so peers claim the partitions on their next
poll (lateness ≤ ~2 s); the endpoint closes last. Whatever the threads are
doing, the process ends within ``stop_timeout_s`` of the signal: if the
graceful stop has not finished by then, it logs ``stop_deadline_passed``
and exits with status 1 (its leases then expire after the TTL).

A store that goes silent: every store session is bounded by the watchdog
(:mod:`scheduler.watchdog`; keepalives and ``tcp_user_timeout`` too), which
cancels and then breaks a call stuck past its bounds so the loop reconnects
through a new connection; a call still blocked after that makes the node
exit with status 1 (``store_call_stuck``). ``/healthz`` (:meth:`Node.liveness`)
fails while a loop is stalled.

Start-up check (:meth:`Node.start`): the store must be usable. A fatal
misconfiguration (schema missing or behind the code's migrations,
authentication refused, database absent) raises
:class:`~scheduler.errors.StoreSetupError` before anything starts (the CLI
exits 2 with the fix, e.g. ``run `scheduler db upgrade` first``), a DSN
libpq would misparse or cannot parse a :class:`~scheduler.errors.ConfigError`
(:func:`scheduler.store.check_dsn`); a store
that cannot be reached yet (refused, timed out) is retried every second
while the node runs, and a fatal finding then stops it the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from scheduler import log, runtime, store, watchdog
from scheduler.clock import Clock, SystemClock
from scheduler.coordination import Coordinator, LeaseLoop, LeaseTable, make_coordinator
from scheduler.delivery import owner
from scheduler.delivery.loop import SettleLoop
from scheduler.delivery.push import PushLoop
from scheduler.delivery.views import DeliveryGauges
from scheduler.errors import ConfigError, StoreSetupError
from scheduler.firing import Firer
from scheduler.health import HealthServer, StoreProbe
from scheduler.metrics import Metrics
from scheduler.retention import RetentionLoop
from scheduler.settings import Settings
from scheduler.store import redact_dsn

STORE_CHECK_INTERVAL_S = 1.0
"""While the start-up store check could not reach the store, it is retried this often."""

ZONE_WARM_INTERVAL_S = 10.0
"""How often a node looks for zones of newly registered schedules to warm
(:func:`scheduler.zones.warm`): one read of the ``schedules`` rows registered
since its last look (``schedule_zones``)."""

ZONE_WARM_LOOKBACK = timedelta(minutes=10)
"""How far before its last look a node reads registrations again: a schedule
row's ``created_at`` is its transaction's start, which may commit later (a
long import batch)."""

EXIT_STOP_DEADLINE = 1
"""Exit status when the graceful stop outlives ``stop_timeout_s`` or a store call stays stuck."""

LOOPS = ("lease", "firing")
"""The loops ``/healthz`` watches (retention is best effort and not watched)."""


class Node:
    """One scheduler node process.

    ``coordinator`` defaults to the one ``settings.coordinator`` names
    (:class:`~scheduler.coordination.sql.SqlCoordinator` or the etcd one); ``clock`` to the
    system clock; ``watchdog`` to the process's (:func:`scheduler.watchdog.shared`,
    whose clock also times the loops' progress for :meth:`liveness`).
    :meth:`start` launches the loops, :meth:`stop` asks them to end,
    :meth:`join` waits and then leaves the cluster.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        coordinator: Coordinator | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        watchdog: watchdog.Watchdog | None = None,
    ) -> None:
        self.settings = settings.validated()
        self.clock = clock or SystemClock()
        self.watchdog = watchdog if watchdog is not None else _shared_watchdog()
        self.metrics = metrics or Metrics()
        self.table = LeaseTable(self.clock, self.settings.safety_margin_s)
        self.coordinator = coordinator or make_coordinator(self.settings, self.metrics, self.clock)
        self.firer = Firer(self.settings, self.table, self.clock, self.metrics)
        self.lease_loop = LeaseLoop(
            self.settings, self.coordinator, self.table, self.clock, self.metrics, on_claimed=self.firer.wake
        )
        self.retention = (
            RetentionLoop(self.settings, lambda: self.table.held().keys(), self.clock, self.metrics)
            if self.settings.retention_s is not None
            else None
        )
        self.delivery = SettleLoop(self.settings, self.table, self.clock, self.metrics, steps=[owner.release_buffered])
        self.push = PushLoop(self.settings, self.table.firable, self.clock, self.metrics)
        self.probe = StoreProbe(
            self.settings.dsn, application_name=f"scheduler-probe:{self.node_id}"[:63], settings=self.settings
        )
        self.health = (
            HealthServer(
                self.settings.metrics_host, self.settings.metrics_port, self.metrics, self.readiness, self.liveness
            )
            if self.settings.metrics_port is not None
            else None
        )
        self.api: Any = None
        """The HTTP API's :class:`scheduler.api.server.ApiThread` once started (``api_port`` set)."""
        # Progress of the watched loops (watchdog clock): thread id and last completed iteration.
        self._loop_threads: dict[str, int] = {}
        self._loop_beats: dict[str, float] = {}
        self.lease_loop.run_once = self._beating("lease", self.lease_loop.run_once)
        self.firer.tick = self._beating("firing", self.firer.tick)
        self._store_pending: str | None = None
        self.setup_error: StoreSetupError | None = None
        """Set when the store check found a fatal misconfiguration after start (the node then stops)."""
        self.metrics.heartbeat_age.set_function(self._heartbeat_age)
        self._stop_firing = threading.Event()
        self._stop_leases = threading.Event()
        self._stop_retention = threading.Event()
        self._stop_delivery = threading.Event()
        self._stop_zones = threading.Event()
        self._stop_push = threading.Event()
        self._threads: list[threading.Thread] = []
        self.delivery_gauges = DeliveryGauges(
            lambda: store.node_connect(self.settings, f"scheduler-gauges:{self.node_id}", watchdog=self.watchdog),
            self.metrics,
            self.node_id,
        )

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def _heartbeat_age(self) -> float:
        """Seconds since the lease loop's last successful heartbeat (monotonic); -1 before one."""
        last = self.lease_loop.last_heartbeat_mono
        return self.clock.monotonic() - last if last else -1.0

    def _beating(self, loop: str, iteration: Callable) -> Callable:
        """``iteration`` recording, when it returns, that ``loop`` completed one (see :meth:`liveness`)."""

        def wrapped(*args, **kwargs):
            try:
                return iteration(*args, **kwargs)
            finally:
                self._loop_beats[loop] = self.watchdog.clock()

        return wrapped

    def _run_loop(self, loop: str, run: Callable[[threading.Event], None], stop: threading.Event) -> None:
        self._loop_threads[loop] = threading.get_ident()
        self._loop_beats[loop] = self.watchdog.clock()
        run(stop)

    def liveness(self) -> tuple[bool, list[str]]:
        """``(alive, reasons)`` for ``/healthz``: every watched loop makes progress.

        A loop (lease, firing) is stalled when it is inside a store call
        in which the store has sent nothing for longer than its
        ``statement_timeout`` (the store should have answered or cancelled
        it: the connection has gone silent; a wait on many pipelined chunks
        that keep committing is not), or when it has
        completed neither an iteration nor a store call for
        ``loop_stall_s``. Loops not started yet, and every loop once a stop
        was asked, count as alive. Times are the watchdog's clock (seconds).
        """
        if self._stop_firing.is_set():
            return True, []
        now = self.watchdog.clock()
        reasons: list[str] = []
        bound = self.settings.effective_loop_stall_s
        statement = self.settings.effective_statement_timeout_s
        for loop in LOOPS:
            thread = self._loop_threads.get(loop)
            if thread is None:
                continue
            in_call, done = self.watchdog.thread_state(thread)
            if in_call is not None and now - in_call > statement:
                reasons.append(
                    f"{loop} loop: stalled in a store call, nothing from the store for {now - in_call:.1f}s "
                    f"(statement_timeout {statement:g}s)"
                )
                continue
            progress = max(self._loop_beats.get(loop, now), done or 0.0)
            if in_call is None and now - progress > bound:
                reasons.append(
                    f"{loop} loop: no iteration completed for {now - progress:.1f}s (loop_stall_s {bound:g}s)"
                )
        return not reasons, reasons

    def readiness(self) -> tuple[bool, list[str], dict]:
        """``(ready, reasons, checks)`` for ``/readyz``: not stopping, loops alive, store answers,
        heartbeat fresh."""
        reasons: list[str] = []
        if self._stop_firing.is_set():
            reasons.append("stopping: the node is draining after a stop signal")
        alive, stalled = self.liveness()
        reasons += stalled
        store_error = self.probe.check()
        if store_error is not None:
            reasons.append(store_error)
        age = self._heartbeat_age()
        ttl = self.settings.lease_ttl_s
        if age < 0:
            reasons.append("heartbeat: no successful membership heartbeat yet")
        elif age >= ttl:
            reasons.append(f"heartbeat: last successful heartbeat {age:.1f}s ago, lease TTL is {ttl:g}s")
        checks = {
            "store": "ok" if store_error is None else store_error,
            "loops": "ok" if alive else stalled,
            "heartbeat_age_s": None if age < 0 else round(age, 3),
            "lease_ttl_s": ttl,
            "partitions_owned": len(self.table),
            "node_id": self.node_id,
        }
        return not reasons, reasons, checks

    @property
    def metrics_port(self) -> int | None:
        """The endpoint's bound port (``metrics_port`` 0 binds a free one), or None without one."""
        return self.health.port if self.health is not None else None

    def start(self) -> None:
        """Start the endpoint and the HTTP API (if configured), then the lease, firing and retention threads.

        Raises :class:`~scheduler.errors.StoreSetupError` if the store is
        misconfigured, :class:`~scheduler.errors.ConfigError` if its DSN is
        malformed or the metrics or API port cannot be bound (a bad
        setting: ``scheduler node`` exits 2, as ``scheduler api`` does for
        its port; see the module doc; a store that cannot be reached yet is
        checked again by :meth:`check_store_again`),
        :class:`~scheduler.errors.SchedulerError` if the coordinator's
        preflight refuses (the etcd coordinator: etcd's revision below the
        stored epochs); nothing else is started then.
        """
        if self.watchdog.on_stuck is None:
            self.watchdog.on_stuck = self._store_call_stuck
        try:
            self._store_pending = self._check_store()
        except ConfigError as exc:  # StoreSetupError, or a DSN check_dsn refuses
            log.event("store_misconfigured", logging.ERROR, node=self.node_id, error=str(exc))
            self.coordinator.close()
            raise
        if self._store_pending is not None:
            log.event("store_unavailable", logging.WARNING, component="start", error=self._store_pending)
        try:
            self.coordinator.preflight()
        except Exception:
            self.coordinator.close()
            raise
        if self.settings.api_port is not None:
            from scheduler.api.server import ApiThread  # FastAPI only in a node that serves the API

            host, port = self.settings.api_host, self.settings.api_port
            try:
                self.api = ApiThread(self.settings.dsn, host, port, self.settings.api)
            except OSError as exc:
                self.coordinator.close()
                raise ConfigError(f"api_port: cannot listen on {host}:{port} ({exc.strerror or exc})") from exc
        if self.health is not None:
            self.health.start()
        if self.api is not None:
            self.api.start()
        log.event(
            "node_started",
            node=self.node_id,
            dsn=redact_dsn(self.settings.dsn),
            coordinator=self.settings.coordinator,
            lease_ttl_s=self.settings.lease_ttl_s,
            renew_interval_s=self.settings.renew_interval_s,
            poll_interval_s=self.settings.poll_interval_s,
            tick_interval_s=self.settings.tick_interval_s,
            metrics_port=self.metrics_port,
            api_port=self.api.port if self.api is not None else None,
            retention_s=self.settings.retention_s,
        )
        self._threads = [
            threading.Thread(
                target=self._run_loop,
                args=("lease", self.lease_loop.run, self._stop_leases),
                name="lease-loop",
                daemon=True,
            ),
            threading.Thread(
                target=self._run_loop,
                args=("firing", self.firer.run, self._stop_firing),
                name="firing-loop",
                daemon=True,
            ),
        ]
        self._threads.append(
            threading.Thread(target=self.delivery.run, args=(self._stop_delivery,), name="delivery-loop", daemon=True)
        )
        if self.retention is not None:
            self._threads.append(
                threading.Thread(
                    target=self.retention.run, args=(self._stop_retention,), name="retention-loop", daemon=True
                )
            )
        self._threads.append(
            threading.Thread(target=self.push.run, args=(self._stop_push,), name="push-loop", daemon=True)
        )
        for thread in self._threads:
            thread.start()
        # Not joined at stop: a daemon that dies with the process (the pass is re-runnable).
        threading.Thread(target=self._prepare_zones, name="zones", daemon=True).start()
        # The delivery gauges (queue depth per tenant, runs in flight): a read every 10 s, likewise.
        threading.Thread(target=self.delivery_gauges.run, args=(self._stop_zones,), name="gauges", daemon=True).start()

    def _prepare_zones(self) -> None:
        """On its own thread and connection: once at start, if the store's slots
        were computed with another tzdata release, replan them
        (scheduler/tzreplan.py); then, at start and every
        :data:`ZONE_WARM_INTERVAL_S`, compute ahead the transition tables of the
        zones the store's schedules use, new ones only
        (:func:`scheduler.zones.warm`), so no herd pays a zone's first use (~2.4
        ms a zone; ~1.4 s for every zone tzdata names). Never blocks firing
        (which checks every slot it fires anyway); failures are logged, the
        replan is left to the next start or ``scheduler jobs replan-slots``."""
        from scheduler import tzreplan, zones

        warmed: set[str] = set()
        replanned = False
        since: datetime | None = None
        while not self._stop_zones.is_set():
            try:
                with store.node_connect(
                    self.settings, f"scheduler-zones:{self.node_id}", watchdog=self.watchdog
                ) as conn:
                    if not replanned:
                        tzreplan.replan_store(conn)
                        replanned = True
                    rows = store.execute(conn, "schedule_zones", {"since": since})
                    now = store.now(conn)
                # Registrations commit after their created_at: look back a margin.
                since = now - ZONE_WARM_LOOKBACK
                fresh = [row["tz"] for row in rows if row["tz"] not in warmed]
                if fresh:
                    count = zones.warm(fresh, int(now.timestamp()))
                    warmed.update(fresh)
                    log.event("zones_warmed", node=self.node_id, zones=count)
            except Exception as exc:  # noqa: BLE001 - tried again after the interval
                log.event(
                    "slots_replan_failed" if not replanned else "zones_warm_failed",
                    logging.WARNING,
                    node=self.node_id,
                    error=(str(exc).splitlines() or [type(exc).__name__])[0],
                )
            self._stop_zones.wait(ZONE_WARM_INTERVAL_S)

    def _check_store(self) -> str | None:
        from scheduler.migrate import script_revisions

        return store.check_node_store(self.settings, script_revisions(), self.watchdog)

    def check_store_again(self) -> bool:
        """Retry a start-up store check that could not reach the store; True once it passed.

        Raises :class:`~scheduler.errors.StoreSetupError` if the store is now
        found misconfigured (the caller stops the node).
        """
        if self._store_pending is None:
            return True
        self._store_pending = self._check_store()
        if self._store_pending is None:
            log.event("store_checked", node=self.node_id)
            return True
        return False

    def _store_call_stuck(self, call: watchdog.Call) -> None:
        """The watchdog's last resort: a store call still blocked after its socket was shut down."""
        log.event(
            "node_exiting",
            logging.ERROR,
            node=self.node_id,
            status=EXIT_STOP_DEADLINE,
            reason=f"store call of {call.label} stuck after its connection was broken",
        )
        _exit_now(EXIT_STOP_DEADLINE)

    def stop(self) -> None:
        """Ask the loops to stop; safe from a signal handler and idempotent."""
        self._stop_firing.set()
        self.lease_loop.stop_claiming()  # keep renewing until leave(), but take nothing new
        self._stop_retention.set()
        self._stop_delivery.set()
        self._stop_zones.set()
        self._stop_push.set()
        self.firer.wake()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the firing loop to finish its tick, then release leases and leave."""
        leases, firing, *others = self._threads
        if self.api is not None:
            self.api.stop()
        firing.join(timeout_s)
        for thread in others:
            thread.join(timeout_s)
        self._stop_leases.set()
        self.lease_loop.wake()  # a watching coordinator's lease loop waits on its wake-up
        leases.join(timeout_s)
        self.lease_loop.leave()
        self.firer.close()
        self.coordinator.close()
        self.delivery.close()
        if self.retention is not None:
            self.retention.close()
        self.push.close()
        if self.health is not None:
            self.health.stop()
        self.probe.close()
        log.event(
            "node_stopped", node=self.node_id, runs_fired=int(self.metrics.value("scheduler_firing_runs_fired_total"))
        )

    def run_until_signalled(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully (exit status 0).

        The process ends within ``stop_timeout_s`` of the signal: past it, it
        logs ``stop_deadline_passed`` and exits with status 1 at once. Raises
        :class:`~scheduler.errors.StoreSetupError` (after a graceful stop if
        the loops had started) when the store is misconfigured. Owns the
        process: it also freezes the start-up heap out of the garbage
        collector's reach (:func:`scheduler.runtime.freeze_startup_heap`).
        """
        deadline: list[threading.Timer] = []

        def handler(signum: int, frame: FrameType | None) -> None:
            log.event("signal_received", node=self.node_id, signal=signal.Signals(signum).name)
            if not deadline:
                timer = threading.Timer(self.settings.stop_timeout_s, self._stop_deadline_passed)
                timer.daemon = True
                timer.start()
                deadline.append(timer)
            self.stop()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        runtime.freeze_startup_heap()
        try:
            self.start()
            next_check = self.watchdog.clock()
            while not self._stop_firing.is_set():
                self._stop_firing.wait(0.5)
                if self._store_pending is not None and self.watchdog.clock() >= next_check:
                    next_check = self.watchdog.clock() + STORE_CHECK_INTERVAL_S
                    try:
                        self.check_store_again()
                    except StoreSetupError as exc:
                        log.event("store_misconfigured", logging.ERROR, node=self.node_id, error=str(exc))
                        self.setup_error = exc
                        self.stop()
            self.join()
            if self.setup_error is not None:
                raise self.setup_error
        finally:
            for timer in deadline:
                timer.cancel()
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _stop_deadline_passed(self) -> None:
        busy = [thread.name for thread in self._threads if thread.is_alive()]
        log.event(
            "stop_deadline_passed",
            logging.ERROR,
            node=self.node_id,
            stop_timeout_s=self.settings.stop_timeout_s,
            threads_running=busy,
            status=EXIT_STOP_DEADLINE,
        )
        _exit_now(EXIT_STOP_DEADLINE)


def _shared_watchdog() -> watchdog.Watchdog:
    return watchdog.shared()


def _exit_now(status: int) -> None:
    """Flush the log and end the process at once (threads blocked in the driver cannot be joined)."""
    for handler in logging.getLogger("scheduler").handlers:
        try:
            handler.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
