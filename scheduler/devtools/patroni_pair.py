"""A throwaway Patroni pair on loopback for tests and benchmarks (not for production).

:class:`PatroniPair` runs two PostgreSQL members managed by Patroni (the
``patroni`` binary: ``SCHEDULER_PATRONI_BIN``, else ``patroni`` on PATH, else
Debian's ``/usr/bin/patroni``) with an etcd DCS (an endpoint such as
:class:`~scheduler.devtools.etcd_server.ThrowawayEtcd`'s, spoken to with
Patroni's ``etcd3`` client), each on free loopback ports with its data
directory on ``/dev/shm``. Patroni and PostgreSQL run as the ``postgres``
user when started by root (initdb refuses root). Trust authentication for
127.0.0.1: connect as ``postgres`` without a password.

Each :class:`Member` stands for one database *host*: its Patroni process
(a process group of its own, dying with this process through
``PR_SET_PDEATHSIG``) and its postmaster with every backend (Patroni starts
the postmaster in a session of its own). The faults act on the whole host:
:meth:`PatroniPair.kill` SIGKILLs both process groups (a host that vanishes),
:meth:`PatroniPair.freeze` SIGSTOPs them (a host that hangs: its sockets stay
open, the kernel keeps acknowledging), :meth:`PatroniPair.thaw` SIGCONTs
them, :meth:`PatroniPair.pause_walreceiver` SIGSTOPs a standby's WAL
receiver alone (replication lag on demand). :meth:`PatroniPair.stop` SIGKILLs
whatever is left and removes the directories; it never raises.

Timings are Patroni's (seconds): ``ttl`` (the leader key's lifetime: a dead
primary is replaced at most ``ttl`` + ``loop_wait`` after its last renewal),
``loop_wait`` and ``retry_timeout``. ``synchronous=True`` sets Patroni's
``synchronous_mode`` (not strict: a lone primary accepts commits);
``False`` replicates asynchronously. The leader is read from Patroni's
REST API (``/cluster``), never from PostgreSQL alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.errors import SchedulerError

_PR_SET_PDEATHSIG = 1


class PatroniUnavailable(SchedulerError):
    """No patroni or PostgreSQL binaries, or the pair did not come up."""


def find_patroni() -> str | None:
    """Path of the patroni binary (``SCHEDULER_PATRONI_BIN``, PATH, ``/usr/bin/patroni``), or None."""
    explicit = os.environ.get("SCHEDULER_PATRONI_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("patroni")
    if found:
        return found
    return "/usr/bin/patroni" if os.access("/usr/bin/patroni", os.X_OK) else None


def find_pg_bin() -> str | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` with ``initdb`` and ``pg_rewind``, or None."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    candidates = []
    for path in root.iterdir():
        if path.name.isdigit() and (path / "bin" / "initdb").exists() and (path / "bin" / "pg_rewind").exists():
            candidates.append((int(path.name), path / "bin"))
    return str(max(candidates)[1]) if candidates else None


RESERVED_PORTS = frozenset({5432, 55500, 55610, *range(54300, 55000)})
"""Loopback ports never handed out: PostgreSQL's default, and the ranges the test
script's own clusters search from (54329 up; 54400 up for CI's second pass)."""


def _free_port() -> int:
    """A free loopback port (the kernel's choice) outside :data:`RESERVED_PORTS`."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def _die_with_parent() -> None:  # in the child, between fork and exec (after the uid change)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@dataclass
class Member:
    """One host of the pair: a Patroni process and the PostgreSQL it manages."""

    name: str
    port: int
    rest_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    postmaster_pgid: int | None = None
    """The postmaster's process group, remembered once seen (a killed host keeps it)."""
    frozen: bool = False
    _log: Any = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        return self.dir / "patroni.log"

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """Single-host libpq URI of this member (``postgres``, trust auth)."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}" + (f"?{query}" if query else "")

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid`` if that process is alive, else None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid

    def groups(self) -> list[int]:
        """Process groups of this host: Patroni's, and the postmaster's (with every backend)."""
        groups = []
        if self.proc is not None and self.proc.poll() is None:
            groups.append(self.proc.pid)  # its own session: pgid == pid
        pid = self.postmaster_pid()
        if pid is not None:
            self.postmaster_pgid = _pgid(pid) or self.postmaster_pgid
        if self.postmaster_pgid is not None:
            groups.append(self.postmaster_pgid)
        return groups

    def rest(self, path: str, timeout_s: float = 1.0) -> tuple[int, Any] | None:
        """``(status, JSON body)`` of Patroni's REST ``path``, or None if it did not answer."""
        url = f"http://127.0.0.1:{self.rest_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            with contextlib.suppress(ValueError):
                return exc.code, json.loads(exc.read() or b"null")
            return exc.code, None
        except (OSError, ValueError):
            return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class PatroniPair:
    """Two Patroni-managed PostgreSQL members on loopback sharing the DCS at ``etcd_endpoint``.

    ``scope`` names the Patroni cluster (its keys in etcd); ``parameters``
    are extra PostgreSQL settings for both members (e.g.
    ``default_transaction_isolation``). ``maximum_lag_on_failover`` (bytes)
    is Patroni's: a standby further behind than this never promotes.
    """

    def __init__(
        self,
        etcd_endpoint: str,
        *,
        synchronous: bool = True,
        ttl: int = 10,
        loop_wait: int = 1,
        retry_timeout: int = 3,
        scope: str | None = None,
        parameters: dict[str, str] | None = None,
        maximum_lag_on_failover: int = 64 * 1024 * 1024,
        patroni: str | None = None,
        pg_bin: str | None = None,
    ) -> None:
        self.etcd_endpoint = etcd_endpoint
        self.synchronous = synchronous
        self.ttl = ttl
        self.loop_wait = loop_wait
        self.retry_timeout = retry_timeout
        self.scope = scope or f"pair-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        self.parameters = dict(parameters or {})
        self.maximum_lag_on_failover = maximum_lag_on_failover
        self.patroni = patroni or find_patroni()
        self.pg_bin = pg_bin or find_pg_bin()
        self.dir: Path | None = None
        self.members: list[Member] = []

    # ---- set-up

    def _config(self, member: Member) -> dict[str, Any]:
        parameters = {
            "unix_socket_directories": str(member.dir),
            "max_connections": "200",
            "fsync": "off",  # tmpfs, and the faults here are process kills, not power cuts
            "full_page_writes": "on",
            "wal_log_hints": "on",
            "shared_buffers": "64MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
            **self.parameters,
        }
        return {
            "scope": self.scope,
            "namespace": "/patroni/",
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{member.rest_port}",
                "connect_address": f"127.0.0.1:{member.rest_port}",
            },
            "etcd3": {"hosts": [self.etcd_endpoint]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl,
                    "loop_wait": self.loop_wait,
                    "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": self.maximum_lag_on_failover,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "remove_data_directory_on_rewind_failure": True,
                        "remove_data_directory_on_diverged_timelines": True,
                        "parameters": {"max_wal_senders": 10, "max_replication_slots": 10, "wal_keep_size": "128MB"},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.port}",
                "connect_address": f"127.0.0.1:{member.port}",
                "data_dir": str(member.data_dir),
                "bin_dir": self.pg_bin,
                "pgpass": str(member.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": parameters,
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def start(self, timeout_s: float = 120.0) -> PatroniPair:
        """Start both members; return once one leads and the other streams from it.

        Raises :class:`PatroniUnavailable` (with the members' log tails) if
        a binary is missing or the pair is not up within ``timeout_s``.
        """
        if not self.patroni:
            raise PatroniUnavailable("no patroni binary: apt-get install patroni, or set SCHEDULER_PATRONI_BIN")
        if not self.pg_bin:
            raise PatroniUnavailable("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.dir = Path(tempfile.mkdtemp(prefix="scheduler-patroni.", dir=base))
        self._chown(self.dir)
        for name in ("pg1", "pg2"):
            member_dir = self.dir / name
            member_dir.mkdir(mode=0o700)
            self._chown(member_dir)
            self.members.append(Member(name, _free_port(), _free_port(), member_dir))
        try:
            self.spawn(self.members[0])
            self.wait_leader(timeout_s=timeout_s)
            self.spawn(self.members[1])
            self.wait_streaming(self.members[1], timeout_s=timeout_s)
        except BaseException:
            tails = self.log_tails()
            self.stop()
            raise PatroniUnavailable(f"the Patroni pair did not come up:\n{tails}") from None
        return self

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")

    def spawn(self, member: Member) -> None:
        """Start ``member``'s Patroni (again, after :meth:`kill`); returns at once."""
        assert self.patroni is not None
        config = member.dir / "patroni.yml"
        config.write_text(json.dumps(self._config(member), indent=1))  # JSON is YAML
        self._chown(config)
        if member._log is not None:
            member._log.close()
        member._log = open(member.log_path, "ab")
        user = {"user": "postgres", "group": "postgres", "extra_groups": []} if os.geteuid() == 0 else {}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(member.dir)}
        member.proc = subprocess.Popen(
            [self.patroni, str(config)],
            stdin=subprocess.DEVNULL,
            stdout=member._log,
            stderr=subprocess.STDOUT,
            cwd=member.dir,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **user,  # type: ignore[arg-type]
        )
        member.postmaster_pgid = None
        member.frozen = False

    # ---- topology (Patroni's REST API)

    def cluster(self, exclude: Member | None = None) -> dict[str, Any] | None:
        """Patroni's ``/cluster`` view from the first member that answers (not ``exclude``)."""
        for member in self.members:
            if member is exclude or member.frozen or member.proc is None or member.proc.poll() is not None:
                continue
            answer = member.rest("/cluster")
            if answer is not None and answer[0] == 200 and isinstance(answer[1], dict):
                return answer[1]
        return None

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def leader(self, exclude: Member | None = None) -> Member | None:
        """The member Patroni reports as the running leader (asking the members other than ``exclude``)."""
        view = self.cluster(exclude)
        for entry in (view or {}).get("members", []):
            if entry.get("role") == "leader" and entry.get("state") == "running":
                return self.member(entry["name"])
        return None

    def role(self, member: Member) -> tuple[str | None, str | None]:
        """``(role, state)`` of ``member`` in Patroni's view (``replica``/``sync_standby``, ``streaming``...)."""
        view = self.cluster()
        for entry in (view or {}).get("members", []):
            if entry.get("name") == member.name:
                return entry.get("role"), entry.get("state")
        return None, None

    def writable(self, member: Member, timeout_s: float = 2.0) -> bool:
        """Whether ``member``'s PostgreSQL accepts a read-write session now."""
        import psycopg

        try:
            with psycopg.connect(member.dsn(), connect_timeout=max(2, int(timeout_s)), autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                return row is not None and row[0] is False
        except psycopg.Error:
            return False

    def wait_leader(
        self, exclude: Member | None = None, timeout_s: float = 60.0, interval_s: float = 0.05
    ) -> Member:
        """Wait until a member other than ``exclude`` leads and accepts writes; return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader(exclude)
            if leader is not None and leader is not exclude and self.writable(leader):
                return leader
            if time.monotonic() > deadline:
                raise TimeoutError(f"no writable Patroni leader (other than {exclude and exclude.name}) in {timeout_s}s")
            self._check_alive(exclude)
            time.sleep(interval_s)

    def wait_streaming(self, member: Member, timeout_s: float = 60.0) -> None:
        """Wait until ``member`` is a replica streaming from the leader (a synchronous
        standby when the pair is synchronous)."""
        wanted = "sync_standby" if self.synchronous else "replica"
        deadline = time.monotonic() + timeout_s
        while True:
            role, state = self.role(member)
            if role == wanted and state in ("streaming", "running"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{member.name} is {role}/{state}, not a streaming {wanted}, after {timeout_s}s")
            self._check_alive()
            time.sleep(0.1)

    def _check_alive(self, exclude: Member | None = None) -> None:
        for member in self.members:
            if member is exclude or member.proc is None:
                continue
            if member.proc.poll() is not None and member.proc.returncode not in (-signal.SIGKILL,):
                raise PatroniUnavailable(f"patroni {member.name} exited ({member.proc.returncode}):\n{member.log_tail()}")

    def multi_host_dsn(self, dbname: str, **params: str) -> str:
        """libpq multi-host URI over both members, ``target_session_attrs=read-write`` (+ ``params``)."""
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        query = "&".join(f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **params}.items())
        return f"postgresql://postgres@{hosts}/{dbname}?{query}"

    # ---- faults

    def kill(self, member: Member) -> None:
        """SIGKILL the host: Patroni's process group, then the postmaster's (every backend)."""
        groups = member.groups()
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        if member.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.proc.wait(10)
        member.frozen = False

    def freeze(self, member: Member) -> None:
        """SIGSTOP the host's Patroni and PostgreSQL processes (sockets stay open)."""
        member.frozen = True
        for pgid in member.groups():
            _signal_group(pgid, signal.SIGSTOP)

    def thaw(self, member: Member) -> None:
        """SIGCONT what :meth:`freeze` stopped."""
        for pgid in member.groups():
            _signal_group(pgid, signal.SIGCONT)
        member.frozen = False

    def walreceiver_pid(self, member: Member) -> int | None:
        """The pid of ``member``'s WAL receiver process (a standby), or None."""
        pgid = member.postmaster_pgid if member.postmaster_pid() is None else _pgid(member.postmaster_pid() or 0)
        if pgid is None:
            return None
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if b"walreceiver" in cmdline and os.getpgid(int(entry.name)) == pgid:
                    return int(entry.name)
            except (OSError, ProcessLookupError):
                continue
        return None

    @contextlib.contextmanager
    def walreceiver_paused(self, member: Member) -> Iterator[int]:
        """SIGSTOP ``member``'s WAL receiver for the ``with`` body (its replication lags); yields its pid."""
        pid = self.walreceiver_pid(member)
        if pid is None:
            raise PatroniUnavailable(f"{member.name} has no WAL receiver (not a streaming standby?)")
        os.kill(pid, signal.SIGSTOP)
        try:
            yield pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    # ---- teardown

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"---- patroni {m.name} ----\n{m.log_tail(lines)}" for m in self.members)

    def stop(self) -> None:
        """SIGKILL every process of both hosts (stopped ones too), remove the directories; never raises."""
        for member in self.members:
            with contextlib.suppress(Exception):
                for pgid in member.groups():
                    _signal_group(pgid, signal.SIGKILL)
                    _signal_group(pgid, signal.SIGCONT)
                if member.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        member.proc.wait(10)
            if member._log is not None:
                member._log.close()
                member._log = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PatroniPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
