"""The socket the API serves on."""

from __future__ import annotations

import socket
import time

import httpx

from scheduler.api.server import ApiThread, bind


def test_accepted_connections_send_without_nagle_delays(pg_dsn):
    """Every answer went out as two segments (headers, then body), and the body waited for
    the client's delayed ACK: ~40 ms on every request, a PUT answered in 56 ms that the
    server finished in 15. asyncio turns Nagle off on the connections a TCP socket accepts,
    but only when the listening socket says it is TCP (``proto`` IPPROTO_TCP); the socket
    the API made said 0."""
    sock = bind("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    sock.close()
    api = ApiThread(pg_dsn).start()
    try:
        with httpx.Client(base_url=api.url) as client:
            assert client.get("/openapi.json").status_code == 200  # the connection stays open (keep-alive)
            deadline = time.monotonic() + 5
            while not api.server.server_state.connections and time.monotonic() < deadline:
                time.sleep(0.01)
            (conn,) = api.server.server_state.connections
            server_side = conn.transport.get_extra_info("socket")
            assert server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        api.stop()
