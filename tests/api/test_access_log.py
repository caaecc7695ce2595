"""``scheduler api --access-log``: one ``api_request`` record per request through the project's logging.

The record names the method, the path (never the query string), the status,
the duration and the client address; never a header, so never a token.
"""

from __future__ import annotations

import io
import json
import logging

import httpx
import pytest
from helpers import json_log_records

from scheduler import log as logmod
from scheduler.api.server import ApiThread
from scheduler.settings import ApiSettings

TEST_SETTINGS = ApiSettings(pool_size=2)


@pytest.fixture
def records(pg_dsn):
    """``(server with --access-log, the JSON lines its requests logged)`` (a list filled as they come)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logmod.JsonFormatter())
    logger = logmod.LOGGER
    saved = (list(logger.handlers), logger.level, logger.propagate)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    server = ApiThread(pg_dsn, "127.0.0.1", 0, TEST_SETTINGS, access_log=True).start()
    try:
        yield server, buffer
    finally:
        server.stop()
        logger.handlers[:], level, logger.propagate = saved
        logger.setLevel(level)


def _requests_logged(buffer: io.StringIO) -> list[dict]:
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    return [line for line in lines if line["event"] == "api_request"]


def test_each_request_is_one_api_request_line_without_its_query_or_token(records, pg_dsn):
    from scheduler import store
    from scheduler.api import keys

    server, buffer = records
    with store.connect(pg_dsn) as conn:
        token, _ = keys.create(conn, None, "admin", None)
    headers = {"Authorization": f"Bearer {token}"}
    ok = httpx.get(f"{server.url}/v1/tenants", params={"limit": "5"}, headers=headers)
    missing = httpx.get(f"{server.url}/v1/nope", headers=headers)
    assert (ok.status_code, missing.status_code) == (200, 404)
    server.stop()  # a record is written once the response is sent: read them all after the last
    logged = _requests_logged(buffer)
    durations = [line.pop("duration_ms") for line in logged]
    for line in logged:
        assert line.pop("ts") and line.pop("client").startswith("127.0.0.1:")
    assert logged == [
        {"level": "info", "event": "api_request", "method": "GET", "path": "/v1/tenants", "status": 200},
        {"level": "info", "event": "api_request", "method": "GET", "path": "/v1/nope", "status": 404},
    ]
    assert all(isinstance(d, float) and d >= 0 for d in durations), durations
    assert token not in buffer.getvalue() and "limit=5" not in buffer.getvalue()


def test_without_the_flag_nothing_is_logged_per_request(pg_dsn):
    with json_log_records() as records:
        server = ApiThread(pg_dsn, "127.0.0.1", 0, TEST_SETTINGS).start()
        try:
            assert httpx.get(f"{server.url}/v1/tenants").status_code == 401
        finally:
            server.stop()
    assert [r for r in records if r["event"] == "api_request"] == []
    assert [r["event"] for r in records if r["event"] == "api_listening"] == ["api_listening"]  # records were taken
