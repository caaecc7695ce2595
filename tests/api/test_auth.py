"""Authentication and roles over HTTP: 401 for every bad key (no detail), 403 for the wrong role."""

from __future__ import annotations

import httpx

UNAUTHORIZED = {"type": "about:blank", "title": "Unauthorized", "status": 401}


def _explain(api, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(
        f"{api.url}/v1/explain",
        params={"cron": "0 2 * * *", "after": "2024-01-01T00:00:00Z", "count": "1"},
        headers=headers,
    )


def test_a_key_authenticates_and_a_bad_one_gets_401(api):
    token = api.key("acme", "tenant")
    ok = _explain(api, {"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["fires"] == [{"at": "2024-01-01T02:00:00Z", "local": "2024-01-01T02:00:00+00:00"}]
    bad = _explain(api, {"Authorization": f"Bearer {token[:-2]}xx"})
    assert bad.status_code == 401
    assert bad.json() == UNAUTHORIZED
    assert bad.headers["content-type"] == "application/problem+json"
    assert bad.headers["www-authenticate"] == "Bearer"
