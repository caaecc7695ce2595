"""Registering and managing jobs and tenants (the API the CLI and bench use).

Every write validates first (:class:`scheduler.spec.JobSpec`) and runs in one
transaction with the store's clock, retried whole on 40001/40P01; a bad job
raises :class:`~scheduler.errors.ValidationError` and writes nothing.
A job's first slot is the first fire strictly after its creation (store
time); an interval job's slots are ``created_at + k × interval_s``.

Rewrites (``add_job(replace=True)``, :func:`set_paused`, :func:`delete_job`)
never lose a due slot silently. Each keeps the revision it supersedes in
``job_revisions`` (with the store-time interval it was in force, for
``verify``), and:

* an edit that keeps the schedule (kind, expression, dialect, zone,
  interval, one-shot instant; an interval keeps its anchor) keeps the
  pending slot, overdue or not: a policy or jitter change applies to it;
* an edit that changes the schedule, a pause and a delete drop the pending
  slot; if it was due (nominal ≤ the rewrite's store time), the old
  schedule's slots from it up to that time are recorded in ``skips`` with
  reason ``edited``, ``paused`` or ``deleted`` (node ``operator``, epoch 0);
  the new schedule starts strictly after the edit (a resume: after the
  resume).

Delivery (docs/delivery.md, "Targets"): a spec's
:class:`~scheduler.delivery.targets.DeliverySpec` goes to ``jobs.queue`` and
``jobs.overlap`` and, when anything else is not the default, to a
``job_delivery`` row, all in the transaction that writes the job (an edit
back to the defaults deletes the row). Every write path first applies the
save-time SSRF rule to URL targets (``push_policy``, the operator's
``push_allow``; :func:`scheduler.delivery.targets.check_targets`). A
different delivery spec under the same ``--name`` is a conflict like a
different schedule; ``--replace`` edits it (revision bumped, pending slot
kept: delivery is not part of the schedule).

CSV import is idempotent: every line is a named job (a name from the file's
``--name-column``, else one derived from the line's content, see
:func:`import_name`), so importing the same file again finds the jobs it
created and changes nothing. :func:`delete_jobs` soft-deletes a tenant's jobs
in bulk (all, or by name prefix).

The HTTP API writes through :func:`apply_jobs` (``PUT /v1/schedules/{name}``
is one item, ``POST /v1/schedules:apply`` a tenant's whole set): create,
edit in place (as ``--replace``), leave unchanged (nothing written) and,
with ``prune``, delete, all in one transaction, with an optional
precondition on each item's :func:`spec_digest` (``If-Match``) and the
tenant's schedule quota (``tenants.max_schedules``, default
:data:`DEFAULT_MAX_SCHEDULES`) counted under the tenant row's lock, which it
takes before it reads the tenant's jobs (applies of one tenant run one after
the other).
:func:`find_job` and :func:`list_schedules` read a tenant's named jobs; the
per-job functions (:func:`set_paused`, :func:`delete_job`, :func:`get_job`)
take an optional ``tenant`` that scopes the lookup.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import difflib
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from scheduler import store
from scheduler.delivery.ssrf import AddressPolicy
from scheduler.delivery.targets import DeliverySpec, check_targets
from scheduler.errors import CLI_WORDS, ConflictError, NotFoundError, ValidationError, clip
from scheduler.identity import SPEC_COLUMNS, identity_of
from scheduler.partition import partition_of
from scheduler.planner import DEFAULT_MISFIRE, count_slots, scheduled_time
from scheduler.spec import JobSpec, build_schedule, parse_whole, schedule_key, validate_tenant

T = TypeVar("T")

IMPORT_BATCH = 1_000
"""Jobs per transaction in :func:`import_csv`."""

IMPORT_NAME_PREFIX = "import:"
"""Prefix of the names :func:`import_name` derives (``jobs delete --name-prefix import:``)."""

DELETE_BATCH = 1_000
"""Jobs per transaction in :func:`delete_jobs`."""

DEFAULT_MAX_SCHEDULES = 10_000
"""A tenant's schedule quota when its ``tenants.max_schedules`` is NULL (:func:`apply_jobs`)."""

MAX_SCHEDULES_LIMIT = 100_000_000
"""Largest quota ``tenants set --max-schedules`` accepts."""

CORPUS_DIALECTS = {"unix": "unix", "seconds": "seconds", "unix5": "unix", "macro": "unix", "seconds6": "seconds"}
"""CSV ``dialect`` column → our dialect: ours by name, the corpus's own names; any other
value (the corpus's ``other``, ``quartz``) is tried as ``unix``."""


def _store_now(conn: psycopg.Connection) -> datetime:
    return store.now(conn)


SCHEDULE_COLUMNS = ("kind", "cron_expr", "cron_dialect", "tz", "interval_s", "fire_at")
"""The ``jobs`` columns that define which instants are slots (with ``anchor_at``,
which an edit keeps when these are unchanged)."""


def _row_schedule(row: dict):
    """The schedule of a ``jobs`` (or ``job_revisions``) row."""
    return build_schedule(*schedule_key(row))


def _retire(conn: psycopg.Connection, rows: list[dict], now: datetime, reason: str | None) -> None:
    """Keep each row's revision in ``job_revisions`` (in force until ``now``); with a
    ``reason`` (``edited``, ``paused``, ``deleted``) the rewrite drops the pending
    slot, and a row's slots from it through ``now``, if it was due, are recorded
    as one skip range ``[slot, first slot after now)``. Call inside the
    rewrite's transaction, before it, with the rows read FOR UPDATE."""
    if not rows:
        return
    store.execute(
        conn,
        "insert_job_revisions",
        {"pids": [row["partition_id"] for row in rows], "jids": [row["job_id"] for row in rows], "now": now},
    )
    if reason is None:
        return
    for row in rows:
        slot = row["next_nominal_at"]
        if slot is None or slot > now:
            continue
        schedule = _row_schedule(row)
        until = schedule.next_after(now) or now + timedelta(microseconds=1)
        store.execute(
            conn,
            "insert_rewrite_skip",
            {
                "partition_id": row["partition_id"],
                "job_id": row["job_id"],
                "first": slot,
                "until": until,
                "slots": count_slots(schedule, slot, until),
                "reason": reason,
                "now": now,
            },
        )


def _get_for_update(conn: psycopg.Connection, job_id: uuid.UUID, tenant: str | None = None) -> dict:
    """The live ``jobs`` row of ``job_id`` (of ``tenant`` if given), locked; raises
    NotFoundError if unknown, another tenant's or deleted."""
    rows = store.execute(
        conn, "get_job_for_update", {"partition_id": partition_of(job_id), "job_id": job_id, "tenant": tenant}
    )
    if not rows:
        raise NotFoundError(f"job_id: no job {job_id}")
    if rows[0]["deleted_at"] is not None:
        raise NotFoundError(f"job_id: job {job_id} is deleted")
    return rows[0]


def _job_row(spec: JobSpec, job_id: uuid.UUID, now: datetime) -> dict:
    """Insert parameters for a new job created at store time ``now``.

    Raises ValidationError (field ``at``) for a one-shot instant not in the future.
    """
    anchor = now.replace(microsecond=0)  # interval slots on whole seconds
    schedule = spec.schedule(anchor=anchor)
    next_nominal = schedule.next_after(now)
    if next_nominal is None:
        raise ValidationError("at", "must be in the future (store time)", spec.at.isoformat() if spec.at else None)
    return {
        **spec.row_fields(),
        "partition_id": partition_of(job_id),
        "job_id": job_id,
        "anchor_at": anchor if spec.kind == "interval" else None,
        "next_nominal_at": next_nominal,
        "next_due_at": scheduled_time(job_id, next_nominal, spec.jitter_s),
        "created_at": now,
    }


def _write_delivery(conn: psycopg.Connection, items: list[tuple[JobSpec, dict]], *, existing: bool) -> None:
    """Write the ``job_delivery`` rows of ``(spec, job row parameters)`` pairs: one
    per spec whose delivery is not the default; with ``existing`` (the jobs may
    have rows already: an edit) the others' rows are deleted. In the caller's
    transaction. Batched (``executemany``), whatever the number of jobs."""
    upserts = []
    deletes = []
    for spec, row in items:
        key = {"partition_id": row["partition_id"], "job_id": row["job_id"]}
        delivery = spec.delivery.delivery_row()
        if delivery is not None:
            upserts.append({**key, **delivery})
        elif existing:
            deletes.append(key)
    with conn.cursor() as cur:
        if upserts:
            cur.executemany(store.QUERIES["upsert_job_delivery"], upserts)
        if deletes:
            cur.executemany(store.QUERIES["delete_job_delivery"], deletes)


def _check_targets(specs: list[JobSpec], push_policy: AddressPolicy | None) -> None:
    """The save-time SSRF rule for the specs' URL targets (before any transaction)."""
    check_targets((spec.delivery for spec in specs), push_policy or AddressPolicy())


def register_schedules(conn: psycopg.Connection, rows: list[dict[str, Any]]) -> None:
    """Give each job row (insert or replace parameters: a dict with the ``jobs``
    column names of :data:`scheduler.identity.SPEC_COLUMNS`) its ``schedule_key``,
    registering the specs in ``schedules`` (in the caller's transaction).

    A row whose key another spec holds (a hash collision) gets ``None``: it
    shares no plan and is fired per timer. Two statements whatever the
    number of rows: ``register_schedules``, then ``schedules_by_keys`` (read
    back after the insert, so a key a concurrent transaction registered
    first is seen once committed). Raises what the store raises.
    """
    specs: dict[int, tuple[str, dict[str, Any]]] = {}
    identities = []
    for row in rows:
        identity = identity_of(row)
        identities.append(identity)
        specs.setdefault(identity.key, (identity.canonical, row))
    if not specs:
        return
    params: dict[str, list[Any]] = {"schedule_keys": list(specs), "canonicals": [c for c, _ in specs.values()]}
    for column in SPEC_COLUMNS:
        params[column + "s"] = [row[column] for _, row in specs.values()]
    store.execute(conn, "register_schedules", params)
    stored = {
        r["schedule_key"]: r["canonical"]
        for r in store.execute(conn, "schedules_by_keys", {"schedule_keys": list(specs)})
    }
    for row, identity in zip(rows, identities, strict=True):
        row["schedule_key"] = identity.key if stored.get(identity.key) == identity.canonical else None


@dataclasses.dataclass(frozen=True)
class AddResult:
    """``job_id`` and what happened: ``created``, ``exists`` (same spec) or ``replaced``."""

    job_id: uuid.UUID
    outcome: str


def add_job(
    conn: psycopg.Connection, spec: JobSpec, *, replace: bool = False, push_policy: AddressPolicy | None = None
) -> AddResult:
    """Register ``spec`` (a tenant that does not exist yet is created).

    With a name, the call is idempotent: the same name and spec (delivery
    included) return the existing id (``exists``); a different spec raises
    :class:`~scheduler.errors.ConflictError` unless ``replace`` is set, which
    edits the job in place (``replaced``): the pending slot is kept when the
    schedule is unchanged, else the next slot is the new schedule's first
    after now and a due pending slot is recorded as skipped (``edited``; see
    the module doc). A URL target must pass the SSRF rule under
    ``push_policy`` (default: public addresses only), else ValidationError
    (field ``url``) and nothing is written.
    """
    spec = spec.validated()
    _check_targets([spec], push_policy)

    def body(c: psycopg.Connection) -> AddResult:
        now = _store_now(c)
        store.execute(c, "ensure_tenant", {"tenant": spec.tenant})
        if spec.name is not None:
            rows = store.execute(c, "find_job_by_name", {"tenant": spec.tenant, "name": spec.name})
            if rows:
                existing = rows[0]
                key = {"partition_id": existing["partition_id"], "job_id": existing["job_id"]}
                delivery = store.execute(c, "get_job_delivery", key)
                if spec.same_as_row(existing, delivery[0] if delivery else None):
                    return AddResult(existing["job_id"], "exists")
                if not replace:
                    raise ConflictError(f"{_conflict(spec, existing['job_id'])}; pass --replace to change it")
                _replace_job(c, spec, existing, now)
                return AddResult(existing["job_id"], "replaced")
        job_id = uuid.uuid4()
        row = _job_row(spec, job_id, now)
        register_schedules(c, [row])
        store.execute(c, "insert_job", row)
        _write_delivery(c, [(spec, row)], existing=False)
        return AddResult(job_id, "created")

    return _run_named(conn, body)


def _replace_job(c: psycopg.Connection, spec: JobSpec, existing: dict, now: datetime) -> None:
    """Edit the live job ``existing`` (its row, read FOR UPDATE in this transaction)
    to ``spec`` at store time ``now`` (the module doc's rules: the pending slot
    kept when the schedule is unchanged, else the new schedule's first slot
    after now, a due pending slot recorded as skipped ``edited``; revision
    kept in ``job_revisions``). Raises ValidationError (field ``at``) for a
    changed one-shot instant not in the future."""
    job_id = existing["job_id"]
    fields = spec.row_fields()
    if all(fields[column] == existing[column] for column in SCHEDULE_COLUMNS):
        pending = existing["next_nominal_at"]
        params = {
            **fields,
            "partition_id": existing["partition_id"],
            "job_id": job_id,
            "anchor_at": existing["anchor_at"],
            "next_nominal_at": pending,
            "next_due_at": None if pending is None else scheduled_time(job_id, pending, spec.jitter_s),
        }
        _retire(c, [existing], now, None)
    else:
        params = _job_row(spec, job_id, now)
        _retire(c, [existing], now, "edited")
    params["changed_at"] = now
    register_schedules(c, [params])
    store.execute(c, "replace_job_spec", params)
    _write_delivery(c, [(spec, params)], existing=True)


def _conflict(spec: JobSpec, job_id: uuid.UUID) -> str:
    return f"name: job {spec.name!r} of tenant {spec.tenant!r} already exists with a different spec (id {job_id})"


@dataclasses.dataclass
class ImportReport:
    """Outcome of :func:`import_csv`, in line order: ids of the jobs created, ids of
    those that already existed with the same spec (``unchanged``), and
    ``(line, expr, reason)`` per line not imported (invalid, or its name
    taken by a job with a different spec)."""

    created: list[uuid.UUID] = dataclasses.field(default_factory=list)
    unchanged: list[uuid.UUID] = dataclasses.field(default_factory=list)
    rejected: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)

    @property
    def imported(self) -> list[uuid.UUID]:
        """Every job the file's valid lines stand for (created, then unchanged)."""
        return self.created + self.unchanged


def import_name(tenant: str, expr: str, dialect: str, tz: str, occurrence: int) -> str:
    """The stable name of an imported line: ``import:<h>:<k>``.

    ``h`` is the first 16 hex digits of the SHA-256 of ``tenant``, ``expr``
    (stripped), ``dialect`` and ``tz`` (ours: ``unix``/``seconds``, the
    zone with empty read as ``UTC``) joined by U+001F, in UTF-8; ``k`` counts
    the lines of the same content in the file from 1 (two identical lines
    are two jobs). So a line keeps its name whatever its position, lines
    added to a file get new names, and the same schedule imported from two
    files is one job.
    """
    digest = hashlib.sha256("\x1f".join([tenant, expr, dialect, tz]).encode("utf-8")).hexdigest()
    return f"{IMPORT_NAME_PREFIX}{digest[:16]}:{occurrence}"


def corpus_specs(
    path: Path, tenant: str, *, misfire: str = DEFAULT_MISFIRE, name_column: str | None = None
) -> Iterator[tuple[int, str, JobSpec | str]]:
    """Read a corpus-format CSV; yield ``(line_number, expr, JobSpec or reason)``.

    Columns used: ``expr``, ``dialect``, ``timezone`` (empty = UTC), and
    ``name_column`` if given; optional delivery columns (:data:`DELIVERY_COLUMNS`,
    an empty cell is the default): ``queue``, ``url``, ``method``,
    ``headers`` (``Name: value`` lines in one cell), ``timeout_s``,
    ``payload`` (JSON), ``max_attempts``, ``backoff_base_s``,
    ``backoff_cap_s``, ``max_age_s``, ``overlap``, validated as ``jobs add``
    validates its options (a bad value is a bad line). A derived name does
    not cover them: a changed payload under the same schedule is a
    conflict, not a new job. Every spec is named: from ``name_column`` (an
    empty value, or a name already used by an earlier line, is a bad line),
    else :func:`import_name`. A UTF-8 byte order mark (spreadsheet exports)
    is skipped. Line numbers are physical lines of the file (the header is
    line 1). A line that is not valid UTF-8 in those columns, or that the
    CSV reader cannot parse (e.g. a field over the csv module's size limit),
    is reported like any bad line (undecodable bytes appear as ``\\udcXX``),
    never fatal; so is a line with a value no column names (past the
    header's end, or under an empty header cell). Raises ValidationError (field ``file``) without a header
    naming ``expr``, (field ``name_column``) without that column, (field
    ``columns``) for a header naming an unknown column or one twice
    (:func:`_check_columns`), before any line is read.
    """
    occurrences: dict[tuple[str, str, str], int] = {}
    name_lines: dict[str, int] = {}
    with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as handle:
        consumed = 0  # physical lines the reader has taken (it never reads ahead)

        def lines() -> Iterator[str]:
            nonlocal consumed
            for text in handle:
                consumed += 1
                yield text

        reader = csv.DictReader(lines())
        try:
            header = reader.fieldnames
        except csv.Error:
            header = None
        if header is None or "expr" not in header:
            raise ValidationError("file", "must be a CSV with a header row naming an 'expr' column", str(path))
        if name_column == "":
            raise ValidationError("name_column", "must name a column of the header")
        if name_column is not None and name_column not in header:
            raise ValidationError("name_column", f"the CSV header has no column {clip(name_column)}")
        _check_columns(header, name_column)
        unnamed = [i for i, column in enumerate(header) if not column]
        if unnamed:  # a key each, so that a value under any of them is seen
            reader.fieldnames = [column or f"\0{i}" for i, column in enumerate(header)]
        line = consumed
        while True:
            start = line + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                line = consumed
                yield start, "", f"csv: {exc}"
                continue
            line = consumed
            expr = (record.get("expr") or "").strip()
            stray = next((i for i in unnamed if (record.get(f"\0{i}") or "").strip()), None)
            if stray is not None:
                yield start, expr, f"csv: a value under an unnamed column (cell {stray + 1})"
                continue
            beyond = record.get(None) or []  # type: ignore[call-overload]  # DictReader's restkey
            if any(cell.strip() for cell in beyond):
                yield (
                    start,
                    expr,
                    f"csv: more cells than the header names ({len(header) + len(beyond)} > {len(header)})",
                )
                continue
            columns = (
                record.get("expr") or "",
                record.get("dialect") or "",
                record.get("timezone") or "",
                (record.get(name_column) or "") if name_column is not None else "",
            )
            cells = {column: record.get(column) or "" for column in DELIVERY_COLUMNS if column in header}
            if any(_UNDECODABLE.search(value) for value in (*columns, *cells.values())):
                yield start, expr, "encoding: the line is not valid UTF-8"
                continue
            dialect = CORPUS_DIALECTS.get(columns[1].strip(), "unix")
            tz = columns[2].strip() or "UTC"
            if name_column is None:
                key = (expr, dialect, tz)
                occurrences[key] = occurrences.get(key, 0) + 1
                name = import_name(tenant, expr, dialect, tz, occurrences[key])
            else:
                name = columns[3].strip()
                if not name:
                    yield start, expr, f"name: the {clip(name_column)} column is empty"
                    continue
                if name in name_lines:
                    yield start, expr, f"name: {clip(name)} is already used by line {name_lines[name]} of this file"
                    continue
            try:
                spec = JobSpec.build(
                    tenant=tenant,
                    cron=expr,
                    tz=tz,
                    dialect=dialect,
                    misfire=misfire,
                    name=name,
                    delivery=delivery_from_cells(cells),
                )
            except ValidationError as exc:  # named by its CSV column where that differs (timezone, not tz)
                yield start, expr, exc.render(CSV_WORDS, CORPUS_COLUMNS.get(exc.field))
                continue
            name_lines.setdefault(name, start)
            yield start, expr, spec


def _check_columns(header: Sequence[str], name_column: str | None) -> None:
    """Refuse a header naming a column the import does not know, or one column twice.

    A misspelled column (``max_attemps``) would otherwise drop the setting it
    carries without a word, as the API refuses an unknown field. Known:
    :data:`IMPORT_COLUMNS`, ``name_column``, and the corpus format's
    provenance columns :data:`CORPUS_INFO_COLUMNS` (read, not used); a header
    cell left empty (a spreadsheet's trailing comma) names nothing. Raises
    ValidationError (field ``columns``): the rule names the column and the
    column meant (:data:`IMPORT_ALIASES`: ``tz`` is ``timezone``), else the
    nearest known column (``difflib``, ratio ≥ 0.6), else the known columns.
    """
    known = list(dict.fromkeys([*IMPORT_COLUMNS, *([name_column] if name_column is not None else [])]))
    seen: set[str] = set()
    for column in header:
        if column in seen and column:
            raise ValidationError("columns", f"{clip(column)} is named twice")
        seen.add(column)
        if not column or column in known or column in CORPUS_INFO_COLUMNS:
            continue
        if column in IMPORT_ALIASES:
            hint = f"the column is {clip(IMPORT_ALIASES[column])}"
        elif nearest := difflib.get_close_matches(column, known, n=1):
            hint = f"did you mean {clip(nearest[0])}?"
        else:
            hint = (
                f"known: {', '.join(known)}; read, not used: {', '.join(CORPUS_INFO_COLUMNS)}; "
                "a column of job names: give it as --name-column"
            )
        raise ValidationError("columns", f"{clip(column)} is not a known column ({hint})")


CORPUS_INFO_COLUMNS = ("source_kind", "repo", "path")
"""The corpus format's provenance columns (where a schedule was found): known, never used."""

CORPUS_COLUMNS = {"tz": "timezone", "header": "headers"}
"""A job field whose CSV column has another name: a rejected line's reason names the column."""

IMPORT_ALIASES = {**CORPUS_COLUMNS, "cron": "expr"}
"""A ``jobs add`` option's name given as a column → the column the import reads instead."""

CSV_WORDS = {name: CORPUS_COLUMNS.get(name, name) for name in CLI_WORDS} | {"tenants_add": CLI_WORDS["tenants_add"]}
"""The import's words for what a rule names (:data:`~scheduler.errors.CLI_WORDS` has the
flags): the CSV columns (``url``, ``backoff_cap_s``), and the CLI's commands."""

_UNDECODABLE = re.compile("[\udc80-\udcff]")
"""Bytes that did not decode as UTF-8 (``surrogateescape``)."""

DELIVERY_COLUMNS = (
    "queue",
    "url",
    "method",
    "headers",
    "timeout_s",
    "payload",
    "max_attempts",
    "backoff_base_s",
    "backoff_cap_s",
    "max_age_s",
    "overlap",
)
"""Optional CSV columns of a job's delivery (``jobs import``; the ``jobs add`` options' names)."""

IMPORT_COLUMNS = ("expr", "dialect", "timezone", *DELIVERY_COLUMNS)
"""Every column ``jobs import`` reads, but the ``--name-column`` (:func:`corpus_specs`)."""


def delivery_from_cells(cells: dict[str, str]) -> DeliverySpec | None:
    """The :class:`DeliverySpec` of an import line's delivery cells (column → text;
    empty or missing: the default), ``None`` if every cell is empty. ``headers``
    holds ``Name: value`` lines. Raises ValidationError naming the field."""
    given = {column: value.strip() for column, value in cells.items() if value.strip()}
    if not given:
        return None
    headers = given.pop("headers", None)
    return DeliverySpec.build(
        **given, headers=None if headers is None else [line for line in re.split(r"\r?\n", headers) if line.strip()]
    )


def import_csv(
    conn: psycopg.Connection,
    path: Path,
    tenant: str,
    *,
    misfire: str = DEFAULT_MISFIRE,
    name_column: str | None = None,
    batch_size: int = IMPORT_BATCH,
    push_policy: AddressPolicy | None = None,
) -> ImportReport:
    """Import every valid line of a corpus-format CSV for ``tenant``; idempotent.

    Each line is a named job (:func:`corpus_specs`): a name not yet taken
    creates the job, a name whose job has the same spec leaves it
    ``unchanged``, a name whose job differs is reported as rejected (nothing
    is replaced). Invalid lines are reported, never fatal. Lines go to the
    store in batches of ``batch_size`` per transaction (:func:`import_jobs`:
    one lookup and one insert batch each). Raises ValidationError for a bad
    tenant, a file without an ``expr`` header or without ``name_column``, or
    whose header names an unknown column or one twice (nothing written);
    OSError if unreadable. A line whose URL target fails the SSRF rule
    under ``push_policy`` (each distinct URL resolved once) is rejected.
    """
    validate_tenant(tenant)
    report = ImportReport()
    batch: list[tuple[int, str, JobSpec]] = []

    def flush() -> None:
        if batch:
            outcomes = _insert_named(conn, [spec for _, _, spec in batch])
            for (line, expr, _), (outcome, value) in zip(batch, outcomes, strict=False):
                if outcome == "created":
                    report.created.append(value)
                elif outcome == "unchanged":
                    report.unchanged.append(value)
                else:
                    report.rejected.append((line, expr, value))
            batch.clear()

    refused: dict[str, str | None] = {}  # url -> reason (None: allowed)
    for line, expr, item in corpus_specs(path, tenant, misfire=misfire, name_column=name_column):
        url = None if isinstance(item, str) else item.delivery.url
        if url is not None:
            if url not in refused:
                try:
                    _check_targets([item], push_policy)  # type: ignore[list-item]
                    refused[url] = None
                except ValidationError as exc:
                    refused[url] = str(exc)
            item = refused[url] or item
        if isinstance(item, str):
            report.rejected.append((line, expr, item))
            continue
        batch.append((line, expr, item))
        if len(batch) >= batch_size:
            flush()
    flush()
    report.rejected.sort()
    return report


def import_jobs(
    conn: psycopg.Connection, specs: Iterable[JobSpec], *, push_policy: AddressPolicy | None = None
) -> list[tuple[str, Any]]:
    """Create named jobs that do not exist yet, in one transaction; set-based.

    Every spec must have a name, unique within ``specs`` per tenant. Returns,
    in order, ``("created", job_id)``, ``("unchanged", job_id)`` (a live job
    of that tenant and name has this spec, delivery included) or
    ``("conflict", reason)`` (it has another spec; left as it is). One
    lookup of the existing names, one of their delivery rows, and batched
    inserts, whatever the number of specs; retried whole on 40001/40P01, and
    once more if a concurrent import created one of the names first. Raises
    ValidationError (nothing written) if a spec is invalid or a URL target
    fails the SSRF rule under ``push_policy``.
    """
    specs = [spec.validated() for spec in specs]
    if any(spec.name is None for spec in specs):
        raise ValidationError("name", "every imported job needs a name")
    _check_targets(specs, push_policy)
    return _insert_named(conn, specs)


def _insert_named(conn: psycopg.Connection, specs: list[JobSpec]) -> list[tuple[str, Any]]:
    """:func:`import_jobs` for validated, SSRF-checked specs."""

    def body(c: psycopg.Connection) -> list[tuple[str, Any]]:
        now = _store_now(c)
        store.execute(c, "ensure_tenants", {"tenants": sorted({spec.tenant for spec in specs})})
        existing = {
            (row["tenant"], row["name"]): row
            for row in store.execute(
                c,
                "find_jobs_by_names",
                {"tenants": [spec.tenant for spec in specs], "names": [spec.name for spec in specs]},
            )
        }
        deliveries = _deliveries(c, list(existing.values()))
        outcomes: list[tuple[str, Any]] = []
        rows = []
        created: list[tuple[JobSpec, dict]] = []
        for spec in specs:
            row = existing.get((spec.tenant, spec.name))
            if row is None:
                job_id = uuid.uuid4()
                rows.append(_job_row(spec, job_id, now))
                created.append((spec, rows[-1]))
                outcomes.append(("created", job_id))
            elif spec.same_as_row(row, deliveries.get(row["job_id"])):
                outcomes.append(("unchanged", row["job_id"]))
            else:
                outcomes.append(("conflict", _conflict(spec, row["job_id"])))
        if rows:
            register_schedules(c, rows)
            with c.cursor() as cur:
                cur.executemany(store.QUERIES["insert_job"], rows)
            _write_delivery(c, created, existing=False)
        return outcomes

    return _run_named(conn, body)


def _deliveries(conn: psycopg.Connection, rows: list[dict]) -> dict[uuid.UUID, dict]:
    """``job_id`` → ``job_delivery`` row of the given job rows that have one (one read)."""
    if not rows:
        return {}
    found = store.execute(
        conn,
        "job_deliveries_by_keys",
        {"pids": [row["partition_id"] for row in rows], "jids": [row["job_id"] for row in rows]},
    )
    return {row["job_id"]: row for row in found}


def _run_named(conn: psycopg.Connection, body: Callable[[psycopg.Connection], T]) -> T:
    """``store.run_transaction(conn, body)``, run once more after a unique violation
    (a concurrent writer created one of the names first: the retry finds it)."""
    for attempt in range(2):
        try:
            return store.run_transaction(conn, body)
        except psycopg.errors.UniqueViolation:
            if attempt:  # a concurrent writer of the same names won twice: give up
                raise
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- declarative writes (the API)


def spec_fields(spec: JobSpec) -> dict[str, Any]:
    """A spec as the API shows it, field by field (every field but the tenant; the
    names of the ``jobs add`` options with their unit): ``name``, ``kind``,
    ``cron``, ``tz``, ``dialect``, ``interval_s``, ``at``, ``misfire``,
    ``catchup_window_s``, ``misfire_grace_s``, ``jitter_s``, and the delivery's
    ``queue``, ``url``, ``method``, ``headers`` (``(name, value)`` pairs),
    ``timeout_s``, ``payload`` (JSON text or None), ``max_attempts``,
    ``backoff_base_s``, ``backoff_cap_s``, ``max_age_s``, ``overlap``."""
    d = spec.delivery
    return {
        "name": spec.name,
        "kind": spec.kind,
        "cron": spec.cron,
        "tz": spec.tz,
        "dialect": spec.dialect,
        "interval_s": spec.interval_s,
        "at": spec.at,
        "misfire": spec.misfire,
        "catchup_window_s": spec.catchup_window_s,
        "misfire_grace_s": spec.misfire_grace_s,
        "jitter_s": spec.jitter_s,
        **{field: getattr(d, field) for field in DELIVERY_FIELDS},
    }


DELIVERY_FIELDS = tuple(field.name for field in dataclasses.fields(DeliverySpec))
"""The fields of :class:`DeliverySpec`, in order (:func:`spec_fields`)."""


def spec_digest(spec: JobSpec) -> str:
    """A strong entity tag of a spec: ``"<32 hex digits>"`` (quotes included), the
    first 128 bits of the SHA-256 of its normalized :func:`spec_fields` (header
    values included; instants in UTC, numbers as values, so ``1e2`` and ``100``
    in a payload, or ``at`` given with another offset, are the same spec). A
    spec read back from the store (:meth:`JobSpec.from_rows`) has the digest of
    the spec that was saved."""
    from scheduler.delivery.targets import _json_key

    normalized = spec_fields(spec)
    normalized.update(
        at=None if spec.at is None else clip(spec.at),
        headers=[list(pair) for pair in spec.delivery.headers],
        payload=None if spec.delivery.payload is None else _json_key(spec.delivery.payload),
    )
    for field in ("timeout_s", "backoff_base_s", "backoff_cap_s"):
        normalized[field] = None if normalized[field] is None else float(normalized[field])
    text = json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return '"' + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32] + '"'


Precondition = Callable[[str, "str | None"], None]
"""``(name, current digest or None if absent)``: raises to refuse the write (:func:`apply_jobs`)."""


@dataclasses.dataclass
class ApplyReport:
    """What :func:`apply_jobs` did (``dry_run``: would do), names in the order of
    the items (``deleted``: by name). ``stored``: name → ``(jobs row,
    job_delivery row or None)`` of every item as stored after the write (not
    for a dry run), read in its transaction."""

    created: list[str] = dataclasses.field(default_factory=list)
    changed: list[str] = dataclasses.field(default_factory=list)
    unchanged: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)
    dry_run: bool = False
    stored: dict[str, tuple[dict, dict | None]] = dataclasses.field(default_factory=dict)


def apply_jobs(
    conn: psycopg.Connection,
    tenant: str,
    specs: list[JobSpec],
    *,
    prune: bool = False,
    allow_empty: bool = False,
    dry_run: bool = False,
    precondition: Precondition | None = None,
    default_max_schedules: int = DEFAULT_MAX_SCHEDULES,
    push_policy: AddressPolicy | None = None,
) -> ApplyReport:
    """Make ``tenant``'s named jobs match ``specs`` (named, all of ``tenant``,
    names unique), in ONE transaction: a name not taken is created, a name whose
    job has another spec is edited in place (as ``add_job(replace=True)``), one
    with the same spec is left as it is (nothing written: no revision); with
    ``prune``, every other live named job of the tenant is deleted (as
    :func:`delete_job`; unnamed jobs are left alone, but named ones are
    deleted however they were made: ``jobs add --name``, every
    ``jobs import`` line). ``prune`` with no ``specs`` would delete every
    named job of the tenant, so it is refused (ValidationError, field
    ``items``) unless ``allow_empty``. ``dry_run``: the same checks, nothing
    written.

    Applies of one tenant are serialized: the transaction locks the tenant
    row before it reads any of the tenant's jobs, so two concurrent applies
    (with ``prune`` or not) act as one after the other. At SERIALIZABLE the
    snapshot predates the lock, so the second of two overlapping applies
    fails with 40001 instead and is retried whole: the retry reads the
    first one's outcome.

    ``precondition(name, digest)`` runs for each spec inside the transaction,
    after the job of that name is locked (``digest``: :func:`spec_digest` of
    its stored spec, ``None`` if there is none); whatever it raises aborts
    everything. The tenant's quota (``tenants.max_schedules``, NULL:
    ``default_max_schedules``) is checked in the transaction when it creates
    jobs, with the tenant row locked: if its live jobs (named or not) after
    the write would exceed the quota, ValidationError (field
    ``max_schedules``), nothing written. Raises ValidationError, nothing
    written, for an invalid spec (field ``items[i].<field>`` is the caller's
    to add), a spec of another tenant, an unnamed or repeated name, a one-shot
    instant not in the future, or a URL target refused by the SSRF rule under
    ``push_policy``.
    """
    validate_tenant(tenant)
    if prune and not specs and not allow_empty:
        raise ValidationError(
            "items", "must not be empty with prune (it would delete every named schedule) unless allow_empty is set"
        )
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        with _item(index):
            spec.validated()
            if spec.tenant != tenant:
                raise ValidationError("tenant", f"every spec must be of tenant {clip(tenant)}", spec.tenant)
            if spec.name is None:
                raise ValidationError("name", "every applied job needs a name")
            if spec.name in seen:
                raise ValidationError("name", "is given twice", spec.name)
            seen.add(spec.name)
            _check_targets([spec], push_policy)
    names = [spec.name for spec in specs]
    index_of = {spec.name: index for index, spec in enumerate(specs)}

    def body(c: psycopg.Connection) -> ApplyReport:
        now = _store_now(c)
        report = ApplyReport(dry_run=dry_run)
        store.execute(c, "ensure_tenant", {"tenant": tenant})
        # First the tenant row's lock, then every read of its jobs: a concurrent apply
        # of the tenant has committed (and is seen) or waits for this one.
        quota = store.execute(c, "lock_tenant_quota", {"tenant": tenant})[0]["max_schedules"]
        existing = {
            row["name"]: row
            for row in store.execute(c, "find_jobs_by_names", {"tenants": [tenant] * len(names), "names": names})
        }
        deliveries = _deliveries(c, list(existing.values()))
        changed: list[tuple[JobSpec, dict]] = []
        created: list[JobSpec] = []
        for spec in specs:
            row = existing.get(spec.name)  # type: ignore[arg-type]
            stored = None if row is None else JobSpec.from_rows(row, deliveries.get(row["job_id"]))
            if precondition is not None:
                precondition(spec.name, None if stored is None else spec_digest(stored))  # type: ignore[arg-type]
            if row is None:
                created.append(spec)
                report.created.append(spec.name)  # type: ignore[arg-type]
            elif spec.same_as_row(row, deliveries.get(row["job_id"])):
                report.unchanged.append(spec.name)  # type: ignore[arg-type]
            else:
                changed.append((spec, row))
                report.changed.append(spec.name)  # type: ignore[arg-type]
        pruned = store.execute(c, "jobs_of_tenant_except", {"tenant": tenant, "names": names}) if prune else []
        report.deleted = sorted(row["name"] for row in pruned)
        if created:
            _check_quota(c, tenant, len(created) - len(pruned), default_max_schedules if quota is None else quota)
        new_rows = []
        for spec in created:
            with _item(index_of[spec.name]):
                new_rows.append(_job_row(spec, uuid.uuid4(), now))  # refuses a past one-shot
        for spec, row in changed:
            if not all(spec.row_fields()[column] == row[column] for column in SCHEDULE_COLUMNS):
                with _item(index_of[spec.name]):
                    _job_row(spec, row["job_id"], now)  # the same check for an edited schedule
        if dry_run:
            return report
        if new_rows:
            register_schedules(c, new_rows)
            with c.cursor() as cur:
                cur.executemany(store.QUERIES["insert_job"], new_rows)
            _write_delivery(c, list(zip(created, new_rows, strict=True)), existing=False)
        for spec, row in changed:
            _replace_job(c, spec, row, now)
        if pruned:
            _retire(c, pruned, now, "deleted")
            store.execute(
                c,
                "delete_jobs_by_keys",
                {
                    "pids": [row["partition_id"] for row in pruned],
                    "jids": [row["job_id"] for row in pruned],
                    "changed_at": now,
                },
            )
        rows = store.execute(c, "find_jobs_by_names", {"tenants": [tenant] * len(names), "names": names})
        stored_deliveries = _deliveries(c, rows)
        report.stored = {row["name"]: (row, stored_deliveries.get(row["job_id"])) for row in rows}
        return report

    return _run_named(conn, body)


@contextlib.contextmanager
def _item(index: int) -> Iterator[None]:
    """Tag a ValidationError raised inside with the batch item ``index`` (``item``)."""
    try:
        yield
    except ValidationError as exc:
        exc.item = index
        raise


def _check_quota(c: psycopg.Connection, tenant: str, added: int, quota: int) -> None:
    """Refuse (ValidationError, field ``max_schedules``) a write adding ``added``
    live named jobs (net) to ``tenant`` beyond ``quota``; the caller holds the
    tenant row's lock. Unnamed jobs (the operator's ``jobs add`` without a
    name) do not count: the count reads ``jobs_tenant_name_idx`` only, at most
    quota + 1 entries."""
    # Counted up to quota + 1 only: the check costs O(min(jobs, quota)), not O(jobs).
    live = store.execute(c, "count_named_jobs_of_tenant_upto", {"tenant": tenant, "limit": quota + 1})[0]["n"]
    if live + added > quota:
        has = f"it has {live} and this request would make {live + added}"
        if live > quota:  # the quota was lowered below what the tenant has
            has = f"it has more than {quota} and this request would add {added}"
        raise ValidationError("max_schedules", f"tenant {clip(tenant)} may have at most {quota} schedules; {has}")


def find_job(conn: psycopg.Connection, tenant: str, name: str) -> dict:
    """The live job ``name`` of ``tenant`` (its ``jobs`` row); raises NotFoundError
    (the same message whether the name is unknown or another tenant's)."""
    rows = store.execute(conn, "get_job_by_name", {"tenant": tenant, "name": name})
    if not rows:
        raise NotFoundError(f"name: no schedule {clip(name)}")
    return rows[0]


def add_jobs(
    conn: psycopg.Connection, specs: Iterable[JobSpec], *, push_policy: AddressPolicy | None = None
) -> list[uuid.UUID]:
    """Insert unnamed jobs (with their delivery rows) in one transaction; return their ids in order.

    Raises ValidationError (nothing written) if any spec is invalid, cannot
    fire (e.g. a one-shot in the past), or has a URL target that fails the
    SSRF rule under ``push_policy``.
    """
    specs = [spec.validated() for spec in specs]
    _check_targets(specs, push_policy)
    ids = [uuid.uuid4() for _ in specs]

    def body(c: psycopg.Connection) -> list[uuid.UUID]:
        now = _store_now(c)
        rows = [_job_row(spec, job_id, now) for spec, job_id in zip(specs, ids, strict=False)]
        store.execute(c, "ensure_tenants", {"tenants": sorted({spec.tenant for spec in specs})})
        register_schedules(c, rows)
        with c.cursor() as cur:
            cur.executemany(store.QUERIES["insert_job"], rows)
        _write_delivery(c, list(zip(specs, rows, strict=True)), existing=False)
        return ids

    return store.run_transaction(conn, body)


def get_job(conn: psycopg.Connection, job_id: uuid.UUID, tenant: str | None = None) -> dict:
    """The ``jobs`` row of ``job_id`` (only if it is ``tenant``'s, when given); raises NotFoundError."""
    rows = store.execute(conn, "get_job", {"partition_id": partition_of(job_id), "job_id": job_id, "tenant": tenant})
    if not rows:
        raise NotFoundError(f"job_id: no job {job_id}")
    return rows[0]


def get_delivery(conn: psycopg.Connection, job: dict) -> DeliverySpec:
    """The delivery spec of a ``jobs`` row (:func:`get_job`): its columns and its
    ``job_delivery`` row, if any."""
    rows = store.execute(conn, "get_job_delivery", {"partition_id": job["partition_id"], "job_id": job["job_id"]})
    return DeliverySpec.from_rows(job, rows[0] if rows else None)


def get_delivery_row(conn: psycopg.Connection, job: dict) -> dict | None:
    """The ``job_delivery`` row of a ``jobs`` row, ``None`` if it has none (the defaults)."""
    rows = store.execute(conn, "get_job_delivery", {"partition_id": job["partition_id"], "job_id": job["job_id"]})
    return rows[0] if rows else None


DELIVERY_ROW_COLUMNS = tuple(field for field in DELIVERY_FIELDS if field not in ("queue", "overlap"))
"""The ``job_delivery`` columns :func:`list_schedules` joins to each row (the delivery
fields but those on the ``jobs`` row)."""


def list_schedules(
    conn: psycopg.Connection,
    tenant: str,
    *,
    after: str | None = None,
    limit: int = 100,
    paused: bool | None = None,
    kind: str | None = None,
    queue: str | None = None,
    name_prefix: str | None = None,
) -> list[dict]:
    """One page of ``tenant``'s live named jobs, by name, the first ``limit`` after
    the name ``after`` (None: from the start), each a ``jobs`` row with its
    ``job_delivery`` columns joined (:func:`delivery_columns` splits them off);
    ``paused``, ``kind``, ``queue`` and ``name_prefix`` (taken literally) filter
    when not None. One statement (``list_schedules``)."""
    return store.execute(
        conn,
        "list_schedules",
        {
            "tenant": tenant,
            "after": after,
            "limit": limit,
            "paused": paused,
            "kind": kind,
            "queue": queue,
            "name_prefix": name_prefix,
        },
    )


def delivery_columns(row: dict) -> dict | None:
    """The ``job_delivery`` row joined to a :func:`list_schedules` row (None: it has none)."""
    return {column: row[column] for column in DELIVERY_ROW_COLUMNS} if row["has_delivery"] else None


def list_jobs(conn: psycopg.Connection, tenant: str | None = None, limit: int = 1000) -> list[dict]:
    """Live (not deleted) jobs, by tenant then creation time.

    Raises NotFoundError if ``tenant`` is given and does not exist (a
    tenant without jobs lists as empty).
    """
    rows = store.execute(conn, "list_jobs", {"tenant": tenant, "limit": limit})
    if tenant is not None and not rows:
        _require_tenant(conn, tenant)
    return rows


def _require_tenant(conn: psycopg.Connection, tenant: str) -> None:
    if not store.execute(conn, "tenant_exists", {"tenant": tenant}):
        raise NotFoundError(f"tenant: no tenant {clip(tenant)}")


def set_paused(conn: psycopg.Connection, job_id: uuid.UUID, paused: bool, *, tenant: str | None = None) -> None:
    """Pause (no slot fires while paused) or resume (next slot strictly after now).

    Pausing drops the pending slot; if it was due, it and the slots through
    now are recorded as skipped (``paused``). Slots that pass while paused are
    not expected at all. Pausing a paused job or resuming a running one
    changes nothing (a running job keeps its next slot, overdue or not).
    With ``tenant``, only that tenant's job is found. Raises NotFoundError
    for an unknown, another tenant's or deleted job.
    """
    store.run_transaction(conn, lambda c: set_paused_in(c, job_id, paused, _store_now(c), tenant=tenant))


def set_paused_in(
    c: psycopg.Connection, job_id: uuid.UUID, paused: bool, now: datetime, *, tenant: str | None = None
) -> dict:
    """:func:`set_paused` inside the caller's transaction at store time ``now``;
    returns the job's row as it was before (locked), whether or not it changed."""
    row = _get_for_update(c, job_id, tenant)
    if row["paused"] == paused:
        return row
    next_nominal = next_due = None
    if not paused:
        next_nominal = _row_schedule(row).next_after(now)
        if next_nominal is not None:
            next_due = scheduled_time(job_id, next_nominal, row["jitter_s"])
    _retire(c, [row], now, "paused" if paused else None)
    store.execute(
        c,
        "set_job_paused",
        {
            "partition_id": row["partition_id"],
            "job_id": job_id,
            "paused": paused,
            "next_nominal_at": next_nominal,
            "next_due_at": next_due,
            "changed_at": now,
        },
    )
    return row


def delete_job(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    *,
    tenant: str | None = None,
    precondition: Precondition | None = None,
) -> None:
    """Delete a job (soft: it stops firing at once; its runs stay). A due pending
    slot is recorded as skipped (``deleted``). With ``tenant``, only that
    tenant's job is found. ``precondition(name, digest)`` (as
    :func:`apply_jobs` calls it; the digest of the job's stored spec) runs
    with the row locked, before anything is written; what it raises aborts
    the delete. Raises NotFoundError."""

    def body(c: psycopg.Connection) -> None:
        now = _store_now(c)
        try:
            row = _get_for_update(c, job_id, tenant)
        except NotFoundError:
            raise NotFoundError(f"job_id: no job {job_id}") from None
        if precondition is not None:
            precondition(row["name"], spec_digest(JobSpec.from_rows(row, get_delivery_row(c, row))))
        _retire(c, [row], now, "deleted")
        store.execute(c, "delete_job", {"partition_id": row["partition_id"], "job_id": job_id, "changed_at": now})

    store.run_transaction(conn, body)


def _check_prefix(name_prefix: str | None) -> None:
    if name_prefix is not None and not name_prefix:
        raise ValidationError("name_prefix", "must not be empty (to delete every job of the tenant, use --all)")


def count_jobs(conn: psycopg.Connection, tenant: str, *, name_prefix: str | None = None) -> int:
    """Live jobs of ``tenant`` (those whose name starts with ``name_prefix`` if given):
    what :func:`delete_jobs` would delete now. Raises NotFoundError for an unknown tenant,
    ValidationError for a bad tenant or an empty prefix."""
    validate_tenant(tenant)
    _check_prefix(name_prefix)
    _require_tenant(conn, tenant)
    return store.execute(conn, "count_jobs_of_tenant", {"tenant": tenant, "name_prefix": name_prefix})[0]["n"]


def delete_jobs(conn: psycopg.Connection, tenant: str, *, name_prefix: str | None = None) -> int:
    """Soft-delete every live job of ``tenant``, or those whose name starts with
    ``name_prefix`` (taken literally: ``%`` and ``_`` are characters); return how many.

    The delete of :func:`delete_job` (the jobs stop firing at once, rows and
    runs stay until pruned; revisions kept, due slots recorded as skipped
    ``deleted``), set-based: one statement per batch of
    :data:`DELETE_BATCH` jobs, each batch its own transaction (retried whole
    on 40001/40P01), so an interrupted call leaves whole batches deleted and
    a second call finishes. Raises NotFoundError for an unknown tenant,
    ValidationError for a bad tenant or an empty prefix.
    """
    validate_tenant(tenant)
    _check_prefix(name_prefix)
    _require_tenant(conn, tenant)
    limit = DELETE_BATCH

    def body(c: psycopg.Connection) -> int:
        now = _store_now(c)
        rows = store.execute(c, "jobs_of_tenant_page", {"tenant": tenant, "name_prefix": name_prefix, "limit": limit})
        _retire(c, rows, now, "deleted")
        store.execute(
            c,
            "delete_jobs_by_keys",
            {"pids": [row["partition_id"] for row in rows], "jids": [row["job_id"] for row in rows], "changed_at": now},
        )
        return len(rows)

    total = 0
    while True:
        deleted = store.run_transaction(conn, body)
        total += deleted
        if deleted < limit:
            return total


def add_tenant(conn: psycopg.Connection, tenant: str, weight: int = 1, max_rate: float | None = None) -> bool:
    """Create a tenant; return False if it already existed (nothing changed)."""
    validate_tenant(tenant)
    _check_weight_rate(weight, max_rate)
    rows = store.run_transaction(
        conn, lambda c: store.execute(c, "insert_tenant", {"tenant": tenant, "weight": weight, "max_rate": max_rate})
    )
    return bool(rows)


def set_tenant(
    conn: psycopg.Connection,
    tenant: str,
    *,
    weight: int | None = None,
    max_rate: float | None = None,
    clear_max_rate: bool = False,
    max_schedules: int | None = None,
    clear_max_schedules: bool = False,
) -> dict:
    """Change a tenant's weight, fleet-wide rate cap and/or schedule quota
    (``max_schedules``: live jobs the API's ``PUT`` and ``apply`` may leave it
    with, 0 to :data:`MAX_SCHEDULES_LIMIT`; ``clear_max_schedules``: back to
    the default, :data:`DEFAULT_MAX_SCHEDULES`). Returns the row (tenant,
    weight, max_rate, max_schedules). Raises NotFoundError, ValidationError
    naming the field."""
    validate_tenant(tenant)
    _check_weight_rate(weight, max_rate)
    if max_schedules is not None:
        max_schedules = parse_whole(
            "max_schedules",
            max_schedules,
            minimum=0,
            maximum=MAX_SCHEDULES_LIMIT,
            rule=f"must be a whole number from 0 to {MAX_SCHEDULES_LIMIT} in ASCII digits",
        )
    rows = store.run_transaction(
        conn,
        lambda c: store.execute(
            c,
            "update_tenant",
            {
                "tenant": tenant,
                "weight": weight,
                "max_rate": max_rate,
                "clear_max_rate": clear_max_rate,
                "max_schedules": max_schedules,
                "clear_max_schedules": clear_max_schedules,
            },
        ),
    )
    if not rows:
        raise NotFoundError(f"tenant: no tenant {tenant!r}")
    return rows[0]


MAX_TENANT_RATE = 1e9
"""Largest tenant rate cap accepted (runs/s, fleet-wide): far above what a fleet fires (a node
fires ~50,000 runs/s), so any useful cap fits, and small enough that a node's share of it and
its token bucket stay ordinary numbers (1e308 overflowed the firer's arithmetic)."""


def _check_weight_rate(weight: int | None, max_rate: float | None) -> None:
    if weight is not None and not (isinstance(weight, int) and 1 <= weight <= 1000):
        raise ValidationError("weight", "must be a whole number from 1 to 1000", weight)
    if max_rate is not None and not (
        isinstance(max_rate, (int, float)) and not isinstance(max_rate, bool) and 0 < max_rate <= MAX_TENANT_RATE
    ):
        raise ValidationError(
            "max_rate", f"must be a number of runs per second > 0 and <= {MAX_TENANT_RATE:.0f}", max_rate
        )


def list_tenants(conn: psycopg.Connection) -> list[dict]:
    """All tenants with their weight, cap and live job count."""
    return store.execute(conn, "list_tenants")


def list_runs(
    conn: psycopg.Connection,
    job_id: uuid.UUID | None = None,
    since: datetime | None = None,
    limit: int = 100,
    *,
    state: str | None = None,
    tenant: str | None = None,
    until: datetime | None = None,
) -> list[dict]:
    """Runs, newest nominal time first, optionally of one job, with a nominal time at or
    after ``since`` and before ``until``, in one delivery ``state`` (pending, leased,
    failed, succeeded, dead, canceled) and/or of one ``tenant``. Rows as ``runs`` columns
    plus ``lateness_s`` (fired − scheduled, seconds) and ``job_name`` (the job's name when
    the run was created, None for a job without one; a run from before revision 0035:
    the job's current name). Raises ValidationError
    (``until``) if both bounds are given and ``until`` is not later than ``since``;
    NotFoundError if ``tenant`` or ``job_id`` is given, does not exist (a job deleted
    but not yet pruned exists) and nothing matched."""
    if since is not None and until is not None and until <= since:
        raise ValidationError("until", "must be later than since", until)
    rows = store.execute(
        conn,
        "list_runs",
        {
            "job_id": job_id,
            "partition_id": partition_of(job_id) if job_id else None,
            "since": since,
            "until": until,
            "limit": limit,
            "state": state,
            "tenant": tenant,
        },
    )
    if tenant is not None and not rows:
        _require_tenant(conn, tenant)
    if job_id is not None and not rows:
        get_job(conn, job_id)
    return rows
