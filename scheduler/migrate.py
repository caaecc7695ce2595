"""Schema migrations through alembic's API (``scheduler db upgrade``).

The migration scripts live in ``alembic/`` beside ``alembic.ini`` at the
project root (an editable install keeps them there). Each revision runs in
its own transaction and uses ``IF NOT EXISTS`` so an interrupted upgrade can
be re-run (DESIGN.md §7).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from scheduler.errors import StoreError
from scheduler.store import redact_dsn, redact_text, sqlalchemy_url

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(dsn: str) -> Config:
    """An alembic Config for ``dsn``; raises StoreError if the scripts are missing."""
    ini = ROOT / "alembic.ini"
    if not ini.exists():
        raise StoreError(f"alembic.ini not found at {ini}: install the project with `pip install -e .`")
    config = Config(str(ini))
    config.set_main_option("script_location", str(ROOT / "alembic"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return config


def script_revisions() -> tuple[str, frozenset[str]] | None:
    """``(head, every known revision)`` of the migration scripts, or None if they are not installed.

    Used by the node's start-up check: a store whose recorded revision is a
    known one other than head is behind; an unknown one is newer than this code.
    """
    from alembic.script import ScriptDirectory

    if not (ROOT / "alembic").is_dir():
        return None
    scripts = ScriptDirectory(str(ROOT / "alembic"))
    return scripts.get_current_head(), frozenset(rev.revision for rev in scripts.walk_revisions())


def upgrade(dsn: str, revision: str = "head") -> None:
    """Migrate to ``revision``. Raises StoreError (password redacted) on failure."""
    _run(command.upgrade, dsn, revision)


def downgrade(dsn: str, revision: str) -> None:
    """Migrate down to ``revision`` (``base`` drops every table)."""
    _run(command.downgrade, dsn, revision)


def _run(action, dsn: str, revision: str) -> None:
    try:
        action(alembic_config(dsn), revision)
    except StoreError:
        raise
    except Exception as exc:  # sqlalchemy/alembic errors carry the URL: redact it
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"migration to {revision} failed on {redact_dsn(dsn)}: "
                         f"{redact_text(message, dsn)}") from exc
