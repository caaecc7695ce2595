"""A throwaway single-member etcd for tests and benchmarks (not for production).

:class:`ThrowawayEtcd` starts the ``etcd`` binary (``SCHEDULER_ETCD_BIN``, else
``etcd`` on PATH, else ``/usr/bin/etcd``: Debian's ``etcd-server``) on free
loopback ports with its data directory on ``/dev/shm`` (tmpfs: no fsync cost),
waits until it answers ``/health``, and on :meth:`stop` ends it (SIGTERM, then
SIGKILL) and removes the directory. The child dies with its parent
(``PR_SET_PDEATHSIG``), so an interrupted run leaves no server behind.

:meth:`request_counts` reads etcd's Prometheus ``/metrics`` (served on the
client port): gRPC messages received per method, the cheap way to count the
requests a coordinator costs etcd. Reading keys and raising the revision
through etcd's JSON gateway are operations tools: :mod:`scheduler.coordination.etcd_gateway`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from scheduler.errors import SchedulerError

_PR_SET_PDEATHSIG = 1


class EtcdUnavailable(SchedulerError):
    """No etcd binary, or the throwaway etcd did not start."""


def find_binary(env_var: str, name: str) -> str | None:
    """Path of the executable ``name``: ``$env_var`` if set (None unless it is
    executable), else ``name`` on PATH, else ``/usr/bin/<name>`` (Debian's), else None."""
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    default = f"/usr/bin/{name}"
    return default if os.access(default, os.X_OK) else None


def find_etcd() -> str | None:
    """Path of the etcd binary (``SCHEDULER_ETCD_BIN``, PATH, ``/usr/bin/etcd``), or None."""
    return find_binary("SCHEDULER_ETCD_BIN", "etcd")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """``PR_SET_PDEATHSIG`` = SIGKILL; a ``preexec_fn``: runs in the child between fork and exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ThrowawayEtcd:
    """One etcd member on 127.0.0.1; ``endpoint`` is ``host:port`` for ``--etcd-endpoints``.

    ``enable_v2`` also serves etcd's v2 API (``--enable-v2``: what Patroni's
    ``etcd:`` DCS speaks, see :mod:`scheduler.devtools.patroni_pair`)."""

    def __init__(self, binary: str | None = None, *, enable_v2: bool = False) -> None:
        self.binary = binary or find_etcd()
        self.enable_v2 = enable_v2
        self.port = 0
        self.peer_port = 0
        self.dir: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> ThrowawayEtcd:
        if not self.binary:
            raise EtcdUnavailable("no etcd binary: apt-get install etcd-server, or set SCHEDULER_ETCD_BIN")
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        last = ""
        for _ in range(5):  # a port race with another process: try other ports
            self.port, self.peer_port = _free_port(), _free_port()
            self.dir = Path(tempfile.mkdtemp(prefix="scheduler-etcd.", dir=base))
            log = open(self.dir / "etcd.log", "wb")
            peer = f"http://127.0.0.1:{self.peer_port}"
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    "--name",
                    "throwaway",
                    "--data-dir",
                    str(self.dir / "data"),
                    "--listen-client-urls",
                    self.url,
                    "--advertise-client-urls",
                    self.url,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"throwaway={peer}",
                    "--log-level",
                    "warn",
                    "--logger",
                    "zap",
                    *(["--enable-v2"] if self.enable_v2 else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
            log.close()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self._proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                        if b'"true"' in response.read():
                            return self
                time.sleep(0.05)
            last = self.log_tail()
            self.stop()
        raise EtcdUnavailable(f"etcd did not start ({self.binary}):\n{last}")

    def log_tail(self, lines: int = 20) -> str:
        if self.dir is None:
            return ""
        try:
            return "\n".join((self.dir / "etcd.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def request_counts(self) -> dict[str, float]:
        """``{grpc_method: messages received}`` from etcd's /metrics (all services)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        return parse_requests(text)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> ThrowawayEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_requests(metrics_text: str) -> dict[str, float]:
    """Sum ``grpc_server_msg_received_total`` by ``grpc_method`` (Prometheus text format)."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("grpc_server_msg_received_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
        out[method] = out.get(method, 0.0) + float(value)
    return out


def scrape_requests(endpoint: str) -> dict[str, float]:
    """:func:`parse_requests` of ``http://<endpoint>/metrics`` (any reachable etcd)."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as response:
        return parse_requests(response.read().decode())
