"""Build step: the wheel carries the schema migrations as ``scheduler/migrations``.

Everything else is declared in pyproject.toml. The migration scripts stay in
the repository's top-level ``alembic/`` (alembic's own CLI runs them from a
checkout, with ``alembic.ini``); building the package copies ``env.py``,
``script.py.mako`` and ``versions/*.py`` into ``scheduler/migrations/`` of
the build, so ``scheduler db upgrade`` works from an installed wheel
(:func:`scheduler.migrate.script_location` finds either). An editable
install copies nothing: it runs the checkout's ``alembic/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "alembic"
PATTERNS = ("env.py", "script.py.mako", "versions/*.py")


class BuildPyWithMigrations(build_py):
    """``build_py`` plus a copy of ``alembic/`` into ``<build>/scheduler/migrations``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = sorted({path for pattern in PATTERNS for path in SOURCE.glob(pattern)})
        if not (SOURCE / "env.py").is_file() or not any(path.parent.name == "versions" for path in files):
            raise SystemExit(f"error: migration scripts not found in {SOURCE} (an sdist without alembic/?)")
        target = Path(self.build_lib) / "scheduler" / "migrations"
        for path in files:
            destination = target / path.relative_to(SOURCE)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildPyWithMigrations})
