"""The node's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz`` on one port.

Served by the standard library's :class:`~http.server.ThreadingHTTPServer`
on a daemon thread (``scheduler node --metrics-port P``, bound to
``--metrics-host``, 127.0.0.1 unless a container asks for 0.0.0.0):

``GET /metrics``
    the node's registry (:class:`scheduler.metrics.Metrics`) in the
    Prometheus text format (``prometheus_client.generate_latest``).
``GET /healthz``
    liveness: 200 ``ok`` while the node's loops make progress, else 503 with
    one reason per line (an orchestrator restarts the node on it). Progress
    (``Node.liveness``): each of the lease and firing loops has, within
    ``loop_stall_s`` (default: the lease TTL), completed an iteration or a
    store call, and is not inside a store call older than its
    ``statement_timeout`` (the store should have answered or cancelled it by
    then: the connection has gone silent; the watchdog breaks it after
    another two margins, see :mod:`scheduler.watchdog`). A store that is
    down or refuses connections does not fail ``/healthz`` (the loops keep
    iterating and retrying; ``/readyz`` reports it), and neither does a
    stop in progress.
``GET /readyz``
    200 when the node can do its job, else 503; both with a JSON body
    ``{"ready": bool, "reasons": [...], "checks": {...}}``. Ready means all of:

    * not stopping (after SIGTERM the node reports 503 while it drains);
    * no loop stalled (the ``/healthz`` condition);
    * the store answers a cheap query (``SELECT now()``) within
      ``probe_timeout_s``, on the endpoint's own connection;
    * the membership heartbeat is fresh: the lease loop's last successful
      heartbeat (``LeaseLoop.last_heartbeat_mono``) is younger than the lease
      TTL by the node's monotonic clock. Past the TTL peers consider the node
      dead and take its partitions.

A probe that hangs (a store that accepts but never answers) holds the probe
connection for at most ``probe_timeout_s`` as far as the caller is concerned:
the query runs on a worker thread, the request answers 503 when the timeout
passes, and probes that arrive meanwhile answer 503 at once instead of
queueing behind it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler import log, store
from scheduler.errors import ConfigError, SchedulerError
from scheduler.metrics import Metrics
from scheduler.settings import Settings

PROBE_TIMEOUT_S = 1.0
"""How long ``/readyz`` waits for the store to answer."""


class StoreProbe:
    """Answers "is the store reachable, and writable?" with two cheap queries on a dedicated connection.

    With ``settings`` (a node's), the connection is a node session
    (:func:`scheduler.store.node_connect`: keepalives, ``tcp_user_timeout``,
    the watchdog) whose ``statement_timeout`` is ``timeout_s``; without, a
    plain connection with short keepalives.
    """

    def __init__(
        self,
        dsn: str,
        timeout_s: float = PROBE_TIMEOUT_S,
        application_name: str = "scheduler-probe",
        settings: Settings | None = None,
    ) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._application_name = application_name
        self._settings = settings
        self._session = (
            None
            if settings is None
            else store.StoreSession(
                settings,
                application_name=application_name,
                statement_timeout_s=timeout_s,
                connect_timeout_s=max(2.0, timeout_s),
            )
        )
        self._conn: psycopg.Connection | None = None  # without settings
        self._busy = threading.Lock()

    def check(self) -> str | None:
        """Return ``None`` if the store answered in time and takes writes, else a one-line reason."""
        if not self._busy.acquire(blocking=False):
            return "store: the previous probe has not returned yet"
        outcome: list[str | None] = []
        worker = threading.Thread(target=self._query, args=(outcome,), name="store-probe", daemon=True)
        worker.start()  # the worker releases self._busy when the query returns or fails
        worker.join(self._timeout_s)
        if not outcome:
            return f"store: no answer within {self._timeout_s:g}s"
        return outcome[0]

    def _query(self, outcome: list[str | None]) -> None:
        try:
            conn = self._connection()
            store.now(conn)
            if store.execute(conn, "store_read_only")[0]["read_only"] == "on":
                # Not ready: the node can fire nothing. The session is closed, so the next probe
                # connects again (a multi-host DSN's target_session_attrs may reach the primary).
                outcome.append("store: read-only (a standby or default_transaction_read_only): no write can commit")
                self.close()
                return
            outcome.append(None)
        except (psycopg.Error, SchedulerError, OSError) as exc:
            outcome.append("store: " + (str(exc).splitlines() or [type(exc).__name__])[0])
            self.close()
        finally:
            self._busy.release()

    def _connection(self) -> psycopg.Connection:
        """The probe's connection: a node session (with ``settings``) or a plain one with short keepalives."""
        if self._session is not None:
            return self._session.connection()
        if self._conn is None or self._conn.closed:
            self._conn = store.connect(
                self._dsn,
                application_name=self._application_name,
                connect_timeout_s=max(2.0, self._timeout_s),  # libpq's minimum is 2 s
                statement_timeout_s=self._timeout_s,
                keepalives_idle=1,
                keepalives_interval=1,
                keepalives_count=2,
                tcp_user_timeout=int(self._timeout_s * 2000),
            )
        return self._conn

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` (see the module doc) on ``host:port``.

    ``readiness()`` returns ``(ready, reasons, checks)``; it is called per
    ``/readyz`` request. ``liveness()`` returns ``(alive, reasons)``, called per
    ``/healthz`` request (None: always alive). ``port`` 0 binds any free port; :attr:`port` is the
    bound one. :meth:`start` raises :class:`ConfigError` if the address
    cannot be bound.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        readiness: Callable[[], tuple[bool, list[str], dict]],
        liveness: Callable[[], tuple[bool, list[str]]] | None = None,
    ) -> None:
        self._host = host
        self._requested_port = port
        self._metrics = metrics
        self._readiness = readiness
        self._liveness = liveness
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("HealthServer not started")
        return self._server.server_address[1]

    def start(self) -> None:
        handler = _handler(self._metrics, self._readiness, self._liveness)
        try:
            self._server = ThreadingHTTPServer((self._host, self._requested_port), handler)
        except OSError as exc:
            raise ConfigError(  # a bad setting (exit status 2), as `scheduler api --port`'s
                f"metrics_port: cannot listen on {self._host}:{self._requested_port} ({exc.strerror or exc})"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="health-server", daemon=True
        )
        self._thread.start()
        log.event("metrics_listening", host=self._host, port=self.port)

    def stop(self) -> None:
        """Stop serving and close the socket; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None


def _handler(
    metrics: Metrics,
    readiness: Callable[[], tuple[bool, list[str], dict]],
    liveness: Callable[[], tuple[bool, list[str]]] | None = None,
) -> type:
    class Handler(BaseHTTPRequestHandler):
        server_version = "scheduler"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
            elif path == "/healthz":
                alive, reasons = liveness() if liveness is not None else (True, [])
                body = "ok\n" if alive else "".join(f"{reason}\n" for reason in reasons)
                self._send(200 if alive else 503, "text/plain; charset=utf-8", log.redact(body).encode())
            elif path == "/readyz":
                ready, reasons, checks = readiness()
                body = json.dumps({"ready": ready, "reasons": reasons, "checks": checks}, default=str)
                self._send(200 if ready else 503, "application/json", log.redact(body).encode() + b"\n")
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, /readyz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.event(
                "http_request", logging.DEBUG, request=self.requestline, status=args[1] if len(args) > 1 else None
            )

    return Handler
