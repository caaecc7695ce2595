"""A TCP relay on 127.0.0.1 between the store and its clients (nodes, a test's sessions) that can go silent.

:class:`FreezingRelay` listens on a free loopback port and forwards every
accepted connection to the upstream ``host:port`` (one thread per direction
per connection). :meth:`FreezingRelay.freeze` models a hung pooler or proxy,
or a store host that vanished behind the same address: from that instant,
every connection open at the time keeps its sockets open but silently drops
what it reads (the relay's kernel still acknowledges the bytes, so TCP
keepalives and retransmission timeouts see a healthy peer), while
connections accepted afterwards are forwarded normally.
:meth:`FreezingRelay.cut` models the store going away for everyone (a
network partition, a primary gone before a replica is promoted): every open
connection is closed and new ones are closed as soon as they are accepted,
until :meth:`FreezingRelay.restore`.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import psycopg


class _Link:
    """One relayed connection: client socket, upstream socket, a frozen flag."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.frozen = threading.Event()

    def pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self.frozen.is_set():
                    continue  # read and drop: the peer's kernel sees every byte acknowledged
                sink.sendall(data)
        except OSError:
            pass
        if not self.frozen.is_set():
            self.close()

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FreezingRelay:
    """Forward ``127.0.0.1:<port>`` to ``upstream_host:upstream_port`` until :meth:`stop`.

    ``port`` is the bound port (after :meth:`start`). :meth:`freeze` makes every
    connection open now silent for good; :attr:`accepted` counts connections
    accepted so far (new ones after a freeze show the node reconnecting).
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._cut = threading.Event()
        self.accepted = 0

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def start(self) -> FreezingRelay:
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
                self.accepted += 1
            threading.Thread(target=link.pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=link.pump, args=(upstream, client), daemon=True).start()

    def freeze(self) -> int:
        """Silence every connection open now (new ones still pass); return how many."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.frozen.set()
        return len(links)

    def cut(self) -> int:
        """Close every connection open now and refuse new ones until :meth:`restore`; return how many closed."""
        self._cut.set()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        return len(links)

    def restore(self) -> None:
        """Forward new connections again (after :meth:`cut`)."""
        self._cut.clear()

    def dsn(self, dsn: str) -> str:
        """``dsn`` pointed at this relay (host 127.0.0.1, this relay's port)."""
        return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def stop(self) -> None:
        """Close the listener and every relayed connection; idempotent."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
