"""Fixtures of the HTTP API tests: the real application under uvicorn, spoken to over HTTP.

``api`` (function)
    :class:`RunningApi`: the app (:func:`scheduler.api.app.create_app`) served
    by uvicorn on a thread on a free loopback port against a fresh test
    database (``pg_dsn``), with a rate limit high enough never to get in a
    test's way. ``.url`` is ``http://127.0.0.1:<port>``; ``.key(tenant,
    role)`` creates the tenant if needed and a key, and returns its token;
    ``.dsn`` is the database. Tests talk to it with ``httpx``.
``api_factory`` (function)
    ``api_factory(settings=ApiSettings(...), clock=time.monotonic) -> RunningApi``:
    more servers on the same database, with other settings (e.g. a low rate
    for the 429 test) and the clock of their rate limits (a test pins one).
    All are stopped after the test.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import pytest

from scheduler import jobs, store
from scheduler.api import keys
from scheduler.api.server import ApiThread
from scheduler.settings import ApiSettings

TEST_SETTINGS = ApiSettings(
    rate_per_s=100_000.0, burst=100_000, pool_size=4, auth_fail_rate_per_s=100_000.0, auth_fail_burst=100_000
)
"""The ``api`` fixture's settings: the default limits but rates (per key, and of failed
authentications per address) no test reaches by accident."""


@dataclasses.dataclass
class RunningApi:
    """A served app: its base ``url``, its database ``dsn`` and the server thread."""

    url: str
    dsn: str
    server: ApiThread

    def key(self, tenant: str | None, role: str, name: str | None = None) -> str:
        """A new key's token for ``tenant`` (created if missing; None for admin) with ``role``."""
        with store.connect(self.dsn, application_name="pytest-api") as conn:
            if tenant is not None:
                jobs.add_tenant(conn, tenant)
            token, _ = keys.create(conn, tenant, role, name)
        return token


@pytest.fixture
def api_factory(pg_dsn: str) -> Iterator[Callable[..., RunningApi]]:
    started: list[ApiThread] = []

    def make(settings: ApiSettings = TEST_SETTINGS, clock: Callable[[], float] = time.monotonic) -> RunningApi:
        server = ApiThread(pg_dsn, "127.0.0.1", 0, settings, clock=clock).start()
        started.append(server)
        return RunningApi(url=server.url, dsn=pg_dsn, server=server)

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def api(api_factory: Callable[..., RunningApi]) -> RunningApi:
    return api_factory()
