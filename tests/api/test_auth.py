"""Authentication and roles over HTTP: 401 for every bad key (no detail), 403 for the wrong role."""

from __future__ import annotations

import httpx
import pytest

from scheduler import store
from scheduler.api import keys

UNAUTHORIZED = {"type": "about:blank", "title": "Unauthorized", "status": 401}
EXPLAIN = {"cron": "0 2 * * *", "after": "2024-01-01T00:00:00Z", "count": "1"}


def _explain(api, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(f"{api.url}/v1/explain", params=EXPLAIN, headers=headers)


def _assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == UNAUTHORIZED
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_key_authenticates_and_a_bad_one_gets_401(api):
    token = api.key("acme", "tenant")
    ok = _explain(api, {"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["fires"] == [{"at": "2024-01-01T02:00:00Z", "local": "2024-01-01T02:00:00+00:00"}]
    _assert_401(_explain(api, {"Authorization": f"Bearer {token[:-2]}xx"}))


def test_the_scheme_is_case_insensitive_and_extra_spaces_are_ignored(api):
    token = api.key("acme", "worker")
    assert _explain(api, {"Authorization": f"bearer   {token}"}).status_code == 200


def _wrong_secret(token: str) -> str:
    """The same key id with another (well-formed) secret."""
    key_id, _ = keys.parse_token(token)
    other = "A" * 42 + "A"
    assert keys.parse_token(f"tk_{key_id}_{other}") is not None
    return f"tk_{key_id}_{other}"


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Token {token}",
        "{token}",
        "Bearer {token}x",
        "Bearer {token_upper}",
        "Bearer tk_0000000000000000_" + "A" * 43,
        "Bearer {wrong_secret}",
        "Bearer {token} {token}",
        "Bearer " + "x" * 5000,
    ],
)
def test_missing_malformed_unknown_and_wrong_keys_get_401_with_no_detail(api, header):
    token = api.key("acme", "tenant")
    headers = {}
    if header is not None:
        headers["Authorization"] = header.format(
            token=token, token_upper=token.upper(), wrong_secret=_wrong_secret(token)
        )
    _assert_401(_explain(api, headers))


def test_a_revoked_key_gets_401(api):
    token = api.key("acme", "tenant")
    key_id, _ = keys.parse_token(token)
    with store.connect(api.dsn) as conn:
        row = keys.revoke(conn, key_id)
    assert row["key_id"] == key_id and row["revoked_at"] is not None
    _assert_401(_explain(api, {"Authorization": f"Bearer {token}"}))


def test_a_revoked_key_in_use_is_refused_after_the_cache_second(api):
    """The verifier reuses a key row for at most CACHE_TTL_S (1 s): revocation is honoured then."""
    token = api.key("acme", "tenant")
    headers = {"Authorization": f"Bearer {token}"}
    assert _explain(api, headers).status_code == 200
    verifier = api.server.app.state.keys
    now = [1000.0]
    verifier.clock = lambda: now[0]
    assert _explain(api, headers).status_code == 200  # row read at t=1000 (the clock changed)
    with store.connect(api.dsn) as conn:
        keys.revoke(conn, keys.parse_token(token)[0])
    now[0] += keys.CACHE_TTL_S - 0.01
    assert _explain(api, headers).status_code == 200  # still within the cached second
    now[0] += 0.02
    _assert_401(_explain(api, headers))


def test_the_wrong_role_gets_403_naming_the_role(api):
    worker = api.key("acme", "worker")
    tenant = api.key("acme", "tenant")
    admin = api.key(None, "admin")
    for token, role in ((worker, "worker"), (tenant, "tenant")):
        response = httpx.get(f"{api.url}/v1/tenants", headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 403, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json() == {
            "type": "about:blank",
            "title": "Forbidden",
            "status": 403,
            "detail": f"role: a {role} key cannot use this endpoint (it needs an admin key)",
        }
    assert httpx.get(f"{api.url}/v1/tenants", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    assert _explain(api, {"Authorization": f"Bearer {admin}"}).status_code == 200
    # An admin key on a worker's endpoint: "an admin key" (it said "a admin key").
    response = httpx.post(f"{api.url}/v1/runs:claim", json={}, headers={"Authorization": f"Bearer {admin}"})
    assert (response.status_code, response.json()["detail"]) == (
        403,
        "role: an admin key cannot use this endpoint (it needs a worker or tenant key)",
    )


def test_last_used_at_is_recorded_and_the_secret_is_never_listed(api):
    token = api.key("acme", "tenant", name="ci")
    key_id, secret = keys.parse_token(token)
    assert _explain(api, {"Authorization": f"Bearer {token}"}).status_code == 200
    with store.connect(api.dsn) as conn:
        [row] = keys.list_keys(conn, "acme")
    assert set(row) == {"key_id", "tenant", "role", "name", "created_at", "revoked_at", "last_used_at"}
    assert (row["key_id"], row["tenant"], row["role"], row["name"]) == (key_id, "acme", "tenant", "ci")
    assert row["last_used_at"] is not None and row["revoked_at"] is None


def test_without_a_key_even_invalid_input_gets_only_401(api):
    """Authentication comes first: no validation detail leaks to a caller without a key."""
    for method, path, kwargs in (
        ("POST", "/v1/tenants", {"content": b"\xff not json", "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/tenants", {"json": {"tenant": "-bad", "weight": -1}}),
        ("PATCH", "/v1/tenants/-bad", {"json": {"weight": "x"}}),
        ("GET", "/v1/explain", {"params": {"cron": "61 * * * *", "count": "0"}}),
        ("GET", "/v1/keys", {"params": {"cursor": "!!!", "limit": "9999"}}),
        ("POST", "/v1/keys/zzz:revoke", {}),
    ):
        _assert_401(httpx.request(method, f"{api.url}{path}", **kwargs))


def test_two_authorization_headers_are_refused_whichever_comes_last(api):
    """A trial: with two ``Authorization`` headers the last one was used, so a proxy that
    appends one could switch the request's tenant. Ambiguous credentials are a 400 naming
    the header, before either key is looked at; nothing is served."""
    acme, other = api.key("acme", "tenant"), api.key("other", "tenant")
    expected = {
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "authorization: must be sent once (got 2 Authorization headers)",
        "field": "authorization",
    }
    for first, second in ((acme, other), (other, acme), (acme, "garbage")):
        response = httpx.get(
            f"{api.url}/v1/schedules",
            headers=[("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")],
        )
        assert (response.status_code, response.json()) == (400, expected), response.text
        assert response.headers["content-type"] == "application/problem+json"
    assert httpx.get(f"{api.url}/v1/schedules", headers={"Authorization": f"Bearer {acme}"}).status_code == 200
