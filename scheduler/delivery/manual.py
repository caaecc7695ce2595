"""Runs outside the schedule's own firing: run now, backfill, and the buffered run's release.

docs/delivery.md, "Overlap policy" and "Run now and backfill".

* **Run now** (:func:`request_run`, ``scheduler jobs trigger``): the CLI
  writes a ``run_requests`` row (deduplicated by (job, request id)); the
  job's *partition owner* carries it out in its firing thread, right after a
  tick's chunks (:func:`scheduler.delivery.owner.fire_requests`, ``fire_run_requests``: fenced by its
  epoch like ``fire_runs``, and serialized with the node's firing
  statements, so a manual run and a scheduled one of a ``forbid`` job can
  never both see "no unfinished run"). The run is ``origin='manual'`` at
  nominal time = the store's now; the job's overlap policy applies unless
  the request forces it. A paused job may be triggered (the request is
  explicit); a deleted one may not (:class:`~scheduler.errors.NotFoundError`,
  or outcome ``deleted`` if it was deleted after the request).
  :func:`wait_request` polls the row for the outcome.
* **Backfill** (:func:`backfill`, ``scheduler jobs backfill``): a run
  (``origin='backfill'``, pending, outside the overlap policy) for each slot
  of the job's current schedule in ``[since, until)`` that has none, in one
  transaction; a slot that has a run keeps it (the primary key), so a
  second backfill writes nothing.
* **Release** (:func:`scheduler.delivery.owner.release_buffered`, a step of
  :class:`~scheduler.delivery.loop.SettleLoop`): a ``buffer_one`` run that
  waits (pending, ``available_at`` NULL, so no claim can take it)
  becomes available once its job has no other unfinished run.

Every function runs its own transaction(s), retried whole on 40001/40P01
(:func:`scheduler.store.run_transaction`). ``now`` (aware) is the store
clock's pin in tests; production passes None.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from scheduler import jobs, store
from scheduler.errors import UNSTORABLE_TEXT, NotFoundError, ValidationError
from scheduler.partition import partition_of
from scheduler.planner import scheduled_time
from scheduler.schedule import iter_fires
from scheduler.spec import build_schedule, schedule_key
from scheduler.zones import MIN_EPOCH_S

MAX_REQUEST_ID_LEN = 200
"""Longest request id (characters; the column's check)."""

DEFAULT_WAIT_S = 10.0
"""How long ``jobs trigger`` waits for the owner's outcome by default (seconds)."""

REQUEST_POLL_S = 0.1
"""Interval between two reads of a request's row while waiting (seconds)."""

DEFAULT_BACKFILL_MAX_RUNS = 1000
"""Most slots one backfill may cover unless ``--max-runs`` says otherwise."""

MAX_BACKFILL_RUNS = 100_000
"""Largest ``max_runs`` accepted (one transaction writes them all)."""

EARLIEST = datetime.fromtimestamp(MIN_EPOCH_S, UTC)
"""The start of the supported range (year 2): where a backfill's slot search starts at the earliest."""

BACKFILL_NODE = "backfill"
"""``runs.node_id`` of backfilled runs (written by the CLI, not by a node; epoch 0)."""


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """A ``run_requests`` row: ``outcome`` None while no owner has carried it
    out, else ``fired`` (``run_id`` names the run), ``skipped`` (the overlap
    policy) or ``deleted``. ``created``: this call wrote the row (False: the
    request id was used before, and this is the first request's state)."""

    job_id: uuid.UUID
    request_id: str
    force: bool
    created: bool
    outcome: str | None = None
    nominal_time: datetime | None = None

    @property
    def run_id(self) -> str | None:
        """The manual run's id, when the request fired one."""
        if self.nominal_time is None:
            return None
        # Imported here: lifecycle imports the firing package, whose tick imports this module.
        from scheduler.delivery.lifecycle import RunKey

        return RunKey.of(self.job_id, self.nominal_time).run_id


@dataclasses.dataclass(frozen=True)
class BackfillResult:
    """What :func:`backfill` did (or, ``dry_run``, would do): ``slots``: every
    slot of the range, ascending; ``created``: the slots that got a run (would
    get one), ascending; the others already had a run."""

    slots: tuple[datetime, ...]
    created: tuple[datetime, ...]
    dry_run: bool


def _live_job(conn: psycopg.Connection, job_id: uuid.UUID, tenant: str | None = None) -> dict[str, Any]:
    """The ``jobs`` row of ``job_id`` (of ``tenant`` if given); NotFoundError if unknown,
    another tenant's or deleted."""
    job = jobs.get_job(conn, job_id, tenant)
    if job["deleted_at"] is not None:
        raise NotFoundError(f"job_id: job {job_id} is deleted")
    return job


def _request(row: dict[str, Any], created: bool) -> RunRequest:
    return RunRequest(
        job_id=row["job_id"],
        request_id=row["request_id"],
        force=row["force"],
        created=created,
        outcome=row["outcome"],
        nominal_time=row["nominal_time"],
    )


def request_run(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    request_id: str | None = None,
    *,
    force: bool = False,
    now: datetime | None = None,
    tenant: str | None = None,
) -> RunRequest:
    """Ask the partition owner for a manual run of ``job_id`` (``jobs trigger``).

    ``request_id`` (1..:data:`MAX_REQUEST_ID_LEN` printable characters; default a new
    UUID) deduplicates: a second request with the same id for the same job
    writes nothing and returns the first one's row (its ``force`` stands).
    With ``tenant``, only that tenant's job is found. Raises NotFoundError
    for an unknown, another tenant's or deleted job, ValidationError
    (field ``request_id``) for a bad id.
    """
    if request_id is None:
        request_id = str(uuid.uuid4())
    if not isinstance(request_id, str):
        raise ValidationError("request_id", "must be a string", request_id)
    if UNSTORABLE_TEXT.search(request_id):
        raise ValidationError("request_id", "must be text the store can keep (no NUL, no unpaired surrogate)")
    if not (1 <= len(request_id) <= MAX_REQUEST_ID_LEN and request_id.isprintable()):
        rule = f"must be 1 to {MAX_REQUEST_ID_LEN} printable characters"
        raise ValidationError("request_id", rule, request_id)
    key = {"partition_id": partition_of(job_id), "job_id": job_id, "request_id": request_id}

    def body(c: psycopg.Connection) -> tuple[dict[str, Any], bool]:
        _live_job(c, job_id, tenant)
        inserted = store.execute(c, "insert_run_request", {**key, "force": bool(force), "now": now})
        return store.execute(c, "get_run_request", key)[0], bool(inserted)

    row, created = store.run_transaction(conn, body)
    return _request(row, created)


def get_request(conn: psycopg.Connection, job_id: uuid.UUID, request_id: str) -> RunRequest | None:
    """The request ``request_id`` of ``job_id`` as stored now (None: unknown)."""
    rows = store.execute(
        conn, "get_run_request", {"partition_id": partition_of(job_id), "job_id": job_id, "request_id": request_id}
    )
    return _request(rows[0], False) if rows else None


def wait_request(
    conn: psycopg.Connection | Callable[[], AbstractContextManager[psycopg.Connection]],
    request: RunRequest,
    wait_s: float = DEFAULT_WAIT_S,
    poll_s: float = REQUEST_POLL_S,
) -> RunRequest:
    """Poll ``request`` until an owner carried it out or ``wait_s`` seconds
    passed; returns its latest state (``outcome`` None: still queued, e.g. no
    node is running). ``conn`` must be in autocommit mode (each read sees the
    latest commit); or a callable returning a context manager of such a
    connection, borrowed for each read only (the API's pool: a waiting request
    holds no connection between reads). Raises ValidationError (field
    ``wait_s``) for a negative or non-finite wait."""
    if not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= 86_400:
        raise ValidationError("wait_s", "must be a number of seconds from 0 to 86400", wait_s)
    deadline = time.monotonic() + wait_s
    latest = request
    while latest.outcome is None:
        if isinstance(conn, psycopg.Connection):
            found = get_request(conn, request.job_id, request.request_id)
        else:
            with conn() as borrowed:
                found = get_request(borrowed, request.job_id, request.request_id)
        if found is not None:
            latest = dataclasses.replace(found, created=request.created)
        if latest.outcome is not None or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    return latest


def backfill(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    since: datetime,
    until: datetime,
    *,
    max_runs: int = DEFAULT_BACKFILL_MAX_RUNS,
    dry_run: bool = False,
    now: datetime | None = None,
    tenant: str | None = None,
) -> BackfillResult:
    """A run (origin ``backfill``) for each slot of ``job_id``'s current
    schedule with nominal time in ``[since, until)`` that has none, in one
    transaction (``insert_backfill_runs``). Idempotent: a second call finds
    every slot taken and writes nothing. ``dry_run``: write nothing, report
    what would be written.

    Raises ValidationError, nothing written: ``since``/``until`` naive,
    ``until`` not after ``since`` or later than the store's now (past slots
    only); ``max_runs`` not 1..:data:`MAX_BACKFILL_RUNS`, or the range holding
    more slots than ``max_runs``. NotFoundError for an unknown or deleted job
    (or, with ``tenant``, another tenant's).
    """
    for field, value in (("since", since), ("until", until)):
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValidationError(field, "must be an instant with a UTC offset", value)
    if until <= since:
        raise ValidationError("until", "must be later than {since}", until)
    _check_max_runs(max_runs)

    def body(c: psycopg.Connection) -> BackfillResult:
        store_now = now or store.now(c)
        if until > store_now:
            raise ValidationError("until", f"must not be later than the store's now ({store_now.isoformat()})", until)
        return _backfill_in(c, _live_job(c, job_id, tenant), since, until, max_runs, dry_run, now)

    return store.run_transaction(conn, body)


def _check_max_runs(max_runs: Any) -> None:
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or not 1 <= max_runs <= MAX_BACKFILL_RUNS:
        raise ValidationError("max_runs", f"must be a whole number from 1 to {MAX_BACKFILL_RUNS}", max_runs)


def _backfill_in(
    c: psycopg.Connection,
    job: dict[str, Any],
    since: datetime,
    until: datetime,
    max_runs: int,
    dry_run: bool,
    now: datetime | None,
) -> BackfillResult:
    """:func:`backfill` of the ``jobs`` row ``job`` inside the caller's transaction
    (``until`` already checked against the store's now)."""
    job_id = job["job_id"]
    schedule = build_schedule(*schedule_key(job))
    # Slots at or after since: the schedule's slots strictly after since − 1 µs (no earlier
    # than the supported range's start, where since may lie).
    fires = iter_fires(schedule, max(since - timedelta(microseconds=1), EARLIEST), until)
    slots = list(itertools.islice((s for s in fires if s < until), max_runs + 1))
    if len(slots) > max_runs:
        raise ValidationError(
            "max_runs",
            f"the range holds more than {max_runs} slots: narrow {{since}}/{{until}} or raise {{max_runs}}",
            max_runs,
        )
    key = {"partition_id": job["partition_id"], "job_id": job_id}
    taken = {
        row["nominal_time"] for row in store.execute(c, "job_runs_between", {**key, "since": since, "until": until})
    }
    missing = [s for s in slots if s not in taken]
    if dry_run or not missing:
        return BackfillResult(tuple(slots), tuple(missing), dry_run)
    rows = store.execute(
        c,
        "insert_backfill_runs",
        {
            **key,
            "tenant": job["tenant"],
            "queue": job["queue"],
            "node_id": BACKFILL_NODE,
            "nominals": missing,
            "scheduled": [scheduled_time(job_id, s, job["jitter_s"]) for s in missing],
            "now": now,
        },
    )
    return BackfillResult(tuple(slots), tuple(sorted(row["nominal_time"] for row in rows)), False)


CATCH_UP_CHOICES = ("none", "backfill")
"""What :func:`resume` does with the slots that passed while the job was paused."""


def resume(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    *,
    catch_up: str = "none",
    max_runs: int = DEFAULT_BACKFILL_MAX_RUNS,
    now: datetime | None = None,
    tenant: str | None = None,
) -> BackfillResult | None:
    """Resume a paused job (:func:`scheduler.jobs.set_paused`: its next slot is
    the first strictly after now) with a catch-up choice, in one transaction:

    * ``none`` (the default; ``jobs resume``): the slots that passed while it
      was paused never run;
    * ``backfill``: each slot of its current schedule strictly after the
      instant it was paused, through now, gets a run as :func:`backfill`
      gives one (origin ``backfill``, outside the overlap policy; a slot
      that has a run keeps it). The pause instant is the end of its last
      revision in force while not paused (``job_revisions``); a due slot the
      pause dropped was recorded as skipped (``paused``) then and is not
      caught up.

    Returns the catch-up's :class:`BackfillResult` (``None`` for ``none``, or
    when the job was not paused: nothing changes then). Raises
    ValidationError (nothing written): ``catch_up`` not one of
    :data:`CATCH_UP_CHOICES`, ``max_runs`` not 1..:data:`MAX_BACKFILL_RUNS`,
    more missed slots than ``max_runs`` (field ``max_runs``). NotFoundError
    for an unknown or deleted job (or, with ``tenant``, another tenant's).
    """
    if catch_up not in CATCH_UP_CHOICES:
        raise ValidationError("catch_up", f"must be one of {', '.join(CATCH_UP_CHOICES)}", catch_up)
    _check_max_runs(max_runs)

    def body(c: psycopg.Connection) -> BackfillResult | None:
        store_now = now or store.now(c)
        before = jobs.set_paused_in(c, job_id, False, store_now, tenant=tenant)
        if catch_up == "none" or not before["paused"]:
            return None
        key = {"partition_id": before["partition_id"], "job_id": job_id, "tenant": before["tenant"]}
        paused_at = store.execute(c, "paused_since", key)[0]["paused_at"] or before["changed_at"]
        return _backfill_in(
            c,
            before,
            paused_at + timedelta(microseconds=1),
            store_now + timedelta(microseconds=1),
            max_runs,
            False,
            now,
        )

    return store.run_transaction(conn, body)
