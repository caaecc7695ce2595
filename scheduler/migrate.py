"""Schema migrations through alembic's API (``scheduler db upgrade``).

The migration scripts live in the repository's top-level ``alembic/`` (with
``alembic.ini`` beside it, for alembic's own CLI); a wheel carries a copy as
``scheduler/migrations`` (setup.py's build step). :func:`script_location`
finds them in either place: an installed wheel or a checkout (an editable
install runs the checkout's). Each revision runs in
its own transaction and uses ``IF NOT EXISTS`` so an interrupted upgrade can
be re-run (docs/design.md §7).

The DSN is any libpq accepts: a URI or keywords (``host=... dbname=...``),
several hosts tried in turn (``h1:p1,h2:p2``, ``?host=h1,h2&port=p1,p2``,
``host=h1,h2 port=p1,p2``) with ``target_session_attrs``; libpq opens the
migrations' connections from it as written
(:func:`scheduler.store.sqlalchemy_engine`). Its password, in every
spelling, never appears in an error. Errors, as for every command that uses the store
(CLI exit status 2 or 1):

* :class:`~scheduler.errors.ValidationError` (field ``revision``): the
  request was wrong: an unknown target revision, a downgrade target above the
  store's revision or an upgrade target below it, any target alembic refuses;
* :class:`~scheduler.errors.ConfigError`: a malformed DSN
  (:func:`scheduler.store.check_dsn`), or its subclass
  :class:`~scheduler.errors.StoreSetupError`: authentication refused, the
  database absent (:func:`scheduler.store.open_usable`);
* :class:`~scheduler.errors.StoreError`: the store unreachable, or a
  migration that failed in the store.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from alembic import command
from scheduler import log, store
from scheduler.errors import StoreError, ValidationError
from scheduler.store import check_dsn, first_line, redact_dsn, redact_text, secret_spellings

PACKAGED = Path(__file__).resolve().parent / "migrations"
"""The migration scripts inside an installed wheel."""
CHECKOUT = Path(__file__).resolve().parent.parent / "alembic"
"""The migration scripts of a checkout (an editable install)."""

JOBS_REVISION = "0005"
"""The revision that creates the ``jobs`` table (a downgrade below it drops every job)."""

_RELATIVE = re.compile(r"(\w*)[+-]\d+")


def script_location() -> Path | None:
    """The directory of the migration scripts (``env.py``, ``versions/``), or None if not installed.

    The wheel's ``scheduler/migrations`` first, else the checkout's
    ``alembic/`` (a wheel's site-packages has no such sibling of
    ``scheduler``; its ``alembic`` there is the library, without ``env.py``).
    """
    for location in (PACKAGED, CHECKOUT):
        if (location / "env.py").is_file() and (location / "versions").is_dir():
            return location
    return None


def alembic_config(dsn: str) -> Config:
    """An alembic Config for ``dsn`` (no ini file: the script location and the DSN are set here).

    The DSN goes into the ``sqlalchemy.url`` option as written (``alembic/env.py``
    reads it as a libpq DSN). Raises ConfigError for a DSN
    :func:`~scheduler.store.check_dsn` refuses, StoreError if the migration
    scripts are not installed.
    """
    check_dsn(dsn)
    location = script_location()
    if location is None:
        raise StoreError(
            f"migration scripts not found (neither {PACKAGED} nor {CHECKOUT}): install the "
            "project from a wheel or a checkout (`pip install -e .`)"
        )
    config = Config()
    config.set_main_option("script_location", str(location))
    config.set_main_option("sqlalchemy.url", dsn.replace("%", "%%"))  # ConfigParser interpolates '%'
    return config


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("postgresql://unused@localhost/unused"))


def _check_revision(script: ScriptDirectory, revision: str) -> str | None:
    """The id ``revision`` names (``None``: base, or a relative/symbolic target left to alembic).

    Raises ValidationError (field ``revision``) if no revision of this
    version has that name.
    """
    if revision in ("head", "heads", "base") or _RELATIVE.fullmatch(revision):
        return None
    try:
        found = script.get_revision(revision)
    except CommandError:
        raise ValidationError(
            "revision",
            f"unknown revision (this version knows base..{script.get_current_head()}; "
            "`scheduler db current` shows the store's)",
            revision,
        ) from None
    return None if found is None else found.revision


def head_revision() -> str:
    """The newest revision this version of the code knows (e.g. ``"0014"``)."""
    head = _script().get_current_head()
    assert head is not None
    return head


def is_known(revision: str) -> bool:
    """True if this version of the code has ``revision`` (a store migrated by a newer one may not)."""
    return _known(_script(), revision)


def _connect(dsn: str) -> psycopg.Connection:
    """A session on the store whose errors are classified as every command's
    (:func:`scheduler.store.open_usable`; the schema is not checked: it is what migrations change)."""
    return store.open_usable(lambda: store.connect(dsn, application_name="scheduler-migrate"), dsn, schema=False)


def current_revision(dsn: str) -> str | None:
    """The store's schema revision, or ``None`` for a database never migrated.

    Raises ConfigError (StoreSetupError) if the store cannot be used as
    configured, StoreError if it cannot be reached.
    """
    with _connect(dsn) as conn:
        try:
            rows = store.execute(conn, "get_schema_revision")
        except psycopg.errors.UndefinedTable:
            return None
    return rows[0]["version_num"] if rows else None


def live_job_count(dsn: str) -> int:
    """Jobs not deleted in the store (0 if it has no ``jobs`` table). Errors as :func:`current_revision`."""
    with _connect(dsn) as conn:
        try:
            return store.execute(conn, "count_live_jobs")[0]["n"]
        except psycopg.errors.UndefinedTable:
            return 0


@dataclass(frozen=True)
class Plan:
    """Where a migration of the store goes (:func:`plan`).

    ``current``: the store's revision (None: no schema). ``target``: the
    revision id the store ends at (None: base); every target is resolved
    before anything runs. ``drops_jobs``: the migration drops the ``jobs``
    table (a downgrade below :data:`JOBS_REVISION`).
    """

    current: str | None
    target: str | None
    drops_jobs: bool

    @property
    def noop(self) -> bool:
        """True if the store is already at the target: nothing to migrate."""
        return self.target == self.current

    @property
    def target_text(self) -> str:
        """The target as an operator reads it: ``base``, ``<id> (head)`` or ``<id>``."""
        if self.target is None:
            return "base"
        return f"{self.target} (head)" if self.target == head_revision() else self.target


_FORMS = {
    "upgrade": "an upgrade target is a revision id, head or +N (N revisions above the store's)",
    "downgrade": "a downgrade target is a revision id, base or -N (N revisions below the store's)",
}


def plan(dsn: str, revision: str, direction: str) -> Plan:
    """Check a migration of the store to ``revision`` (``direction`` ``"upgrade"`` or ``"downgrade"``).

    ``revision`` is an id; ``head`` or ``+N`` for an upgrade; ``base`` or
    ``-N`` for a downgrade (N revisions from the store's). Raises
    ValidationError (field ``revision``) for any other form, an unknown
    revision, a relative step past either end, a downgrade target above the
    store's revision, an upgrade target below it, or a store at a revision
    this version does not know (a newer one); otherwise errors as
    :func:`current_revision`.
    """
    script = _script()
    relative = re.fullmatch(r"([+-])(\d+)", revision)
    symbolic = {"upgrade": ("head", "heads"), "downgrade": ("base",)}[direction]
    if (relative and (relative.group(1) == "+") != (direction == "upgrade")) or (
        not relative
        and (_RELATIVE.fullmatch(revision) or revision in ("head", "heads", "base"))
        and revision not in symbolic
    ):
        raise ValidationError("revision", _FORMS[direction], revision)
    named = None if relative or revision in symbolic else _check_revision(script, revision)
    current = current_revision(dsn)
    if current is not None and not _known(script, current):
        raise ValidationError(
            "revision",
            f"cannot be reached from the store's revision {current}, which this "
            "version does not know (a newer version migrated it)",
            revision,
        )
    below = _ancestry(script, current) if current is not None else []
    chain = list(reversed(_ancestry(script, head_revision())))  # oldest first
    target = named
    if revision in ("head", "heads"):
        target = script.get_current_head()
    elif revision == "base":
        target = None
    elif relative:
        steps = int(relative.group(2))
        if direction == "downgrade":
            if steps > len(below):
                raise ValidationError(
                    "revision", f"only {len(below)} revisions below the store's {current or 'base'}", revision
                )
            target = below[steps] if steps < len(below) else None
        else:
            at = chain.index(current) if current is not None else -1
            above = len(chain) - 1 - at
            if steps > above:
                noun = "revision" if above == 1 else "revisions"
                raise ValidationError(
                    "revision", f"only {above} {noun} above the store's {current or 'base'}", revision
                )
            target = chain[at + steps]
    if direction == "downgrade" and target is not None and target not in below:
        go_up = f"`scheduler db upgrade {revision}` goes up"
        raise ValidationError(
            "revision",
            f"must be at or below the store's revision {current} ({go_up})"
            if current is not None
            else f"must be base: the store has no schema ({go_up})",
            revision,
        )
    if direction == "upgrade" and current is not None and target != current and (target is None or target in below):
        raise ValidationError(
            "revision",
            f"must be at or above the store's revision {current} (`scheduler db downgrade {revision}` goes down)",
            revision,
        )
    drops_jobs = (
        direction == "downgrade"
        and JOBS_REVISION in below
        and (target is None or JOBS_REVISION not in _ancestry(script, target))
    )
    return Plan(current, target, drops_jobs)


def _known(script: ScriptDirectory, revision: str) -> bool:
    try:
        return script.get_revision(revision) is not None
    except CommandError:
        return False


def _ancestry(script: ScriptDirectory, revision: str) -> list[str]:
    """``revision`` and every revision below it, newest first (``[revision]`` for one this version does not know)."""
    try:
        return [rev.revision for rev in script.iterate_revisions(revision, "base")]
    except CommandError:
        return [revision]


def script_revisions() -> tuple[str, frozenset[str]] | None:
    """``(head, every known revision)`` of the migration scripts, or None if they are not installed.

    Used by the node's start-up check: a store whose recorded revision is a
    known one other than head is behind; an unknown one is newer than this code.
    """
    if script_location() is None:
        return None
    script = _script()
    head = script.get_current_head()
    assert head is not None
    return head, frozenset(rev.revision for rev in script.walk_revisions())


def upgrade(dsn: str, revision: str = "head") -> Plan:
    """Migrate up to ``revision`` (checked by :func:`plan`; nothing runs if the
    store is there already) and return the plan. Errors: see the module doc."""
    checked = plan(dsn, revision, "upgrade")
    if not checked.noop:
        _run(command.upgrade, dsn, checked.target or "base")
    return checked


def downgrade(dsn: str, revision: str) -> Plan:
    """Migrate down to ``revision`` (``base`` drops every table) as :func:`upgrade` does."""
    checked = plan(dsn, revision, "downgrade")
    if not checked.noop:
        _run(command.downgrade, dsn, checked.target or "base")
    return checked


def _run(action: Callable[[Config, str], None], dsn: str, revision: str) -> None:
    log.add_secret(*secret_spellings(dsn))  # alembic's and SQLAlchemy's log records too
    config = alembic_config(dsn)  # ConfigError for a malformed DSN
    try:
        action(config, revision)
    except CommandError as exc:  # alembic refuses the target: the request was wrong
        raise ValidationError("revision", redact_text(first_line(exc), dsn), revision) from None
    except StoreError:
        raise
    except Exception as exc:  # sqlalchemy/alembic errors carry the URL: redact it
        raise StoreError(
            f"migration to {revision} failed on {redact_dsn(dsn)}: {redact_text(first_line(exc), dsn)}"
        ) from exc
