"""A wheel built from the repository migrates an empty database (issue 12, item 6).

Builds the wheel (``pip wheel --no-deps``) from a clean copy of the working
tree (a stale ``build/`` can never leak into it), installs it into a fresh
venv with its dependencies from the package index, and runs that venv's
``scheduler db upgrade`` from a directory outside the checkout: the
migrations must come from the installed package (``scheduler/migrations``).

Marked ``wheel`` and deselected by default (pyproject's ``addopts``): it costs
a build and an install (~30 s). ``.ci/run`` runs it alone:
``scripts/test tests/packaging -m wheel``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from scheduler.migrate import head_revision

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "results"
)
"""What the copy of the working tree leaves out (caches, builds, bench results)."""


def run(args: list, cwd: Path) -> str:
    """Run ``args`` in ``cwd`` without the checkout on the path; its stdout (stderr shown on failure)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("SCHEDULER_")
    }
    done = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-4000:])
    return done.stdout


def test_a_wheel_install_migrates_an_empty_database(empty_pg_dsn: str, tmp_path: Path) -> None:
    source, wheels, venv, elsewhere = (tmp_path / name for name in ("source", "wheels", "venv", "elsewhere"))
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    elsewhere.mkdir()
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", wheels, source], tmp_path)
    [wheel] = wheels.glob("trigger_engine-*.whl")
    run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", wheel], tmp_path)

    scheduler = venv / "bin" / "scheduler"
    assert (
        run([scheduler, "db", "current", "--dsn", empty_pg_dsn], elsewhere)
        == f"none (empty database; head is {head_revision()}: run `scheduler db upgrade`)\n"
    )
    assert (
        run([scheduler, "db", "upgrade", "--dsn", empty_pg_dsn], elsewhere) == f"schema at {head_revision()} (head)\n"
    )
    assert run([scheduler, "db", "current", "--dsn", empty_pg_dsn], elsewhere) == f"{head_revision()} (head)\n"
    with psycopg.connect(empty_pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM partitions").fetchone()[0] == 1024
        assert conn.execute("SELECT count(*) FROM leases").fetchone()[0] == 1024
    # ... and from the package's own copy of the migrations, not from a checkout
    location = run([python, "-c", "from scheduler import migrate; print(migrate.script_location())"], elsewhere)
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], elsewhere).strip()
    assert location == f"{site}/scheduler/migrations\n"
