"""Schema migrations through alembic's API (``scheduler db upgrade``).

The migration scripts live in the repository's top-level ``alembic/`` (with
``alembic.ini`` beside it, for alembic's own CLI); a wheel carries a copy as
``scheduler/migrations`` (setup.py's build step). :func:`script_location`
finds them in either place: an installed wheel or a checkout (an editable
install runs the checkout's). Each revision runs in
its own transaction and uses ``IF NOT EXISTS`` so an interrupted upgrade can
be re-run (docs/design.md §7).

The DSN may be a URI or libpq keywords (``host=... dbname=...``); see
:func:`scheduler.store.sqlalchemy_url`. Its password, in every spelling,
never appears in an error. An unknown target revision is a
:class:`~scheduler.errors.ValidationError` (the request was wrong), any
other failure a :class:`~scheduler.errors.StoreError`.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote, quote_plus

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from scheduler import log, store
from scheduler.errors import StoreError, ValidationError
from scheduler.store import dsn_secrets, redact_dsn, redact_text, sqlalchemy_url

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
    """An alembic Config for ``dsn`` (no ini file: the script location and URL are set here).

    Raises StoreError if the migration scripts are not installed.
    """
    location = script_location()
    if location is None:
        raise StoreError(f"migration scripts not found (neither {PACKAGED} nor {CHECKOUT}): install the "
                         "project from a wheel or a checkout (`pip install -e .`)")
    config = Config()
    config.set_main_option("script_location", str(location))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return config


def _secrets(dsn: str) -> list[str]:
    """The DSN's passwords as written, decoded, and percent-encoded as in the SQLAlchemy URL."""
    found = dsn_secrets(dsn)
    return list(dict.fromkeys(found + [quote(s, safe="") for s in found] + [quote_plus(s) for s in found]))


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
        raise ValidationError("revision", f"unknown revision (this version knows base..{script.get_current_head()}; "
                                          "`scheduler db current` shows the store's)", revision) from None
    return None if found is None else found.revision


def head_revision() -> str:
    """The newest revision this version of the code knows (e.g. ``"0014"``)."""
    head = _script().get_current_head()
    assert head is not None
    return head


def is_known(revision: str) -> bool:
    """True if this version of the code has ``revision`` (a store migrated by a newer one may not)."""
    try:
        return _script().get_revision(revision) is not None
    except CommandError:
        return False


def current_revision(dsn: str) -> str | None:
    """The store's schema revision, or ``None`` for a database never migrated.

    Raises StoreError if the store cannot be reached.
    """
    with store.connect(dsn, application_name="scheduler-migrate") as conn:
        try:
            rows = store.execute(conn, "get_schema_revision")
        except psycopg.errors.UndefinedTable:
            return None
    return rows[0]["version_num"] if rows else None


def live_job_count(dsn: str) -> int:
    """Jobs not deleted in the store (0 if it has no ``jobs`` table). Raises StoreError if unreachable."""
    with store.connect(dsn, application_name="scheduler-migrate") as conn:
        try:
            return store.execute(conn, "count_live_jobs")[0]["n"]
        except psycopg.errors.UndefinedTable:
            return 0


def downgrade_drops_jobs(dsn: str, revision: str) -> bool:
    """True if downgrading the store to ``revision`` drops the ``jobs`` table.

    ``revision`` is an id, ``base`` or relative (``-2``). Raises
    ValidationError (field ``revision``) for an unknown revision, StoreError
    if the store cannot be reached.
    """
    script = _script()
    target = _check_revision(script, revision)
    current = current_revision(dsn)
    if current is None or JOBS_REVISION not in _ancestry(script, current):
        return False
    if revision == "base":
        return True
    relative = re.fullmatch(r"-(\d+)", revision)
    if relative:
        chain = _ancestry(script, current)
        steps = int(relative.group(1))
        target = chain[steps] if steps < len(chain) else None
    return target is None or JOBS_REVISION not in _ancestry(script, target)


def _ancestry(script: ScriptDirectory, revision: str) -> list[str]:
    """``revision`` and every revision below it, newest first."""
    try:
        return [rev.revision for rev in script.iterate_revisions(revision, "base")]
    except CommandError:  # a store revision this version does not know (a newer one)
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


def upgrade(dsn: str, revision: str = "head") -> None:
    """Migrate to ``revision``. Raises ValidationError for an unknown revision,
    StoreError (password redacted) on failure."""
    _check_revision(_script(), revision)
    _run(command.upgrade, dsn, revision)


def downgrade(dsn: str, revision: str) -> None:
    """Migrate down to ``revision`` (``base`` drops every table). Errors as :func:`upgrade`."""
    _check_revision(_script(), revision)
    _run(command.downgrade, dsn, revision)


def _run(action, dsn: str, revision: str) -> None:
    secrets = _secrets(dsn)
    log.add_secret(*secrets)  # alembic's and SQLAlchemy's log records too
    try:
        action(alembic_config(dsn), revision)
    except StoreError:
        raise
    except Exception as exc:  # sqlalchemy/alembic errors carry the URL: redact it
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = redact_text(message, dsn)
        for secret in sorted(secrets, key=len, reverse=True):
            message = message.replace(secret, "***")
        raise StoreError(f"migration to {revision} failed on {redact_dsn(dsn)}: {message}") from exc
