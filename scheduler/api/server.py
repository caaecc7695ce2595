"""Serving the HTTP API with uvicorn: ``scheduler api`` (:func:`serve`, in the foreground) and
``scheduler node --api-port`` / the tests (:class:`ApiThread`, on its own thread).

Loopback by default. TLS: uvicorn's own ``ssl_certfile``/``ssl_keyfile``
(``scheduler api --ssl-certfile --ssl-keyfile``), or a reverse proxy
terminating TLS in front of a loopback listener (docs/api.md, "Running").
``X-Forwarded-For``/``-Proto`` are believed only from the proxies
``ApiSettings.forwarded_allow_ips`` names (none by default: the client is
the socket peer).
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from scheduler import log as logmod
from scheduler.api.app import create_app
from scheduler.settings import ApiSettings

START_TIMEOUT_S = 10.0
"""How long :meth:`ApiThread.start` waits for the listener."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port), IPv6 when ``host`` is one.

    Raises OSError (address in use, no such interface).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on connections
    # accepted from a socket that says it is TCP; without it every answer's body waited
    # ~40 ms for the client's delayed ACK of its headers.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _config(app: Any, **uvicorn_options: Any) -> uvicorn.Config:
    # log_config None: uvicorn leaves logging to the project (scheduler.log); its records propagate.
    # Its access log stays off (its logger has no handler then): the app's AccessLog logs requests.
    # Forwarded headers only from the proxies the settings name (uvicorn's default believes
    # 127.0.0.1, or FORWARDED_ALLOW_IPS): otherwise the socket peer is the client, so no client
    # picks its own address (the failed-authentication throttle is per address).
    trusted = app.state.settings.forwarded_allow_ips.strip()
    options = {
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "lifespan": "on",
        "log_config": None,
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted or None,
    }
    options.update(uvicorn_options)
    # h11 bounds header size and count; the default limit of incomplete events is 16 kB per header block.
    return uvicorn.Config(app, **options)


def listen_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port`` of a listener (an IPv6 host in brackets): ``api_listening``'s ``url``."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def warn_if_plain_http_beyond_loopback(host: str, tls: bool) -> bool:
    """Log ``api_plain_http`` (WARNING) and return True when the API listens without TLS on
    an address other hosts can reach: API keys then cross the network in clear text
    (docs/api.md). Loopback (``127.0.0.0/8``, ``::1``, ``localhost``) is quiet."""
    if tls or host == "localhost":
        return False
    try:
        if ipaddress.ip_address(host).is_loopback:
            return False
    except ValueError:
        pass  # a host name: it may resolve beyond loopback
    logmod.event(
        "api_plain_http",
        logging.WARNING,
        host=host,
        why="listening beyond loopback without TLS: API keys cross the network in clear text; "
        "give --ssl-certfile/--ssl-keyfile or put a TLS-terminating proxy in front (docs/api.md)",
    )
    return True


def serve(
    dsn: str,
    host: str,
    port: int,
    *,
    settings: ApiSettings | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    access_log: bool = False,
) -> None:
    """Serve the API on ``host:port`` until SIGINT/SIGTERM (uvicorn's handling: finish the requests
    in flight, then exit with status 0). ``access_log``: one ``api_request`` record per request
    (:mod:`scheduler.api.access`; uvicorn's own access log stays off).

    Raises OSError if the address cannot be bound, ConfigError for a bad DSN or settings.
    """
    app = create_app(dsn, settings=settings, access_log=access_log)
    sock = bind(host, port)
    config = _config(app, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, log_level="info")
    logmod.event("api_listening", url=listen_url("https" if ssl_certfile else "http", host, sock.getsockname()[1]))
    warn_if_plain_http_beyond_loopback(host, bool(ssl_certfile))
    # uvicorn finishes the requests in flight on SIGTERM/SIGINT, then re-raises the signal to
    # the handler it found: this one ends the process with status 0, as a node's stop does.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_cleanly)
    uvicorn.Server(config).run(sockets=[sock])


def _exit_cleanly(signum: int, frame: object) -> None:
    """uvicorn finished the requests in flight after ``signum``: log ``api_stopped``, exit 0."""
    logmod.event("api_stopped", signal=signal.Signals(signum).name)
    sys.exit(0)


class ApiThread:
    """The API served by uvicorn on a daemon thread (a node's ``--api-port``; the tests' ``api`` fixture).

    ``access_log`` logs each request as ``scheduler api --access-log`` does;
    ``clock`` paces the rate limits (:func:`scheduler.api.app.create_app`).
    :meth:`start` binds ``host:port`` (0: any free port; :attr:`port` is the
    one bound) and returns once the app has started (its store pool open),
    logging ``api_listening`` (``url``) as ``scheduler api`` does,
    raising RuntimeError if it did not within :data:`START_TIMEOUT_S`.
    :meth:`stop` asks uvicorn to finish and joins the thread (at most
    ``timeout_s`` seconds).
    """

    def __init__(
        self,
        dsn: str,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: ApiSettings | None = None,
        access_log: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.app = create_app(dsn, settings=settings, access_log=access_log, clock=clock)
        self.host = host
        self._sock = bind(host, port)
        self.port: int = self._sock.getsockname()[1]
        self.server = uvicorn.Server(_config(self.app))
        self.thread = threading.Thread(target=self._run, name="api", daemon=True)
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the listener."""
        return listen_url("http", self.host, self.port)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported by start()/stop()
            self.error = exc
            logmod.event("api_thread_failed", logging.ERROR, exc_info=True)

    def start(self) -> ApiThread:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self._sock.close()
                raise RuntimeError(f"the API did not start on {self.url}: {self.error!r}")
            time.sleep(0.01)
        logmod.event("api_listening", url=self.url)
        warn_if_plain_http_beyond_loopback(self.host, False)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout_s)
        self._sock.close()
