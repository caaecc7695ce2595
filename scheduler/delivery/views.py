"""Seeing delivery: run ids, ``jobs describe``, ``runs redrive``, the node's delivery gauges.

* :func:`run_id`: the run id ``<job_id>.<nominal time in integer Unix
  microseconds>`` of a (job, nominal time) (:class:`~scheduler.delivery.lifecycle.RunKey`);
* :func:`describe_job`: a job's spec and delivery target (header *names*
  only: values may be secrets), its next fires, its last runs with lateness
  and dispatch lag, and counters (runs per state, skips per reason);
* :func:`list_tenant_runs`: one tenant's runs, newest first, filtered and paged
  (the HTTP API's ``GET /v1/runs``);
* :func:`redrive` / :func:`redrive_job`: dead or canceled runs of a live job
  back to ``pending`` (see :func:`redrive` for what a redrive resets);
* :class:`DeliveryGauges`: the node's periodic read of queue depth per tenant
  (a bounded label set) and runs in flight.

Every per-job statement is scoped by ``(partition_id, job_id)`` (named
queries in scheduler/sql/queries.sql, section "delivery views").
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import psycopg

from scheduler import log, store
from scheduler.delivery import lifecycle
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.targets import DeliverySpec
from scheduler.errors import ConflictError, NotFoundError, ValidationError
from scheduler.metrics import Metrics
from scheduler.partition import partition_of
from scheduler.planner import scheduled_time
from scheduler.spec import build_schedule, schedule_key

RUN_STATES = ("pending", "leased", "failed", "succeeded", "dead", "canceled")
"""Delivery states of a run (``runs.state``; NULL: fired before delivery existed)."""

REDRIVABLE_STATES = ("dead", "canceled")
"""States :func:`redrive` moves back to ``pending``."""

LIVE_JOB_RULE = "only a run of a live job can be redriven"
"""Why a run of a deleted job is not redriven (:func:`redrive` and :func:`redrive_job` refuse it)."""

DESCRIBE_FIRES = 10
"""Fires :func:`describe_job` lists."""
DESCRIBE_RUNS = 10
"""Recent runs :func:`describe_job` lists."""


def run_id(job_id: uuid.UUID, nominal_time: datetime) -> str:
    """The run id of job ``job_id``'s run at ``nominal_time`` (:attr:`RunKey.run_id`)."""
    return RunKey.of(job_id, nominal_time).run_id


# ---------------------------------------------------------------- describe


def _delivery(spec: DeliverySpec) -> dict[str, Any]:
    """A job's target (header names only), payload size and retry/overlap policy, as describe shows them."""
    target: dict[str, Any]
    if spec.url is None:
        target = {"queue": spec.queue}
    else:
        target = {
            "url": spec.url,
            "method": spec.method,
            "header_names": [name for name, _ in spec.headers],
            "timeout_s": spec.timeout_s if spec.timeout_s is not None else lifecycle.DEFAULT_PUSH_TIMEOUT_S,
        }
    return {
        "target": target,
        "payload_bytes": None if spec.payload is None else len(spec.payload.encode("utf-8")),
        "retry": {
            "max_attempts": spec.max_attempts,
            "backoff_base_s": spec.backoff_base_s,
            "backoff_cap_s": spec.backoff_cap_s,
            "max_age_s": spec.max_age_s,
        },
        "overlap": spec.overlap,
    }


def next_fires(job: dict, count: int = DESCRIBE_FIRES) -> list[dict[str, datetime]]:
    """The job's next ``count`` fires as ``{"nominal_time", "scheduled_at"}``, oldest first.

    From the stored next slot (``next_nominal_at``, the one the planner fires
    next; it may be overdue) onward by the job's schedule; scheduled_at adds
    the job's deterministic jitter. None for a paused, deleted or exhausted job.
    """
    slot = job.get("next_nominal_at")
    if slot is None or job.get("paused") or job.get("deleted_at") is not None:
        return []
    schedule = build_schedule(*schedule_key(job))
    fires = []
    while slot is not None and len(fires) < count:
        fires.append({"nominal_time": slot, "scheduled_at": scheduled_time(job["job_id"], slot, job["jitter_s"])})
        slot = schedule.next_after(slot)
    return fires


def describe_job(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    *,
    fires: int = DESCRIBE_FIRES,
    runs: int = DESCRIBE_RUNS,
    tenant: str | None = None,
) -> dict:
    """Everything an operator asks about one job, as one JSON-ready-ish dict (instants as datetimes).

    Keys: ``job`` (the ``jobs`` row), ``delivery`` (target: ``{"queue"}`` or
    ``{"url", "method", "header_names", "timeout_s"}``; ``payload_bytes``
    (compact UTF-8 JSON, None without payload); ``retry`` (max_attempts,
    backoff_base_s, backoff_cap_s, max_age_s); ``overlap``),
    ``next_fires`` (:func:`next_fires`), ``recent_runs`` (newest first:
    run_id, nominal_time, scheduled_at, fired_at, state, origin, attempt,
    lateness_s, dispatch_lag_s (None until claimed), finished_at,
    last_error, worker (the last claim's label)), ``counters`` (``runs``: per state, every state of
    :data:`RUN_STATES` plus ``predelivery`` (state NULL); ``in_flight``:
    leased + failed; ``skips``: per reason ``{"ranges", "slots",
    "uncounted"}``). One read-only transaction (retried on 40001/40P01).
    Raises NotFoundError for an unknown job (with ``tenant``: or another
    tenant's; the job is read scoped by it, the rest by its key).
    """
    key = {"partition_id": partition_of(job_id), "job_id": job_id}

    def read(c: psycopg.Connection) -> dict:
        job = store.execute(c, "get_job", {**key, "tenant": tenant})
        if not job:
            raise NotFoundError(f"job_id: no job {job_id}")
        delivery = store.execute(c, "get_job_delivery", key)
        by_state = {row["state"]: row["runs"] for row in store.execute(c, "count_job_runs_by_state", key)}
        skips = store.execute(c, "count_job_skips_by_reason", key)
        recent = store.execute(c, "recent_job_runs", {**key, "limit": runs})
        return {
            "job": job[0],
            "delivery": DeliverySpec.from_rows(job[0], delivery[0] if delivery else None),
            "by_state": by_state,
            "skips": skips,
            "recent": recent,
        }

    got = store.run_transaction(conn, read)
    job = got["job"]
    counts = {state: got["by_state"].get(state, 0) for state in RUN_STATES}
    counts["predelivery"] = got["by_state"].get(None, 0)
    return {
        "job": job,
        "delivery": _delivery(got["delivery"]),
        "next_fires": next_fires(job, fires),
        "recent_runs": [{"run_id": run_id(job_id, row["nominal_time"]), **row} for row in got["recent"]],
        "counters": {
            "runs": counts,
            "in_flight": counts["leased"] + counts["failed"],
            "skips": {
                row["reason"]: {"ranges": row["ranges"], "slots": row["slots"], "uncounted": row["uncounted"]}
                for row in got["skips"]
            },
        },
    }


# ---------------------------------------------------------------- a tenant's runs


def list_tenant_runs(
    conn: psycopg.Connection,
    tenant: str,
    *,
    limit: int,
    job_name: str | None = None,
    state: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: RunKey | None = None,
) -> list[dict]:
    """Up to ``limit`` runs of ``tenant``, newest nominal time first (ties by job id):
    optionally of its live job named ``job_name``, in delivery ``state``, with nominal
    time in [``since``, ``until``), after the run ``after`` in that order (keyset
    paging: pass the last run of the previous page). Rows as ``runs`` columns (``worker``
    included: the last claim's label) plus ``run_id``, ``job_name`` and ``lateness_s``
    (fired − scheduled, seconds).
    Read per job of the tenant (``list_tenant_runs``): a page costs the tenant's own
    jobs, never a scan of other tenants' runs. Raises ValidationError for ``limit``
    outside 1..10,000 or an unknown ``state``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise ValidationError("limit", "must be a whole number from 1 to 10000", limit)
    if state is not None and state not in RUN_STATES:
        raise ValidationError("state", f"must be one of {', '.join(RUN_STATES)}", state)
    params = {
        "tenant": tenant,
        "limit": limit,
        "job_name": job_name,
        "state": state,
        "since": since,
        "until": until,
        "after_nominal": after.nominal_time if after else None,
        "after_job": after.job_id if after else None,
    }
    rows = store.run_transaction(conn, lambda c: store.execute(c, "list_tenant_runs", params))
    return [{"run_id": run_id(row["job_id"], row["nominal_time"]), **row} for row in rows]


# ---------------------------------------------------------------- redrive


def _redrive(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    nominal_time: datetime | None,
    states: tuple[str, ...],
    limit: int,
    tenant: str | None = None,
) -> tuple[list[datetime], int]:
    """``redrive_runs`` in one transaction: (the nominal times moved back to pending,
    ascending; how many runs were picked but not moved because the job is not live)."""
    params = {
        "partition_id": partition_of(job_id),
        "job_id": job_id,
        "nominal_time": nominal_time,
        "states": list(states),
        "limit": limit,
        "tenant": tenant,
    }
    rows = store.run_transaction(conn, lambda c: store.execute(c, "redrive_runs", params))
    return sorted(row["nominal_time"] for row in rows if row["redriven"]), sum(not row["redriven"] for row in rows)


def run_state(conn: psycopg.Connection, key: RunKey, *, tenant: str | None = None) -> tuple[bool, str | None]:
    """``(exists, delivery state)`` of the run ``key`` (``get_run_state``), only among
    ``tenant``'s runs when given (another tenant's run: ``(False, None)``, as a
    missing one). The state is None for a run fired before delivery existed."""
    rows = store.execute(
        conn,
        "get_run_state",
        {"partition_id": key.partition_id, "job_id": key.job_id, "nominal_time": key.nominal_time, "tenant": tenant},
    )
    return (True, rows[0]["state"]) if rows else (False, None)


def redrive(conn: psycopg.Connection, text: str, *, tenant: str | None = None, field: str = "run_id") -> str:
    """Move the dead or canceled run ``text`` (a run id) of a live job back to ``pending``; return its run id.

    The run becomes ``pending``, available at once (the store's now), with a fresh retry budget: ``attempt`` reset to 0
    and ``first_claimed_at`` cleared (``max_attempts`` and ``max_age_s``
    count from the redrive; its dispatch lag afterwards counts to the first
    claim after the redrive), lease and outcome cleared (``finished_at``,
    ``retryable``); ``last_error`` is kept (why it died) until an attempt
    succeeds (the ack clears it). Nothing else of
    the run changes. ``tenant`` (None: any) limits it to that tenant's runs:
    another tenant's run is not found, as a missing one (the HTTP API passes
    its key's tenant). Raises ValidationError (naming ``field``) for a
    malformed id, NotFoundError for an unknown run, ConflictError naming
    the state for a run that is not dead or canceled, or naming the job for
    a run of a deleted (or pruned) job: it would be delivered again to a
    target nothing expects any more (nothing changed either way).
    """
    key = RunKey.parse(text, field)
    job_id, nominal = key.job_id, key.nominal_time
    moved, skipped = _redrive(conn, job_id, nominal, REDRIVABLE_STATES, 1, tenant)
    if moved:
        return run_id(job_id, nominal)
    if skipped:
        raise ConflictError(
            f"{field}: run {run_id(job_id, nominal)} is of job {job_id}, which is deleted; {LIVE_JOB_RULE} "
            "(nothing changed)"
        )
    _refuse(conn, key, tenant, field, "only a dead or canceled run can be redriven")


def _refuse(conn: psycopg.Connection, key: RunKey, tenant: str | None, field: str, rule: str) -> NoReturn:
    """Raise why a redrive or cancel of ``key`` changed nothing: NotFoundError if ``tenant``
    (None: any) has no such run, else ConflictError naming its state and ``rule``."""
    exists, state = run_state(conn, key, tenant=tenant)
    if not exists:
        raise NotFoundError(f"{field}: no run {key.run_id}")
    described = "has no delivery state (fired before delivery existed)" if state is None else f"is {state}"
    raise ConflictError(f"{field}: run {key.run_id} {described}; {rule} (nothing changed)")


CANCELABLE_STATES = ("pending", "leased", "failed")
"""The states an operator's :func:`cancel` ends (the unfinished ones)."""


def cancel(
    conn: psycopg.Connection,
    text: str,
    *,
    tenant: str | None = None,
    field: str = "run_id",
    by: str = "scheduler runs cancel",
) -> str:
    """Cancel the unfinished run ``text`` (a run id): it ends ``canceled`` now; return its run id.

    For a run that must not run after all (its job deleted, a bad payload):
    a pending run is never claimed or pushed; a leased one's worker hears
    ``canceled`` at its next heartbeat (an async handler is cancelled, a sync
    one should check ``run.abandoned``) and its ack or nack is refused, as
    after overlap ``replace`` (``cancel_run``). ``last_error`` becomes
    ``canceled by <by>``. A canceled run can be redriven. ``tenant`` (None:
    any) limits it to that tenant's runs (another's is not found). Raises
    ValidationError (naming ``field``) for a malformed id, NotFoundError for
    an unknown run, ConflictError naming the state for a finished run or one
    fired before delivery existed (nothing changed either way)."""
    key = RunKey.parse(text, field)
    params = {
        "partition_id": key.partition_id,
        "job_id": key.job_id,
        "nominal_time": key.nominal_time,
        "tenant": tenant,
        "states": list(CANCELABLE_STATES),
        "reason": f"canceled by {by}",
        "now": None,
    }
    if store.run_transaction(conn, lambda c: store.execute(c, "cancel_run", params)):
        return key.run_id
    _refuse(conn, key, tenant, field, "only a pending, leased or failed run can be canceled")


def redrive_job(conn: psycopg.Connection, job_id: uuid.UUID, state: str, limit: int) -> list[str]:
    """Redrive (as :func:`redrive`) the oldest ``limit`` runs of ``job_id`` in ``state``
    (``dead`` or ``canceled``); return their run ids, oldest first (empty if none).

    One statement, one transaction. Raises ValidationError for another state (field
    ``state``) or a ``limit`` below 1 (field ``limit``), NotFoundError for a job
    that does not exist and has no run in ``state``, ConflictError (field ``job_id``)
    for a deleted job, with or without runs in ``state``, or a pruned one with runs
    in ``state``: as :func:`redrive` refuses one run of it, nothing changed.
    """
    if state not in REDRIVABLE_STATES:
        raise ValidationError("state", "must be dead or canceled (the runs a redrive moves back to pending)", state)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError("limit", "must be a whole number >= 1", limit)
    moved, skipped = _redrive(conn, job_id, None, (state,), limit)
    deleted = bool(skipped)  # none of its runs was moved (one statement decides for all)
    if not moved and not deleted:
        found = store.execute(conn, "get_job", {"partition_id": partition_of(job_id), "job_id": job_id, "tenant": None})
        if not found:
            raise NotFoundError(f"job_id: no job {job_id}")
        deleted = found[0]["deleted_at"] is not None
    if deleted:
        raise ConflictError(f"job_id: job {job_id} is deleted; {LIVE_JOB_RULE} (nothing changed)")
    return [run_id(job_id, nominal) for nominal in moved]


# ---------------------------------------------------------------- gauges

TOP_TENANTS = 20
"""Tenants with their own ``tenant`` label in the queue-depth gauge; the rest sum into ``other``."""

GAUGE_INTERVAL_S = 10.0
"""How often a node refreshes its delivery gauges (:class:`DeliveryGauges`)."""

OTHER_TENANTS = "other"
"""Label of the tenants past the first :data:`TOP_TENANTS`."""


def depth_labels(per_tenant: dict[str, int], top: int = TOP_TENANTS) -> dict[str, int]:
    """The bounded label set of the queue-depth gauge: the ``top`` deepest tenants
    (ties by name) with their depth, plus ``other`` (the rest's sum, 0 if none)."""
    ranked = sorted(per_tenant.items(), key=lambda item: (-item[1], item[0]))
    labels = dict(ranked[:top])
    labels[OTHER_TENANTS] = sum(depth for _, depth in ranked[top:])
    return labels


def read_depths(conn: psycopg.Connection) -> tuple[dict[str, int], dict[str, int]]:
    """``(pending runs per tenant, runs in flight per state (leased, failed))``, one query
    (``delivery_depths``) over the partial indexes."""
    pending: dict[str, int] = {}
    in_flight = {"leased": 0, "failed": 0}
    for row in store.run_transaction(conn, lambda c: store.execute(c, "delivery_depths")):
        if row["kind"] == "pending":
            pending[row["tenant"]] = pending.get(row["tenant"], 0) + row["runs"]
        else:
            in_flight[row["kind"]] = row["runs"]
    return pending, in_flight


class DeliveryGauges:
    """A node's delivery gauges, refreshed every :data:`GAUGE_INTERVAL_S` on its own thread.

    :meth:`refresh` reads :func:`read_depths` once and sets
    ``scheduler_delivery_queue_depth_runs{tenant}`` (:func:`depth_labels`)
    and ``scheduler_delivery_runs_in_flight{state}``; :meth:`run` repeats it
    until ``stop`` is set. The figures are fleet-wide (every node reports
    the same; aggregate with ``max``). ``connect`` opens a store connection
    (the node's session builder); a failure is logged and retried at the
    next interval.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], metrics: Metrics, node_id: str = "") -> None:
        self._connect = connect
        self._metrics = metrics
        self._node_id = node_id

    def refresh(self) -> None:
        """One read of the store; sets both gauges. Raises store errors."""
        with self._connect() as conn:
            pending, in_flight = read_depths(conn)
        self._metrics.set_queue_depths(depth_labels(pending))
        for state, runs in in_flight.items():
            self._metrics.runs_in_flight.labels(state=state).set(runs)

    def run(self, stop: threading.Event) -> None:
        """:meth:`refresh` every :data:`GAUGE_INTERVAL_S` until ``stop`` is set; failures logged."""
        while not stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - retried at the next interval
                log.event(
                    "delivery_gauges_failed",
                    logging.WARNING,
                    node=self._node_id,
                    error=(str(exc).splitlines() or [type(exc).__name__])[0],
                )
            stop.wait(GAUGE_INTERVAL_S)
