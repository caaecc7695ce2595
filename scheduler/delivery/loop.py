"""The partition owner's delivery thread: settle expired leases and failed attempts.

Each pass (every ``settle_interval_s``, default :data:`SETTLE_INTERVAL_S`)
reads the node's firable partitions and their epochs from the lease table
and runs :func:`scheduler.delivery.lifecycle.settle` over them, batch after
batch (at most :data:`MAX_BATCHES_PER_PASS` of
:data:`~scheduler.delivery.lifecycle.MAX_BATCH` runs), so a failed attempt
is retried or marked dead, and an expired lease redelivered, within about a
second of becoming due. Every statement is fenced by the epochs: after a
takeover the old owner's pass changes nothing, and the new owner's first
pass picks up what the old one left (a node's death delays deliveries by
the failover bound and loses none). Each run a pass marks dead is logged
(WARNING ``run_dead``: run, job, tenant, attempts, cause, why, last error), at most
:data:`DEAD_RUNS_LOGGED_PER_PASS` a pass, the rest counted in one
``runs_dead_unlogged``; runs sent back to pending are counted, not logged.

Further owner steps (run-now requests, releasing buffered runs) register as
``steps``: callables ``(conn, node_id, epochs, now) -> int`` run in order
after the settle batches, each in its own transaction.

Lifecycle as :class:`scheduler.retention.RetentionLoop`: :meth:`run_once`
(tests call it), :meth:`run` until the stop event, :meth:`close`. Store
failures are counted and logged, never raised; the next pass reconnects.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

import psycopg

from scheduler import log, store
from scheduler.clock import Clock
from scheduler.coordination.table import LeaseTable
from scheduler.delivery import lifecycle
from scheduler.errors import SchedulerError
from scheduler.metrics import Metrics
from scheduler.settings import Settings

SETTLE_INTERVAL_S = 0.5
"""Time between two settle passes of a node (seconds): a retry or a redelivery
starts at most this much after it became due, plus the backoff."""

MAX_BATCHES_PER_PASS = 20
"""Settle batches one pass runs at most (20 × 1,000 runs); the rest waits for the next pass."""

DEAD_RUNS_LOGGED_PER_PASS = 20
"""``run_dead`` records one pass logs at most; the rest are counted in one
``runs_dead_unlogged`` record (a receiver down can send thousands of runs to dead
at once; ``scheduler_delivery_settled_total{to="dead"}`` counts every one)."""

DEAD_ERROR_LOG_CHARS = 300
"""A dead run's last error is logged cut to this many characters (an ellipsis marks a cut)."""

STATEMENT_TIMEOUT_S = 5.0
"""statement_timeout of the delivery session: settle statements touch at most a
batch of runs by primary key; they lock partitions rows FOR SHARE, so they must
not outlast a takeover's patience (a fraction of the lease TTL)."""

Step = Callable[[psycopg.Connection, str, dict[int, int], datetime | None], int]


class SettleLoop:
    """A node's delivery thread (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        table: LeaseTable,
        clock: Clock,
        metrics: Metrics,
        steps: list[Step] | None = None,
        interval_s: float = SETTLE_INTERVAL_S,
    ) -> None:
        self._s = settings
        self._table = table
        self._clock = clock
        self._metrics = metrics
        self.steps: list[Step] = list(steps or [])
        self.interval_s = interval_s
        self._session = store.StoreSession(
            settings, clock=clock, role="delivery", statement_timeout_s=STATEMENT_TIMEOUT_S
        )

    def run_once(self) -> int:
        """One pass; returns the runs it settled (plus what the steps report)."""
        epochs = self._table.firable()
        if not epochs:
            return 0
        node_id = self._s.node_id
        now = self._clock.store_now_or_none()
        done = 0
        dead: list[lifecycle.DeadRun] = []
        try:
            conn = self._session.connection()
            for _ in range(MAX_BATCHES_PER_PASS):
                started = self._clock.monotonic()
                result = lifecycle.settle(conn, node_id=node_id, epochs=epochs, now=now)
                self._metrics.delivery_settle_duration.observe(self._clock.monotonic() - started)
                for _key, state, _attempt, was in result.runs:
                    cause = "expired" if was == "leased" else "failed"
                    self._metrics.delivery_settled.labels(to=state, cause=cause).inc()
                done += len(result.runs)
                dead.extend(result.dead_runs)
                if len(result.runs) < lifecycle.MAX_BATCH:
                    break
            for step in self.steps:
                done += step(conn, node_id, epochs, now)
            return done
        except (psycopg.Error, SchedulerError, OSError) as exc:
            self._metrics.error(getattr(exc, "sqlstate", None))
            log.event(
                "settle_failed",
                logging.WARNING,
                node=node_id,
                error=(str(exc).splitlines() or [type(exc).__name__])[0],
            )
            self.close()
            return done
        except Exception as exc:  # a bug must not end the loop silently: log it loudly, go on
            log.event(
                "settle_crashed", logging.ERROR, exc_info=True, node=node_id, error=f"{type(exc).__name__}: {exc}"
            )
            self.close()
            return done
        finally:
            _log_dead(node_id, dead)  # the batches committed before a failure too

    def run(self, stop: threading.Event) -> None:
        """A pass every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            self.run_once()
            self._clock.wait(stop, self.interval_s)

    def close(self) -> None:
        """Close the session's connection (the next pass opens a new one)."""
        self._session.close()


def _log_dead(node_id: str, dead: list[lifecycle.DeadRun]) -> None:
    """One WARNING ``run_dead`` per run in ``dead`` (run, job, tenant, attempts, cause, why,
    last error; never its payload or headers), at most :data:`DEAD_RUNS_LOGGED_PER_PASS`, then one
    ``runs_dead_unlogged`` with the count of the rest."""
    for run in dead[:DEAD_RUNS_LOGGED_PER_PASS]:
        log.event(
            "run_dead",
            logging.WARNING,
            node=node_id,
            run_id=run.key.run_id,
            job_id=str(run.key.job_id),
            tenant=run.tenant,
            attempts=run.attempt,
            cause="expired" if run.was == "leased" else "failed",
            why=run.why,
            error=log.cut(log.one_line(run.last_error or ""), DEAD_ERROR_LOG_CHARS),
        )
    if len(dead) > DEAD_RUNS_LOGGED_PER_PASS:
        log.event(
            "runs_dead_unlogged",
            logging.WARNING,
            node=node_id,
            count=len(dead) - DEAD_RUNS_LOGGED_PER_PASS,
            logged=DEAD_RUNS_LOGGED_PER_PASS,
        )
