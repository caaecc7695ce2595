"""The composition root of a scheduler node (STYLE.md rule 6).

A node is two loops on two threads, each with its own store connection:

* the lease loop (:class:`scheduler.lease.LeaseLoop`): heartbeat + renewal
  every ``renew_interval_s``, membership poll + claim/release every
  ``poll_interval_s``;
* the firing loop (:class:`scheduler.firing.Firer`): one fenced firing
  transaction per ``tick_interval_s``.

They share only the :class:`~scheduler.lease.LeaseTable`. Graceful stop
(SIGTERM/SIGINT, DESIGN.md §6): the firing loop finishes its tick and exits,
then the lease loop releases every lease and deletes the heartbeat, so peers
claim the partitions on their next poll (lateness ≤ ~2 s).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from scheduler import log
from scheduler.clock import Clock, SystemClock
from scheduler.firing import Firer
from scheduler.lease import Coordinator, LeaseLoop, LeaseTable, SqlCoordinator
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store import redact_dsn


class Node:
    """One scheduler node process.

    ``coordinator`` defaults to :class:`SqlCoordinator`; ``clock`` to the
    system clock. :meth:`start` launches the loops, :meth:`stop` asks them to
    end, :meth:`join` waits and then leaves the cluster.
    """

    def __init__(self, settings: Settings, *, coordinator: Coordinator | None = None,
                 clock: Clock | None = None, metrics: Metrics | None = None) -> None:
        self.settings = settings.validated()
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.table = LeaseTable(self.clock, self.settings.safety_margin_s)
        self.coordinator = coordinator or SqlCoordinator(self.settings, self.metrics)
        self.firer = Firer(self.settings, self.table, self.clock, self.metrics)
        self.lease_loop = LeaseLoop(self.settings, self.coordinator, self.table, self.clock,
                                    self.metrics, on_claimed=self.firer.wake)
        self._stop_firing = threading.Event()
        self._stop_leases = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def start(self) -> None:
        """Start the lease and firing threads (the lease loop first joins membership)."""
        log.event("node_started", node=self.node_id, dsn=redact_dsn(self.settings.dsn),
                  lease_ttl_s=self.settings.lease_ttl_s, renew_interval_s=self.settings.renew_interval_s,
                  poll_interval_s=self.settings.poll_interval_s,
                  tick_interval_s=self.settings.tick_interval_s)
        self._threads = [
            threading.Thread(target=self.lease_loop.run, args=(self._stop_leases,),
                             name="lease-loop", daemon=True),
            threading.Thread(target=self.firer.run, args=(self._stop_firing,),
                             name="firing-loop", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Ask the loops to stop; safe from a signal handler and idempotent."""
        self._stop_firing.set()
        self.firer.wake()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the firing loop to finish its tick, then release leases and leave."""
        leases, firing = self._threads
        firing.join(timeout_s)
        self._stop_leases.set()
        leases.join(timeout_s)
        self.lease_loop.leave()
        self.firer.close()
        self.coordinator.close()
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
