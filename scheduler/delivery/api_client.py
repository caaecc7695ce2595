"""The worker's HTTP transport: claim, heartbeat, ack and nack through the tenant API.

:class:`ApiTransport` has the surface of :class:`~scheduler.delivery.worker.StoreTransport`
(coroutines returning what :mod:`~scheduler.delivery.lifecycle` returns), so
one :class:`~scheduler.delivery.worker.Worker` serves a queue either from the
store or from the API (``scheduler worker --api-url URL``, the key in the
environment variable ``SCHEDULER_API_KEY``): a worker then needs no database
credentials. Each call is one request of the batch forms of docs/api.md
("Runs and workers"): ``POST /v1/runs:claim``, ``/v1/runs:heartbeat``,
``/v1/runs:ack``, ``/v1/runs:nack`` (up to 1,000 runs each), on a keep-alive
connection pool (aiohttp) of the worker's event loop.

What the worker survives (``ApiTransport.errors``: logged, retried after a
backoff, as a store error): the API unreachable, a timeout, a 5xx, a 429
(rate limited), a 401/403 (a key revoked or a role changed while running: the
worker keeps its runs and retries; their leases expire meanwhile). Any other
refusal (:class:`ApiRefused`, e.g. a 422: a request this client should never
send) is a bug and stops the worker as a failed loop does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from scheduler.delivery import lifecycle
from scheduler.delivery.ssrf import URL_CHARACTERS_RULE, shown_url
from scheduler.errors import ValidationError

API_KEY_ENV = "SCHEDULER_API_KEY"
"""The environment variable holding a worker's API key (never a command-line argument: ``ps`` shows those)."""

RETRIED_STATUSES = frozenset({401, 403, 408, 429, 500, 502, 503, 504})
"""Statuses a worker retries after a backoff (as a store error) rather than stopping on."""

MAX_REQUEST_BYTES = 512 * 1024
"""A heartbeat, ack or nack batch is split so no request body passes this (the API's limit is 1 MB;
1,000 nacks with 2,000-character errors would pass it)."""

WORKER_LABEL_MAX = 100
"""The API keeps at most this many characters of a claim's ``worker`` label (printable ASCII, no spaces)."""

CONNECTIONS = 4
"""Keep-alive connections per worker: a claim, a heartbeat and an ack/nack can be in flight at once."""


class ApiUnavailable(Exception):
    """The API could not answer now (a status in :data:`RETRIED_STATUSES`); ``status`` is the HTTP status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class ApiRefused(Exception):
    """The API refused a request for good (a 4xx outside :data:`RETRIED_STATUSES`); ``status`` as above."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


def validate_api_url(url: str) -> str:
    """``url`` without a trailing slash; raises ValidationError (field ``api_url``) unless it is an
    ``http://`` or ``https://`` URL with a host, a port (if any) from 1 to 65535, no query or
    fragment, no credentials (no ``@`` at all: the key travels in ``SCHEDULER_API_KEY``; such a
    URL is refused without being echoed), no spaces or unprintable characters. A refused URL
    is echoed as :func:`~scheduler.delivery.ssrf.shown_url` gives it."""
    rule = "must be an http:// or https:// URL of the API, e.g. http://127.0.0.1:8080"
    if isinstance(url, str) and "@" in url:  # never part of the API's URL: credentials, however spelled
        raise ValidationError(
            "api_url", "must not carry credentials (user@ or user:password@): the key goes in SCHEDULER_API_KEY"
        )
    if isinstance(url, str) and (not url.isprintable() or " " in url):
        raise ValidationError("api_url", URL_CHARACTERS_RULE)
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValidationError("api_url", rule, shown_url(url) if isinstance(url, str) else url)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port is not None and not 1 <= port <= 65535:
        raise ValidationError("api_url", "port must be a whole number from 1 to 65535", shown_url(url))
    return url.rstrip("/")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


def claimed_of(item: dict[str, Any]) -> lifecycle.Claimed:
    """The :class:`~scheduler.delivery.lifecycle.Claimed` of one run of a claim's answer."""
    return lifecycle.Claimed(
        key=lifecycle.RunKey.parse(item["id"], "id"),
        tenant=item["tenant"],
        queue=item["queue"],
        job_name=item.get("schedule"),
        origin=item.get("origin"),
        scheduled_at=_instant(item["scheduled_at"]),
        attempt=int(item["attempt"]),
        token=uuid.UUID(item["lease_token"]),
        leased_until=_instant(item["leased_until"]),
        claimed_at=_instant(item["claimed_at"]),
        payload=item.get("payload"),
    )


class ApiTransport:
    """Claims, heartbeats, acks and nacks through the API at ``url`` with the bearer ``key``.

    ``timeout_s``: the whole of one request (seconds). Create and use it on one
    event loop (the worker's); :meth:`close` it there. Raises as the module doc
    says.
    """

    errors: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ApiUnavailable)

    def __init__(self, url: str, key: str, *, timeout_s: float = 10.0) -> None:
        self.url = validate_api_url(url)
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=CONNECTIONS),
                timeout=self._timeout,
                headers=self._headers,
                json_serialize=json.dumps,
            )
        return self._session

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` as JSON to ``path``; the decoded JSON answer of a 2xx. Raises
        :class:`ApiUnavailable` / :class:`ApiRefused` for other statuses."""
        async with self._open().post(self.url + path, data=json.dumps(body, separators=(",", ":"))) as resp:
            text = await resp.text()
            if resp.status < 300:
                try:
                    return json.loads(text)
                except ValueError:  # a proxy's page, a cut body: retried like an outage
                    raise ApiUnavailable(resp.status, "the answer is not JSON") from None
        try:
            answer = json.loads(text)
            detail = answer.get("detail") or answer.get("title") or ""
        except (ValueError, AttributeError):
            detail = ""
        detail = " ".join(str(detail).split())[:200]
        if resp.status in RETRIED_STATUSES:
            raise ApiUnavailable(resp.status, detail)
        raise ApiRefused(resp.status, detail)

    async def claim(
        self, *, tenant: str | None, queue: str, worker: str, limit: int, lease_s: float
    ) -> list[lifecycle.Claimed]:
        """``POST /v1/runs:claim``: up to ``limit`` runs of the key's tenant's ``queue``
        (``tenant`` is ignored: the key decides it). ``worker`` is sent as the claim's label
        (a space or non-ASCII character as ``_``, cut to :data:`WORKER_LABEL_MAX`): the runs
        record ``api:<key id>:<label>``."""
        label = "".join(ch if "!" <= ch <= "~" else "_" for ch in worker)[:WORKER_LABEL_MAX] or None
        answer = await self.post("/v1/runs:claim", {"queue": queue, "max": limit, "lease_s": lease_s, "worker": label})
        return [claimed_of(item) for item in answer["runs"]]

    async def _answers(self, path: str, runs: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, str]:
        answers: dict[str, str] = {}
        chunk: list[dict[str, Any]] = []
        size = 0
        for item in runs:
            # An upper bound without encoding: the fixed fields, and 12 bytes a character
            # of an error (an astral character escapes to \uXXXX\uXXXX, 12 bytes, the longest).
            item_bytes = 200 + 12 * len(item.get("error") or "")
            if chunk and size + item_bytes > MAX_REQUEST_BYTES:
                answers.update(await self._send(path, chunk, extra))
                chunk, size = [], 0
            chunk.append(item)
            size += item_bytes
        if chunk:
            answers.update(await self._send(path, chunk, extra))
        return answers

    async def _send(self, path: str, runs: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, str]:
        answer = await self.post(path, {**extra, "runs": runs})
        return {item["id"]: item["answer"] for item in answer["results"]}

    async def heartbeat(self, leases: Sequence[tuple[lifecycle.RunKey, uuid.UUID]], lease_s: float) -> dict[str, str]:
        """``POST /v1/runs:heartbeat``: run id → answer (``leased``, ``canceled``, ``lost``)."""
        runs = [{"id": key.run_id, "lease_token": str(token)} for key, token in leases]
        return await self._answers("/v1/runs:heartbeat", runs, {"lease_s": lease_s})

    async def ack(self, leases: Sequence[tuple[lifecycle.RunKey, uuid.UUID]]) -> dict[str, str]:
        """``POST /v1/runs:ack``: run id → answer (``succeeded``, ``canceled``, ``lost``)."""
        runs = [{"id": key.run_id, "lease_token": str(token)} for key, token in leases]
        return await self._answers("/v1/runs:ack", runs, {})

    async def nack(self, fails: Sequence[lifecycle.Nack]) -> dict[str, str]:
        """``POST /v1/runs:nack``: run id → answer (``failed``, ``canceled``, ``lost``)."""
        runs = [
            {
                "id": f.run_id,
                "lease_token": str(f.token),
                "error": f.error,
                "retryable": f.retryable,
                "retry_after_s": f.retry_after_s,
            }
            for f in fails
        ]
        return await self._answers("/v1/runs:nack", runs, {})

    async def check(self) -> None:
        """One request that changes nothing (an empty heartbeat): raises :class:`ApiRefused`
        or :class:`ApiUnavailable` if the API refuses the key, what aiohttp raises if unreachable."""
        await self.post("/v1/runs:heartbeat", {"runs": []})

    async def close(self) -> None:
        """Close the connection pool; never raises."""
        session, self._session = self._session, None
        if session is not None:
            try:
                await session.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
