"""The run lifecycle: claim, heartbeat, ack, nack, and the partition owner's settle step.

States and transitions are docs/delivery.md's::

    pending ─claim─▶ leased ─ack─▶ succeeded
                       │ └─nack─▶ failed ─settle─▶ pending (backoff) | dead
                       └─lease expired─settle─▶ pending (backoff) | dead

Two fences, never ``SKIP LOCKED`` (which only spreads claimers):

* the **lease token** of an attempt, drawn by each claim: :func:`heartbeat`,
  :func:`ack` and :func:`nack` change a run only while it is leased with the
  token presented, and answer ``"lost"`` otherwise (a worker that paused
  past its lease cannot ack a run another worker now holds);
* the **partition owner's epoch**: :func:`claim_push` and :func:`settle` lock
  the partitions rows ``FOR SHARE`` where owner and epoch are still the
  caller's, as the firing statement does, so a node that lost a partition
  changes none of its runs.

Every function takes a connection, runs one transaction (retried whole on
40001/40P01 by :func:`scheduler.store.run_transaction`; each statement is
safe to repeat: a retry finds the work done, or answers it from the same
token) and raises what the store raises. Batches are lists: a worker acks
hundreds of runs in one statement (a transaction per ack would not reach
12,000 runs/s on two cores). A claim joins its picked runs, and a
heartbeat, ack or nack its pairs, to ``runs`` by primary-key probes only
(:func:`scheduler.store.execute_probing`), so each costs the same whether
``runs`` holds a thousand pending or leased runs or millions, and whatever
the table's statistics say. ``now`` (aware) is the store clock's pin in
tests; production passes None (the statement's timestamp).
"""

from __future__ import annotations

import dataclasses
import operator
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from scheduler import store
from scheduler.errors import UNSTORABLE_TEXT, ValidationError
from scheduler.firing.batch import epochs_literal
from scheduler.partition import partition_of

_T = TypeVar("_T")

DEFAULT_LEASE_S = 30.0
"""Lease of a worker's attempt unless it asks for another (seconds); heartbeats extend it."""

MIN_LEASE_S = 1.0
"""Shortest lease a claim or heartbeat may ask for (seconds): a shorter one would expire
before a heartbeat (a store round trip, every lease / 3) could extend it, and the
partition owner's settle pass (every 0.5 s) would redeliver runs still being handled.
The same bound for a worker over the store, one over the HTTP API, and the API itself."""

MAX_LEASE_S = 3600.0
"""Longest lease a claim or heartbeat may ask for (seconds)."""

MAX_BATCH = 1000
"""Most runs one claim, heartbeat, ack or nack call handles."""
MAX_TENANTS_PROBED = 1000
"""Most tenants one :func:`tenants_with_runs` call asks about (a worker's most)."""

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_CAP_S = 300.0
"""Retry policy of a job without a ``job_delivery`` row (docs/delivery.md, "Retry policy")."""

DEFAULT_PUSH_TIMEOUT_S = 10.0
"""Per-attempt deadline of a push to a job that names none (seconds)."""

PUSH_LEASE_MARGIN_S = 5.0
"""A pushed attempt's lease outlasts its deadline by this much (seconds): the
node records the outcome before the lease can expire under it."""

MAX_ERROR_LEN = 2000
"""Longest ``last_error`` kept (characters); longer errors are cut."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_new = object.__new__
_set = object.__setattr__


def frozen_of(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` whose ``__dict__`` is ``fields``
    (every field by name, and nothing else but a cache such as :class:`RunKey`'s
    ``_run_id``; taken, not copied), made without ``cls.__init__``.

    For the per-run path of a claim only: a frozen dataclass's ``__init__`` sets each
    field with ``object.__setattr__``, ~2.3 µs for :class:`Claimed`'s 15 fields on this
    project's 2-core machine against ~1 µs here, paid for every run a worker claims
    (docs/performance.md, "2026-12-03, afternoon"). Nothing is checked: each caller has
    a test that its instances equal the ``__init__``-built ones."""
    obj = _new(cls)
    _set(obj, "__dict__", fields)
    return obj


@dataclasses.dataclass(frozen=True, order=True)
class RunKey:
    """A run's primary key: (partition, job, nominal time). Its text form is the run id."""

    partition_id: int
    job_id: uuid.UUID
    nominal_time: datetime

    @property
    def run_id(self) -> str:
        """``<job_id>.<nominal time in integer Unix microseconds>``: stable, never re-rolled.

        Computed once per key (a worker asks it several times per run) and kept in the
        instance's ``__dict__`` (not a field: equality and hash stay the key's). Not
        :func:`functools.cached_property`: before Python 3.12 its first read of every key
        takes one lock shared by all instances, which the API's threads queued on."""
        cached: str | None = self.__dict__.get("_run_id")
        if cached is None:
            delta = self.nominal_time - _EPOCH
            micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
            cached = self.__dict__["_run_id"] = f"{self.job_id}.{micros}"
        return cached

    @classmethod
    def of(cls, job_id: uuid.UUID, nominal_time: datetime) -> RunKey:
        """The key of job ``job_id``'s run at ``nominal_time`` (aware)."""
        return cls(partition_of(job_id), job_id, nominal_time)

    @classmethod
    def parse(cls, text: str, field: str = "run_id") -> RunKey:
        """The key a run id names; raises ValidationError naming ``field`` if malformed or
        not spelled as :attr:`run_id` spells it (a run has one id: the canonical job id,
        lowercase with hyphens, and the time without a sign on 0 or leading zeros)."""
        rule = "must be <job id>.<nominal time in Unix microseconds> (as listed by `scheduler runs list`)"
        if not isinstance(text, str) or len(text) > 80:
            raise ValidationError(field, rule, text)
        job, _, micros = text.partition(".")
        digits = micros[1:] if micros.startswith("-") else micros  # before 1970 (a backfill may reach there)
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 17:
            raise ValidationError(field, rule, text)
        try:
            job_id = uuid.UUID(job)
        except ValueError:
            raise ValidationError(field, rule, text) from None
        try:
            nominal = _EPOCH + timedelta(microseconds=int(micros))
        except OverflowError:
            raise ValidationError(field, rule, text) from None
        key = cls.of(job_id, nominal)
        if key.run_id != text:
            raise ValidationError(field, rule, text)
        return key


@dataclasses.dataclass(frozen=True)
class Claimed:
    """One attempt handed over: the run, its lease, and what the attempt delivers.

    ``payload`` is the job's decoded JSON (None without one); ``url``,
    ``method``, ``headers`` (name → value) and ``timeout_s`` are the job's
    HTTP target (None for queue runs). Times are aware datetimes.
    """

    key: RunKey
    tenant: str
    queue: str | None
    job_name: str | None
    origin: str | None
    scheduled_at: datetime
    attempt: int
    token: uuid.UUID
    leased_until: datetime
    claimed_at: datetime
    payload: Any = None
    url: str | None = None
    method: str | None = None
    headers: dict[str, str] | None = None
    timeout_s: float | None = None

    @property
    def run_id(self) -> str:
        return self.key.run_id

    @property
    def job_id(self) -> uuid.UUID:
        return self.key.job_id

    @property
    def nominal_time(self) -> datetime:
        return self.key.nominal_time


@dataclasses.dataclass(frozen=True)
class Nack:
    """A failed attempt: ``retryable`` False sends the run to dead; ``retry_after_s``
    (seconds, ≥ 0) is the earliest the retry may start (e.g. an HTTP ``Retry-After``)."""

    run_id: str
    token: uuid.UUID
    error: str | None = None
    retryable: bool = True
    retry_after_s: float | None = None


@dataclasses.dataclass(frozen=True)
class DeadRun:
    """A run :func:`settle` marked dead: its ``key`` and ``tenant``, the ``attempt``
    that was its last, ``was`` (``leased``: its lease expired; ``failed``: a nack or
    a push failure), its ``last_error`` (``lease expired`` for an expired lease;
    None if the failure gave no text; for ``max age``, followed by why) and
    ``why`` it is dead: ``not retryable``, ``max attempts`` or ``max age``
    (its retry would have started more than ``max_age_s`` after its first claim)."""

    key: RunKey
    tenant: str
    attempt: int
    was: str
    last_error: str | None
    why: str


@dataclasses.dataclass(frozen=True)
class SettleResult:
    """What one :func:`settle` call did: leases found expired, runs sent back to
    pending (``retried``), runs marked dead; ``runs``: (key, new state, attempt, was),
    in the store's order; ``dead_runs``: the dead ones, in the same order."""

    expired: int = 0
    retried: int = 0
    dead: int = 0
    runs: tuple[tuple[RunKey, str, int, str], ...] = ()
    dead_runs: tuple[DeadRun, ...] = ()


def _storable(text: str) -> str:
    """``text`` with every :data:`UNSTORABLE_TEXT` character replaced by U+FFFD."""
    return UNSTORABLE_TEXT.sub("\ufffd", text)


def _check_lease(lease_s: float) -> float:
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
        raise ValidationError(
            "lease_s", f"must be a number of seconds from {MIN_LEASE_S:g} to {MAX_LEASE_S:g}", lease_s
        )
    return float(lease_s)


def _check_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BATCH:
        raise ValidationError("limit", f"must be a whole number from 1 to {MAX_BATCH}", limit)
    return limit


_CLAIM_COLUMNS = (
    "partition_id",
    "job_id",
    "nominal_time",
    "tenant",
    "queue",
    "job_name",
    "origin",
    "scheduled_at",
    "attempt",
    "lease_token",
    "leased_until",
    "claimed_at",
    "payload",
    "url",
    "method",
    "headers",
    "timeout_s",
)
"""The columns of ``claim_runs`` and ``claim_push`` a :class:`Claimed` is made of (found by name)."""


def _claimed_rows(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], Claimed]:
    """A psycopg row factory for ``claim_runs`` and ``claim_push``: each row straight
    into a :class:`Claimed`, its columns picked by name once per result. A claim
    reads up to 1,000 rows: building a dict of each first cost the claimer ~3 µs
    of CPU per run (claim 13.8 → 10.6 µs/run of client CPU, ack 7.5 → 6.3 with
    :func:`_answer_rows`; docs/performance.md, "2026-12-02, noon"). The objects
    are made by :func:`frozen_of` (docs/performance.md, "2026-12-03, afternoon")."""
    names = [column.name for column in cursor.description or ()]
    pick = operator.itemgetter(*(names.index(column) for column in _CLAIM_COLUMNS))

    def claimed(values: Sequence[Any]) -> Claimed:
        pid, jid, nominal, tenant, queue, name, origin, scheduled, attempt, token, until, at, *target = pick(values)
        payload, url, method, headers, timeout_s = target
        if isinstance(headers, list):  # stored as [[name, value], ...]
            headers = {str(key): str(value) for key, value in headers}
        key = frozen_of(RunKey, {"partition_id": pid, "job_id": jid, "nominal_time": nominal})
        return frozen_of(
            Claimed,
            {
                "key": key,
                "tenant": tenant,
                "queue": queue,
                "job_name": name,
                "origin": origin,
                "scheduled_at": scheduled,
                "attempt": attempt,
                "token": token,
                "leased_until": until,
                "claimed_at": at,
                "payload": payload,
                "url": url,
                "method": method,
                "headers": headers,
                "timeout_s": timeout_s,
            },
        )

    return claimed


def _answer_rows(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], tuple[int, str]]:
    """A psycopg row factory for the batch statements' answers: ``(i, answer)`` tuples
    (no dict per row; see :func:`_claimed_rows`)."""
    names = [column.name for column in cursor.description or ()]
    pick = operator.itemgetter(names.index("i"), names.index("answer"))
    return pick  # type: ignore[return-value]


def claim(
    conn: psycopg.Connection,
    *,
    tenant: str,
    queue: str,
    worker: str,
    limit: int,
    lease_s: float = DEFAULT_LEASE_S,
    now: datetime | None = None,
) -> list[Claimed]:
    """Lease up to ``limit`` (1..:data:`MAX_BATCH`) pending runs of ``tenant``'s
    ``queue`` available now, oldest available first, to ``worker`` for
    ``lease_s`` seconds (``claim_runs`` in sql/queries.sql). Each gets
    attempt + 1 and a new token. Returns them ordered by (nominal time, job
    id); ``[]`` when none is available. Raises ValidationError for a bad
    ``limit``/``lease_s``."""
    params = {
        "tenant": tenant,
        "queue": queue,
        "worker": worker,
        "limit": _check_limit(limit),
        "lease_s": _check_lease(lease_s),
        "now": now,
    }
    claimed: list[Claimed] = store.run_statement(
        conn, lambda c: store.execute_probing(c, "claim_runs", params, row_factory=_claimed_rows, binary=True)
    )
    return claimed


def tenants_with_runs(
    conn: psycopg.Connection, *, tenants: Sequence[str], queue: str, now: datetime | None = None
) -> set[str]:
    """Those of ``tenants`` with a pending run of ``queue`` available now
    (``tenants_with_pending_runs``: one index probe per tenant, read only,
    with :func:`scheduler.store.execute_probing`'s settings: a probe is at most
    one index entry per tenant whatever ``runs``' statistics say).
    A worker serving several tenants claims only from these. Raises
    ValidationError for more than :data:`MAX_TENANTS_PROBED` tenants."""
    if len(tenants) > MAX_TENANTS_PROBED:
        raise ValidationError("tenants", f"at most {MAX_TENANTS_PROBED} per call", len(tenants))
    params = {"tenants": list(tenants), "queue": queue, "now": now}
    rows = store.run_statement(conn, lambda c: store.execute_probing(c, "tenants_with_pending_runs", params))
    return {row["tenant"] for row in rows}


NEXT_DUE_LATE_S = 2.0
""":func:`next_due` ignores timers overdue by more than this (seconds): one that late waits
for a node to fire it, and a worker polling for it would poll in vain."""
NEXT_DUE_SCAN = 64
"""Due timers :func:`next_due` reads per tenant at most (earliest first) looking for one of the
queue (the due index has no queue column)."""
NEXT_DUE_BUDGET_S = 0.05
"""How long :func:`next_due`'s statement may run (seconds; ``statement_timeout``), ~40 times what
it takes for 51 tenants. Its walk stops after :data:`NEXT_DUE_SCAN` *visible* entries, and
visits in the heap, one by one, the due-index entries of timers that a transaction not committed
yet is inserting (a bulk import) to skip them: with 300,000 such timers of one tenant every probe
took 0.2-0.4 s of the store's CPU (the herd bench's load, measured 2026-12-04), from each idle
worker once a second. Past the budget the probe is canceled and the worker keeps its idle backoff
for a while (:data:`~scheduler.delivery.worker.DUE_PROBE_HOLD_S`)."""


def next_due(
    conn: psycopg.Connection, *, tenants: Sequence[str], queue: str, now: datetime | None = None
) -> float | None:
    """Seconds from the store's now (``now`` when pinned) until the next timer of
    ``tenants`` whose runs go to ``queue`` falls due (``tenants_next_due``):
    negative if one is overdue by at most :data:`NEXT_DUE_LATE_S`; None if none
    is due from then on among each tenant's first :data:`NEXT_DUE_SCAN` due
    timers. One index walk per tenant, read only, with
    :func:`scheduler.store.execute_probing`'s settings, in a transaction of its
    own (``conn`` must not be in one) whose statement may run
    :data:`NEXT_DUE_BUDGET_S` at most. An idle worker sleeps until then
    (:class:`~scheduler.delivery.worker.Worker`). Raises ValidationError for
    more than :data:`MAX_TENANTS_PROBED` tenants, and
    ``psycopg.errors.QueryCanceled`` past the budget (timers of the tenants
    being inserted by a transaction not committed yet: see the constant)."""
    if len(tenants) > MAX_TENANTS_PROBED:
        raise ValidationError("tenants", f"at most {MAX_TENANTS_PROBED} per call", len(tenants))
    params = {"tenants": list(tenants), "queue": queue, "now": now, "late_s": NEXT_DUE_LATE_S, "scan": NEXT_DUE_SCAN}

    def probe(c: psycopg.Connection) -> list[store.Row]:
        store.limit_statements(c, NEXT_DUE_BUDGET_S)
        return store.execute_probing(c, "tenants_next_due", params)

    rows = store.run_transaction(conn, probe)
    due_in_s: float | None = rows[0]["due_in_s"] if rows else None
    return due_in_s


def unknown_tenants(conn: psycopg.Connection, tenants: Sequence[str]) -> list[str]:
    """Those of ``tenants`` the store has no tenant of (``unknown_tenants``), in the order
    given: a worker warns about them at start (a tenant may still be created later)."""
    rows = store.execute(conn, "unknown_tenants", {"tenants": list(tenants)})
    return [row["tenant"] for row in rows]


def claim_push(
    conn: psycopg.Connection,
    *,
    node_id: str,
    epochs: dict[int, int],
    limit: int,
    now: datetime | None = None,
) -> list[Claimed]:
    """Lease up to ``limit`` pending pushed runs (HTTP targets) of the partitions
    in ``epochs`` (partition id → the fencing epoch this node holds) to the node
    (``claim_push``): fenced, so partitions whose epoch moved yield none. The
    lease lasts the job's timeout plus :data:`PUSH_LEASE_MARGIN_S`. ``[]``
    when ``epochs`` is empty or nothing is due."""
    if not epochs:
        return []
    params = claim_push_params(node_id=node_id, epochs=epochs, limit=limit, now=now)
    claimed: list[Claimed] = store.run_transaction(
        conn, lambda c: store.execute_probing(c, "claim_push", params, row_factory=_claimed_rows, binary=True)
    )
    return claimed


def claim_push_params(
    *, node_id: str, epochs: dict[int, int], limit: int, now: datetime | None = None
) -> dict[str, Any]:
    """The parameters of ``claim_push`` for :func:`claim_push`'s arguments (``epochs`` not
    empty). Raises ValidationError for a ``limit`` outside 1..:data:`MAX_BATCH`."""
    return {
        "node_id": node_id,
        "pids": sorted(epochs),
        "epochs": epochs_literal(epochs),
        "limit": _check_limit(limit),
        "default_timeout_s": DEFAULT_PUSH_TIMEOUT_S,
        "margin_s": PUSH_LEASE_MARGIN_S,
        "now": now,
    }


def _key_arrays(keys: Sequence[RunKey], tokens: Sequence[Any]) -> dict[str, list[Any]]:
    return {
        "pids": [k.partition_id for k in keys],
        "jids": [k.job_id for k in keys],
        "nominals": [k.nominal_time for k in keys],
        "tokens": [token if isinstance(token, uuid.UUID) else _token(token) for token in tokens],
    }


def _token(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValidationError("token", "must be the lease token (a UUID) the claim returned", value) from None


def _answers(
    conn: psycopg.Connection,
    name: str,
    pairs: Sequence[tuple[str | RunKey, Any]],
    params: dict[str, Any],
    tenant: str | None,
) -> dict[str, str]:
    if not pairs:
        return {}
    if len(pairs) > MAX_BATCH:
        raise ValidationError("runs", f"at most {MAX_BATCH} runs per call", len(pairs))
    keys = [p if isinstance(p, RunKey) else RunKey.parse(p) for p, _ in pairs]  # each run id parsed once
    arrays = _key_arrays(keys, [token for _, token in pairs])
    rows = store.run_statement(
        conn, lambda c: store.execute_probing(c, name, {**arrays, **params, "tenant": tenant}, row_factory=_answer_rows)
    )
    return {keys[i - 1].run_id: answer for i, answer in rows}


def heartbeat(
    conn: psycopg.Connection,
    leases: Sequence[tuple[str | RunKey, uuid.UUID]],
    lease_s: float = DEFAULT_LEASE_S,
    *,
    now: datetime | None = None,
    tenant: str | None = None,
) -> dict[str, str]:
    """Extend the leases of ``(run id or key, token)`` pairs to now + ``lease_s``.

    Returns run id → ``"leased"`` (extended), ``"canceled"`` (the run was
    canceled, e.g. by the overlap policy ``replace``: stop working on it) or
    ``"lost"`` (the token is stale, the run finished, or it does not exist).
    ``tenant`` (None: any) scopes the statement to that tenant's runs: another
    tenant's run answers ``"lost"``, as a missing one (the HTTP API passes its
    key's tenant). Raises ValidationError for a malformed run id or token, or
    more than :data:`MAX_BATCH` pairs.
    """
    return _answers(conn, "heartbeat_runs", leases, {"lease_s": _check_lease(lease_s), "now": now}, tenant)


def ack(
    conn: psycopg.Connection,
    leases: Sequence[tuple[str | RunKey, uuid.UUID]],
    *,
    now: datetime | None = None,
    tenant: str | None = None,
) -> dict[str, str]:
    """Record the attempts of ``(run id or key, token)`` pairs as succeeded
    (``last_error`` cleared: a succeeded run shows no error).

    Returns run id → ``"succeeded"`` (also for an ack re-sent with the
    token that already succeeded), or ``"canceled"`` / ``"lost"``: refused,
    nothing changed (see :func:`heartbeat`, also for ``tenant``). Raises as
    :func:`heartbeat`.
    """
    return _answers(conn, "ack_runs", leases, {"now": now}, tenant)


def nack(
    conn: psycopg.Connection, fails: Sequence[Nack], *, now: datetime | None = None, tenant: str | None = None
) -> dict[str, str]:
    """Record failed attempts; the partition owner's :func:`settle` then retries
    them after a backoff or marks them dead (within about a second).

    Returns run id → ``"failed"`` or ``"canceled"`` / ``"lost"`` (refused).
    ``error`` is kept as ``last_error`` (cut to :data:`MAX_ERROR_LEN`
    characters; NUL and unpaired surrogates, which the store cannot keep,
    replaced by U+FFFD: a diagnostic is never a reason to lose the nack);
    ``tenant`` as in :func:`heartbeat`. Raises ValidationError for a
    negative or non-finite ``retry_after_s`` and as :func:`heartbeat`.
    """
    for fail in fails:
        if fail.retry_after_s is not None and not (
            isinstance(fail.retry_after_s, (int, float)) and 0 <= fail.retry_after_s <= 86_400 * 30
        ):
            raise ValidationError("retry_after_s", "must be a number of seconds from 0 to 30 days", fail.retry_after_s)
    params = {
        "retryables": [f.retryable for f in fails],
        "errors": [None if f.error is None else _storable(f.error[:MAX_ERROR_LEN]) for f in fails],
        "retry_after_s": [f.retry_after_s for f in fails],
        "now": now,
    }
    return _answers(conn, "nack_runs", [(f.run_id, f.token) for f in fails], params, tenant)


def settle(
    conn: psycopg.Connection,
    *,
    node_id: str,
    epochs: dict[int, int],
    limit: int = MAX_BATCH,
    now: datetime | None = None,
) -> SettleResult:
    """The partition owner's step (``settle_runs``): expired leases and failed
    attempts of the partitions in ``epochs`` (partition id → epoch held),
    oldest first, at most ``limit``, go back to pending after a backoff with
    full jitter, or to dead (docs/delivery.md, "Retry policy"). Fenced: a
    partition whose epoch moved is left alone. Call it until it returns
    fewer than ``limit`` runs to drain a backlog."""
    if not epochs:
        return SettleResult()
    params = {
        "node_id": node_id,
        "pids": sorted(epochs),
        "epochs": epochs_literal(epochs),
        "limit": _check_limit(limit),
        "max_attempts": DEFAULT_MAX_ATTEMPTS,
        "backoff_base_s": DEFAULT_BACKOFF_BASE_S,
        "backoff_cap_s": DEFAULT_BACKOFF_CAP_S,
        "max_error_len": MAX_ERROR_LEN,
        "now": now,
    }
    rows = store.run_transaction(conn, lambda c: store.execute(c, "settle_runs", params))
    runs = tuple(
        (RunKey(r["partition_id"], r["job_id"], r["nominal_time"]), r["state"], r["attempt"], r["was"]) for r in rows
    )
    dead_runs = tuple(
        DeadRun(key, r["tenant"], attempt, was, r["last_error"], r["dead_why"])
        for (key, state, attempt, was), r in zip(runs, rows, strict=True)
        if state == "dead"
    )
    return SettleResult(
        expired=sum(1 for r in runs if r[3] == "leased"),
        retried=sum(1 for r in runs if r[1] == "pending"),
        dead=len(dead_runs),
        runs=runs,
        dead_runs=dead_runs,
    )
