"""Request limits over HTTP: body size (413), the per-key rate (429 + Retry-After), page sizes (422)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from scheduler.api.limits import AuthThrottle, RateLimiter
from scheduler.errors import ConfigError
from scheduler.settings import MAX_API_BODY_BYTES, ApiSettings


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    return response.json()


def test_a_body_over_1_mib_by_content_length_is_413_before_it_is_read(api):
    admin = api.key(None, "admin")
    body = b'{"tenant": "' + b"a" * MAX_API_BODY_BYTES + b'"}'
    response = httpx.post(
        f"{api.url}/v1/tenants", content=body, headers=_auth(admin) | {"content-type": "application/json"}
    )
    assert _problem(response, 413) == {
        "type": "about:blank",
        "title": "Content Too Large",
        "status": 413,
        "detail": f"body: must be at most {MAX_API_BODY_BYTES} bytes",
        "field": "body",
    }


def test_a_streamed_body_over_1_mib_is_413_while_it_is_read(api):
    """Chunked transfer: no Content-Length, the limit is counted on the bytes received."""
    admin = api.key(None, "admin")
    chunk = b" " * 65536

    def chunks():
        yield b'{"tenant": "big", "weight": 1'
        for _ in range(MAX_API_BODY_BYTES // len(chunk) + 2):
            yield chunk
        yield b"}"

    response = httpx.post(
        f"{api.url}/v1/tenants", content=chunks(), headers=_auth(admin) | {"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert _problem(response, 413)["detail"] == f"body: must be at most {MAX_API_BODY_BYTES} bytes"
    listed = httpx.get(f"{api.url}/v1/tenants", headers=_auth(admin)).json()["items"]
    assert [t["tenant"] for t in listed] == []


def test_a_content_length_that_lies_low_cannot_smuggle_a_bigger_body(api):
    """A declared length under the limit with more bytes sent: the server reads only what was declared."""
    admin = api.key(None, "admin")
    body = json.dumps({"tenant": "t1"}).encode()
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + admin.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
            + body + b"x" * 100
        )  # fmt: skip
        answer = sock.recv(65536).decode("latin-1")
    assert answer.startswith("HTTP/1.1 201 "), answer


def test_a_body_just_at_the_limit_is_read(api):
    admin = api.key(None, "admin")
    body = b'{"tenant": "exact", "weight": 2}'
    body += b" " * (MAX_API_BODY_BYTES - len(body))
    response = httpx.post(
        f"{api.url}/v1/tenants", content=body, headers=_auth(admin) | {"content-type": "application/json"}
    )
    assert response.status_code == 201, response.text
    assert response.json()["weight"] == 2


def test_a_key_over_its_rate_gets_429_with_retry_after_and_other_keys_do_not(api_factory):
    """The limits' clock is pinned: Retry-After does not depend on how long the requests took
    (with a real clock, four requests taking over 1 s under load refilled half a token: "1")."""
    now = [1000.0]
    api = api_factory(ApiSettings(rate_per_s=0.5, burst=3), clock=lambda: now[0])
    token = api.key("acme", "tenant")
    other = api.key("acme", "tenant")
    params = {"cron": "* * * * *", "after": "2024-01-01T00:00:00Z", "count": "1"}

    def get(key: str) -> httpx.Response:
        return httpx.get(f"{api.url}/v1/explain", params=params, headers=_auth(key))

    assert [get(token).status_code for _ in range(3)] == [200, 200, 200]
    refused = get(token)
    body = _problem(refused, 429)
    assert refused.headers["retry-after"] == "2"  # one token at 0.5/s: 2 s
    assert body["title"] == "Too Many Requests"
    assert body["detail"] == "rate: this key may send 0.5 requests/s (bursts of 3); retry after 2 s"
    assert get(other).status_code == 200
    now[0] += 0.5  # a quarter token back: 1.5 s to wait, rounded up
    refused = get(token)
    assert (refused.status_code, refused.headers["retry-after"]) == (429, "2")
    now[0] += 0.75  # 0.625 token: 0.75 s to wait
    refused = get(token)
    assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
    assert _problem(refused, 429)["detail"].endswith("; retry after 1 s")
    now[0] += 0.75  # exactly one token
    assert get(token).status_code == 200
    assert get(token).status_code == 429


def test_the_token_bucket_refills_at_the_rate_and_caps_at_the_burst():
    now = [0.0]
    limiter = RateLimiter(rate_per_s=2.0, burst=2, clock=lambda: now[0])
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.5  # one token back
    assert limiter.take("k") == 0.0
    assert limiter.take("k") == 0.5
    now[0] = 100.0  # idle: the bucket holds burst (2) tokens, no more
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.5]
    assert limiter.take("other") == 0.0


def test_a_page_size_over_500_or_under_1_is_422_naming_limit(api):
    admin = api.key(None, "admin")
    for value, rule in (("501", "must be <= 500"), ("0", "must be >= 1"), ("-5", "must be >= 1")):
        response = httpx.get(f"{api.url}/v1/tenants", params={"limit": value}, headers=_auth(admin))
        body = _problem(response, 422)
        assert body["field"] == "limit"
        assert body["detail"] == f"limit: {rule} (got {value!r})"
    huge = "9" * 5000
    body = _problem(httpx.get(f"{api.url}/v1/tenants", params={"limit": huge}, headers=_auth(admin)), 422)
    assert body["field"] == "limit"
    assert body["detail"].startswith("limit: ")
    assert len(body["detail"]) < 300


# ---------------------------------------------------------------- failed authentication


def _bad_token(api) -> str:
    """A well-formed token of a key that exists, with the wrong secret (read from the store)."""
    token = api.key("acme", "tenant")
    return token[:-2] + ("AA" if not token.endswith("AA") else "BA")


def test_failed_authentication_is_throttled_per_client_address(api_factory):
    """Wrong keys were answered 401 as fast as a client could send them: after
    ``auth_fail_burst`` failures an address gets 429 with Retry-After, decided before the
    key is looked at, until its bucket refills; only a key this process has seen
    authenticate lately (:data:`scheduler.api.keys.KNOWN_GOOD_S`) is still checked and
    served, so a neighbour's bad keys behind one address (a NAT, a host running a
    misconfigured client) do not lock out the workers already running there."""
    api = api_factory(ApiSettings(rate_per_s=1000.0, burst=1000, auth_fail_rate_per_s=0.1, auth_fail_burst=3))
    good = api.key("acme", "tenant")
    fresh = api.key("acme", "worker")  # valid, but never used before the throttle
    bad = _bad_token(api)
    params = {"cron": "* * * * *", "after": "2024-01-01T00:00:00Z", "count": "1"}
    url = f"{api.url}/v1/explain"
    assert httpx.get(url, params=params, headers=_auth(good)).status_code == 200  # a success takes nothing
    codes = [httpx.get(url, params=params, headers=_auth(bad)).status_code for _ in range(2)]
    codes.append(httpx.get(url, params=params).status_code)  # no key at all: a failure too
    codes.append(httpx.get(url, params=params, headers=_auth(bad)).status_code)
    assert codes == [401, 401, 401, 429]
    assert httpx.get(url, params=params, headers=_auth(good)).status_code == 200  # in use here: still served
    assert httpx.get(f"{api.url}/v1/runs", headers=_auth(good)).status_code == 200
    # A wrong secret for the key in use is refused like any failure while throttled: 429, not 401.
    wrong = good[:-2] + ("AA" if not good.endswith("AA") else "BA")
    assert httpx.get(url, params=params, headers=_auth(wrong)).status_code == 429
    refused = httpx.get(url, params=params, headers=_auth(fresh))
    body = _problem(refused, 429)
    assert refused.headers["retry-after"] == "10"  # one token at 0.1/s
    assert body["detail"] == (
        "auth: too many failed authentications from this address (0.1/s, bursts of 3); retry after 10 s"
    )
    assert "www-authenticate" not in refused.headers


def test_a_forwarded_for_header_is_ignored_unless_the_proxy_is_trusted(api_factory):
    """Without ``forwarded_allow_ips`` the socket peer is the client: a client cannot get a
    fresh bucket per request by sending its own X-Forwarded-For."""
    api = api_factory(ApiSettings(auth_fail_rate_per_s=0.01, auth_fail_burst=2))
    url = f"{api.url}/v1/tenants"
    codes = [
        httpx.get(url, headers={"X-Forwarded-For": f"203.0.113.{i}", "Authorization": "Bearer x"}).status_code
        for i in range(4)
    ]
    assert codes == [401, 401, 429, 429]


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket(api_factory):
    """With the proxy trusted (``forwarded_allow_ips``), the client is X-Forwarded-For's:
    one client over its bucket never slows another's valid key or its failures."""
    api = api_factory(ApiSettings(auth_fail_rate_per_s=0.01, auth_fail_burst=2, forwarded_allow_ips="127.0.0.1"))
    good = api.key(None, "admin")
    url = f"{api.url}/v1/tenants"

    def get(client: str, token: str) -> int:
        return httpx.get(url, headers={"X-Forwarded-For": client} | _auth(token)).status_code

    assert [get("203.0.113.7", "tk_bad") for _ in range(3)] == [401, 401, 429]
    assert get("203.0.113.7", good) == 429
    assert get("203.0.113.8", good) == 200
    assert [get("203.0.113.8", "tk_bad") for _ in range(3)] == [401, 401, 429]
    assert get("2001:db8::1", "tk_bad") == 401


def test_the_failure_buckets_are_bounded_and_ipv6_clients_share_a_64():
    now = [0.0]
    throttle = AuthThrottle(rate_per_s=1.0, burst=2, max_clients=3, clock=lambda: now[0])
    for _ in range(2):
        throttle.failed("198.51.100.1")
    assert throttle.wait_s("198.51.100.1") == 1.0
    assert throttle.wait_s("198.51.100.2") == 0.0
    # One host's /64 is one client: rotating the low bits gives no fresh bucket.
    throttle.failed("2001:db8:0:1::1")
    throttle.failed("2001:db8:0:1::ffff")
    assert throttle.wait_s("2001:db8:0:1:abcd::9") == 1.0
    assert throttle.wait_s("2001:db8:0:2::1") == 0.0
    # At most max_clients buckets: the least recently failed is dropped first.
    throttle.failed("198.51.100.3")
    throttle.failed("198.51.100.4")
    assert len(throttle) == 3
    assert throttle.wait_s("198.51.100.1") == 0.0  # evicted
    assert throttle.wait_s("2001:db8:0:1::1") == 1.0
    now[0] = 1.0  # refilled at 1/s
    assert throttle.wait_s("2001:db8:0:1::1") == 0.0


def test_the_throttle_and_proxy_settings_are_checked():
    assert ApiSettings(forwarded_allow_ips="10.0.0.0/8, 127.0.0.1,::1").check().forwarded_allow_ips
    assert ApiSettings(forwarded_allow_ips="*").check()
    for settings, message in (
        (
            ApiSettings(forwarded_allow_ips="proxy.example"),
            "api_forwarded_allow_ips: must be comma-separated IP addresses or networks of trusted proxies, or * "
            "(got 'proxy.example')",
        ),
        (ApiSettings(auth_fail_burst=0), "api_auth_fail_burst: must be a whole number from 1 to 1000000 (got 0)"),
        (ApiSettings(auth_fail_rate_per_s=0.0), "api_auth_fail_rate_per_s: must be a finite number > 0 (got 0.0)"),
    ):
        with pytest.raises(ConfigError) as caught:
            settings.check()
        assert str(caught.value) == message
