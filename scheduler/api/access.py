"""The access log of the HTTP API (``scheduler api --access-log``; docs/api.md, "Running").

:class:`AccessLog` is an ASGI middleware logging one ``api_request`` record
per request through the project's logging (:mod:`scheduler.log`, text or
JSON as every other record): ``method``, ``path`` (percent-decoded, never
the query string: a query value could be anything a client put there; its
control characters escaped by the log formats, as in every value),
``status`` (500 when the app failed before answering), ``duration_ms``
(from the request reaching the app to its last response byte handed on,
milliseconds) and ``client`` (``address:port``, the socket peer or the one
a trusted proxy names). No header is ever logged, so neither is a key.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler import log as logmod


class AccessLog:
    """ASGI middleware: one ``api_request`` record per HTTP request (see the module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            client = scope.get("client")
            host, port = client if client else ("", None)
            shown = f"[{host}]" if ":" in str(host) else str(host)
            logmod.event(
                "api_request",
                method=scope["method"],
                path=scope["path"],  # control characters are escaped by the formatters
                status=status,
                duration_ms=round((time.monotonic() - started) * 1000, 3),
                client=f"{shown}:{port}" if port is not None else shown or "-",
            )
