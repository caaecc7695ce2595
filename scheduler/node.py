"""The composition root of a scheduler node (STYLE.md rule 6).

A node is two loops on two threads, each with its own store connection:

* the lease loop (:class:`scheduler.lease.LeaseLoop`): heartbeat + renewal
  every ``renew_interval_s``, membership poll + claim/release every
  ``poll_interval_s``;
* the firing loop (:class:`scheduler.firing.Firer`): one fenced firing
  transaction per ``tick_interval_s``.

They share only the :class:`~scheduler.lease.LeaseTable`. Two optional
pieces complete a production node:

* the HTTP endpoint (:mod:`scheduler.health`, ``metrics_port`` set):
  ``/metrics``, ``/healthz`` and ``/readyz`` (store answers + heartbeat
  fresh + not stopping);
* the retention loop (:class:`scheduler.retention.RetentionLoop`,
  ``retention_s`` set): one bounded DELETE batch at most every
  ``retention_batch_interval_s`` over the partitions this node holds, on a
  third thread with its own connection, so it never stalls firing.

Graceful stop (SIGTERM/SIGINT, DESIGN.md §6): ``/readyz`` turns 503, the
firing loop finishes its tick and exits, then the lease loop releases every
lease and deletes the heartbeat, so peers claim the partitions on their next
poll (lateness ≤ ~2 s); the endpoint closes last.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from scheduler import log
from scheduler.clock import Clock, SystemClock
from scheduler.firing import Firer
from scheduler.health import HealthServer, StoreProbe
from scheduler.lease import Coordinator, LeaseLoop, LeaseTable, make_coordinator
from scheduler.metrics import Metrics
from scheduler.retention import RetentionLoop
from scheduler.settings import Settings
from scheduler.store import redact_dsn


class Node:
    """One scheduler node process.

    ``coordinator`` defaults to the one ``settings.coordinator`` names
    (:class:`~scheduler.lease.SqlCoordinator` or the etcd one); ``clock`` to the
    system clock. :meth:`start` launches the loops, :meth:`stop` asks them to
    end, :meth:`join` waits and then leaves the cluster.
    """

    def __init__(self, settings: Settings, *, coordinator: Coordinator | None = None,
                 clock: Clock | None = None, metrics: Metrics | None = None) -> None:
        self.settings = settings.validated()
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.table = LeaseTable(self.clock, self.settings.safety_margin_s)
        self.coordinator = coordinator or make_coordinator(self.settings, self.metrics)
        self.firer = Firer(self.settings, self.table, self.clock, self.metrics)
        self.lease_loop = LeaseLoop(self.settings, self.coordinator, self.table, self.clock,
                                    self.metrics, on_claimed=self.firer.wake)
        self.retention = (RetentionLoop(self.settings, lambda: self.table.held().keys(), self.clock,
                                        self.metrics)
                          if self.settings.retention_s is not None else None)
        self.probe = StoreProbe(self.settings.dsn, application_name=f"scheduler-probe:{self.node_id}"[:63])
        self.health = (HealthServer(self.settings.metrics_host, self.settings.metrics_port, self.metrics,
                                    self.readiness)
                       if self.settings.metrics_port is not None else None)
        self.metrics.heartbeat_age.set_function(self._heartbeat_age)
        self._stop_firing = threading.Event()
        self._stop_leases = threading.Event()
        self._stop_retention = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def _heartbeat_age(self) -> float:
        """Seconds since the lease loop's last successful heartbeat (monotonic); -1 before one."""
        last = getattr(self.lease_loop, "last_heartbeat_mono", 0.0)
        return self.clock.monotonic() - last if last else -1.0

    def readiness(self) -> tuple[bool, list[str], dict]:
        """``(ready, reasons, checks)`` for ``/readyz``: not stopping, store answers, heartbeat fresh."""
        reasons: list[str] = []
        if self._stop_firing.is_set():
            reasons.append("stopping: the node is draining after a stop signal")
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
        """Start the endpoint (if configured), then the lease, firing and retention threads.

        Raises :class:`~scheduler.errors.SchedulerError` if the metrics port
        cannot be bound, or if the coordinator's preflight refuses (the etcd
        coordinator: etcd's revision below the stored epochs); nothing
        else is started then.
        """
        preflight = getattr(self.coordinator, "preflight", None)
        if preflight is not None:
            try:
                preflight()
            except Exception:
                self.coordinator.close()
                raise
        if self.health is not None:
            self.health.start()
        log.event("node_started", node=self.node_id, dsn=redact_dsn(self.settings.dsn),
                  coordinator=self.settings.coordinator,
                  lease_ttl_s=self.settings.lease_ttl_s, renew_interval_s=self.settings.renew_interval_s,
                  poll_interval_s=self.settings.poll_interval_s,
                  tick_interval_s=self.settings.tick_interval_s, metrics_port=self.metrics_port,
                  retention_s=self.settings.retention_s)
        self._threads = [
            threading.Thread(target=self.lease_loop.run, args=(self._stop_leases,),
                             name="lease-loop", daemon=True),
            threading.Thread(target=self.firer.run, args=(self._stop_firing,),
                             name="firing-loop", daemon=True),
        ]
        if self.retention is not None:
            self._threads.append(threading.Thread(target=self.retention.run, args=(self._stop_retention,),
                                                  name="retention-loop", daemon=True))
        for thread in self._threads:
            thread.start()
        # Not joined at stop: a daemon that dies with the process (the pass is re-runnable).
        threading.Thread(target=self._replan_slots, name="tz-replan", daemon=True).start()

    def _replan_slots(self) -> None:
        """Once at start, on its own connection: if the store's slots were computed
        with another tzdata release, replan them (scheduler/tzreplan.py). Never
        blocks firing (which checks every slot it fires anyway); failures are
        logged and left to the next start or ``scheduler jobs replan-slots``."""
        from scheduler import store, tzreplan

        try:
            s = self.settings
            with store.connect(s.dsn, application_name=f"scheduler-replan:{s.node_id}"[:63],
                               lock_timeout_s=s.effective_lock_timeout_s,
                               statement_timeout_s=s.effective_statement_timeout_s,
                               idle_in_transaction_timeout_s=s.effective_idle_in_transaction_timeout_s) as conn:
                tzreplan.replan_store(conn)
        except Exception as exc:  # noqa: BLE001 - a failed pass is retried at the next start
            log.event("slots_replan_failed", logging.WARNING, node=self.node_id,
                      error=(str(exc).splitlines() or [type(exc).__name__])[0])

    def stop(self) -> None:
        """Ask the loops to stop; safe from a signal handler and idempotent."""
        self._stop_firing.set()
        self.lease_loop.stop_claiming()  # keep renewing until leave(), but take nothing new
        self._stop_retention.set()
        self.firer.wake()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the firing loop to finish its tick, then release leases and leave."""
        leases, firing, *others = self._threads
        firing.join(timeout_s)
        for thread in others:
            thread.join(timeout_s)
        self._stop_leases.set()
        self.lease_loop.wake()  # a watching coordinator's lease loop waits on its wake-up
        leases.join(timeout_s)
        self.lease_loop.leave()
        self.firer.close()
        self.coordinator.close()
        if self.retention is not None:
            self.retention.close()
        if self.health is not None:
            self.health.stop()
        self.probe.close()
        log.event("node_stopped", node=self.node_id,
                  runs_fired=int(self.metrics.value("scheduler_firing_runs_fired_total")))

    def run_until_signalled(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully (exit status 0)."""
        def handler(signum: int, frame: FrameType | None) -> None:
            log.event("signal_received", node=self.node_id, signal=signal.Signals(signum).name)
            self.stop()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not self._stop_firing.is_set():
                self._stop_firing.wait(0.5)
            self.join()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
