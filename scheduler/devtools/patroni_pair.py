"""A throwaway Patroni pair on loopback for tests and benchmarks (not for production).

:class:`PatroniPair` runs two PostgreSQL members managed by Patroni (the
``patroni`` binary: ``SCHEDULER_PATRONI_BIN``, else ``patroni`` on PATH, else
Debian's ``/usr/bin/patroni``) with an etcd DCS (an endpoint such as
:class:`~scheduler.devtools.etcd_server.ThrowawayEtcd`'s), each on free
loopback ports with its data directory on ``/dev/shm``.

The DCS is spoken to with Patroni's ``etcd:`` client (etcd's v2 API: start
etcd with ``--enable-v2``, ``ThrowawayEtcd(enable_v2=True)``) unless
``dcs="etcd3"``. Patroni 3.0.2's ``etcd3`` client (Debian bookworm's) lets a
primary that was frozen past ``ttl`` and is thawed after the failover take
the leader key back: its ``update_leader`` writes the key unconditionally
under a new lease (seen here: the promoted standby was demoted 2 s after its
promotion, and what it had committed was rewound away). The v2 client
writes the key only if it still holds its own name (compare-and-swap), so
the thawed primary finds it taken and demotes itself. Patroni and PostgreSQL run as the ``postgres``
user when started by root (initdb refuses root). Trust authentication for
127.0.0.1: connect as ``postgres`` without a password.

Each :class:`Member` stands for one database *host*: its Patroni process
(a process group of its own, dying with this process through
``PR_SET_PDEATHSIG``) and its postmaster with every child (Patroni starts
the postmaster in a session of its own, and PostgreSQL puts each child in
a session of its own, so the host is not one process group: its processes
are listed from /proc and signalled back to back, :meth:`Member.signal_host`).
The faults act on the whole host:
:meth:`PatroniPair.kill` SIGKILLs all of them (a host that vanishes),
:meth:`PatroniPair.freeze` SIGSTOPs them (a host that hangs: its sockets stay
open, the kernel keeps acknowledging), :meth:`PatroniPair.thaw` SIGCONTs
them, :meth:`PatroniPair.walsenders_paused` SIGSTOPs the primary's WAL
senders alone (replication lag on demand). :meth:`PatroniPair.stop` SIGKILLs
whatever is left and removes the directories; it never raises. A test
process that is itself SIGKILLed takes the Patroni processes with it, not
the postmasters (they outlive their parent): kill those by hand.

Timings are Patroni's (seconds): ``ttl`` (the leader key's lifetime: a dead
primary is replaced at most ``ttl`` + ``loop_wait`` after its last renewal),
``loop_wait`` and ``retry_timeout``. ``synchronous=True`` sets Patroni's
``synchronous_mode`` (not strict: a lone primary accepts commits);
``False`` replicates asynchronously. The leader is read from Patroni's
REST API (``/cluster``), never from PostgreSQL alone.
"""

from __future__ import annotations

import contextlib
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

from scheduler.devtools.etcd_server import die_with_parent, find_binary
from scheduler.errors import SchedulerError


class PatroniUnavailable(SchedulerError):
    """No patroni or PostgreSQL binaries, or the pair did not come up."""


def find_patroni() -> str | None:
    """Path of the patroni binary (``SCHEDULER_PATRONI_BIN``, PATH, ``/usr/bin/patroni``), or None."""
    return find_binary("SCHEDULER_PATRONI_BIN", "patroni")


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


def free_port() -> int:
    """A free loopback port (the kernel's choice) outside :data:`RESERVED_PORTS`."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def _stat(pid: str) -> tuple[int, int] | None:
    """``(ppid, pgid)`` of process ``pid`` from /proc, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[2])


def _processes() -> dict[int, tuple[int, int]]:
    """``{pid: (ppid, pgid)}`` of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(entry)
            if stat is not None:
                out[int(entry)] = stat
    return out


def _group_members(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` (its leader first)."""
    return sorted((pid for pid, (_, group) in _processes().items() if group == pgid), key=lambda pid: pid != pgid)


def _children(parent: int) -> list[int]:
    """Direct children of ``parent``."""
    return [pid for pid, (ppid, _) in _processes().items() if ppid == parent]


@dataclass
class Member:
    """One host of the pair: a Patroni process and the PostgreSQL it manages."""

    name: str
    port: int
    rest_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
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
        """The postmaster's pid from ``postmaster.pid`` if that process is alive and is
        this member's postmaster (its command line names the data directory), else None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if str(self.data_dir).encode() in cmdline else None

    def host_pids(self) -> list[int]:
        """Every live process of this host: Patroni's process group, the postmaster and
        its children (PostgreSQL puts each child in a session of its own, so they are
        found by parent), in that order."""
        pids = []
        if self.proc is not None and self.proc.poll() is None:
            pids += _group_members(self.proc.pid)  # its own session: pgid == pid
        postmaster = self.postmaster_pid()
        if postmaster is not None:
            pids.append(postmaster)
            pids += _children(postmaster)
        return pids

    def signal_host(self, signum: int) -> None:
        """Send ``signum`` to every process of :meth:`host_pids` (listing the postmaster's
        children again after signalling it, for one forked meanwhile)."""
        for _ in range(2):
            for pid in self.host_pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)

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

    ``dcs`` is Patroni's client: ``etcd`` (v2 API, the default; see the
    module docstring) or ``etcd3``.
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
        dcs: str = "etcd",
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
        if dcs not in ("etcd", "etcd3"):
            raise ValueError(f"dcs must be 'etcd' (v2 API) or 'etcd3' (got {dcs!r})")
        self.dcs = dcs
        self.patroni = patroni or find_patroni()
        self.pg_bin = pg_bin or find_pg_bin()
        self.dir: Path | None = None
        self.members: list[Member] = []

    # ---- set-up

    def _config(self, member: Member) -> dict[str, Any]:
        parameters = {
            "unix_socket_directories": str(member.dir),
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
            self.dcs: {"hosts": [self.etcd_endpoint]},
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
                        "parameters": {
                            "max_connections": 200,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                        },
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
            self.members.append(Member(name, free_port(), free_port(), member_dir))
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
            preexec_fn=die_with_parent,  # after the uid change: it survives it
            **user,  # type: ignore[arg-type]
        )
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

    def wait_leader(self, exclude: Member | None = None, timeout_s: float = 60.0, interval_s: float = 0.05) -> Member:
        """Wait until a member other than ``exclude`` leads and accepts writes; return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader(exclude)
            if leader is not None and leader is not exclude and self.writable(leader):
                return leader
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no writable Patroni leader (other than {exclude and exclude.name}) in {timeout_s}s"
                )
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
                raise PatroniUnavailable(
                    f"patroni {member.name} exited ({member.proc.returncode}):\n{member.log_tail()}"
                )

    def multi_host_dsn(self, dbname: str, **params: str) -> str:
        """libpq multi-host URI over both members, ``target_session_attrs=read-write`` (+ ``params``)."""
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        query = "&".join(f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **params}.items())
        return f"postgresql://postgres@{hosts}/{dbname}?{query}"

    # ---- faults

    def kill(self, member: Member) -> None:
        """SIGKILL the host: its Patroni process group, then its postmaster and every child."""
        member.signal_host(signal.SIGKILL)
        if member.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.proc.wait(10)
        member.frozen = False

    def freeze(self, member: Member) -> None:
        """SIGSTOP the host's Patroni and PostgreSQL processes (sockets stay open)."""
        member.frozen = True
        member.signal_host(signal.SIGSTOP)

    def thaw(self, member: Member) -> None:
        """SIGCONT what :meth:`freeze` stopped."""
        member.signal_host(signal.SIGCONT)
        member.frozen = False

    def children_named(self, member: Member, word: str) -> list[int]:
        """Pids of ``member``'s postmaster children whose process title holds ``word``
        (``walsender``, ``walreceiver``, ...)."""
        postmaster = member.postmaster_pid()
        if postmaster is None:
            return []
        found = []
        for pid in _children(postmaster):
            with contextlib.suppress(OSError):
                if word.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        return found

    @contextlib.contextmanager
    def walsenders_paused(self, primary: Member) -> Iterator[list[int]]:
        """SIGSTOP ``primary``'s WAL senders for the ``with`` body: its standbys receive
        nothing more meanwhile (asynchronous commits go on; synchronous ones wait);
        yields their pids, SIGCONTed on exit.

        The sender is paused, not the standby's receiver: a stopped receiver leaves
        the WAL sent meanwhile in its socket buffer, and reads it all after a SIGCONT
        even when the primary is dead by then (no lag would be left)."""
        pids = self.children_named(primary, "walsender")
        if not pids:
            raise PatroniUnavailable(f"{primary.name} has no WAL sender (no streaming standby?)")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield pids
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    # ---- teardown

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"---- patroni {m.name} ----\n{m.log_tail(lines)}" for m in self.members)

    def stop(self) -> None:
        """SIGKILL every process of both hosts (stopped ones too), remove the directories; never raises."""
        for member in self.members:
            with contextlib.suppress(Exception):
                member.signal_host(signal.SIGKILL)
                member.signal_host(signal.SIGCONT)
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
