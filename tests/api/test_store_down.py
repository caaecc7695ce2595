"""A store the API cannot reach: 503 problem+json with Retry-After, never a 500, the password never shown."""

from __future__ import annotations

import httpx
from helpers import closed_port

from scheduler.api.server import ApiThread

TOKEN = "tk_0123456789abcdef_" + "A" * 43


def test_an_unreachable_store_is_503_with_retry_after_and_no_password(caplog):
    server = ApiThread(f"postgresql://app:S3cretPassw0rd@127.0.0.1:{closed_port()}/scheduler").start()
    try:
        server.app.state.pool.timeout = 0.5  # wait half a second for a connection, not POOL_TIMEOUT_S
        response = httpx.get(f"{server.url}/v1/tenants", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["retry-after"] == "1"
        assert response.json() == {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "store: unavailable, try again",
        }
        # Without a key it is still a 401: nothing is read for a token that is not one.
        assert httpx.get(f"{server.url}/v1/tenants", timeout=30).status_code == 401
    finally:
        server.stop()
    assert "S3cretPassw0rd" not in caplog.text
