"""Request signatures, Retry-After and status rules of pushes (scheduler/delivery/signing.py, push.py)."""

from __future__ import annotations

import email.utils
import hashlib
import hmac

import pytest

from scheduler.delivery import signing
from scheduler.delivery.push import MAX_RETRY_AFTER_S, classify, parse_retry_after, request_body, rfc3339
from scheduler.delivery.signing import SignatureError, sign, verify
from scheduler.errors import ConfigError
from scheduler.settings import Settings

BODY = b'{"k":1}'
T = 1_767_225_600


def test_the_signature_is_hmac_sha256_of_t_dot_body_in_hex() -> None:
    expected = hmac.new(b"whsec_a", b"1767225600." + BODY, hashlib.sha256).hexdigest()
    assert sign(BODY, ["whsec_a"], T) == f"t={T},v1={expected}"
    assert sign(BODY, ["whsec_b", "whsec_a"], T) == f"t={T},v1={signing.signature('whsec_b', T, BODY)},v1={expected}"
    with pytest.raises(ValueError):
        sign(BODY, [], T)


def test_verify_accepts_any_listed_secret_within_the_tolerance() -> None:
    header = sign(BODY, ["whsec_new", "whsec_old"], T)
    assert verify(header, BODY, ["whsec_old"], now=T + 300) == T
    assert verify(header, BODY, ["whsec_other", "whsec_new"], now=T - 300) == T
    assert verify(header, BODY, ["whsec_new"], tolerance_s=10, now=T + 10) == T


def test_verify_takes_the_body_as_bytes_or_as_str_encoded_utf8() -> None:
    body = '{"name":"café"}'
    header = sign(body.encode("utf-8"), ["whsec_a"], T)
    assert verify(header, body, ["whsec_a"], now=T) == T
    assert verify(header, body.encode("utf-8"), ["whsec_a"], now=T) == T
    assert verify(header, bytearray(body.encode("utf-8")), ["whsec_a"], now=T) == T
    with pytest.raises(SignatureError, match="no signature matches"):
        verify(header, body + " ", ["whsec_a"], now=T)
    with pytest.raises(TypeError, match=r"^verify: body must be the raw request body, bytes or str \(got dict\)$"):
        verify(header, {"name": "café"}, ["whsec_a"], now=T)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "body", "secrets", "now", "message"),
    [
        (None, BODY, ["whsec_a"], T, "Scheduler-Signature header missing"),
        ("v1=abc", BODY, ["whsec_a"], T, "no t=<unix seconds>"),
        (f"t={T}", BODY, ["whsec_a"], T, "no v1=<signature>"),
        (f"t={T},t={T},v1=ab", BODY, ["whsec_a"], T, "t must appear once"),
        ("t=soon,v1=ab", BODY, ["whsec_a"], T, "t must appear once"),
        (sign(BODY, ["whsec_a"], T), BODY, ["whsec_a"], T + 301, "outside the tolerance of 300s"),
        (sign(BODY, ["whsec_a"], T), BODY, ["whsec_a"], T - 301, "outside the tolerance of 300s"),
        (sign(BODY, ["whsec_a"], T), BODY + b" ", ["whsec_a"], T, "no signature matches"),
        (sign(BODY, ["whsec_a"], T), BODY, ["whsec_b"], T, "no signature matches"),
        (sign(BODY, ["whsec_a"], T).replace(f"t={T}", f"t={T + 1}"), BODY, ["whsec_a"], T, "no signature matches"),
        (sign(BODY, ["whsec_a"], T), BODY, [], T, "no signature matches"),
    ],
)
def test_verify_refuses(header, body, secrets, now, message) -> None:
    with pytest.raises(SignatureError, match=message):
        verify(header, body, secrets, now=now)


def test_unknown_schemes_in_the_header_are_ignored() -> None:
    header = sign(BODY, ["whsec_a"], T) + ",v0=deadbeef"
    assert signing.parse(header) == (T, [signing.signature("whsec_a", T, BODY)])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("120", 120.0),
        (" 0 ", 0.0),
        ("99999999", MAX_RETRY_AFTER_S),
        (email.utils.formatdate(1_000_030, usegmt=True), 30.0),
        (email.utils.formatdate(999_000, usegmt=True), 0.0),  # in the past: at once
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_is_seconds_or_an_http_date_capped(value, expected) -> None:
    assert parse_retry_after(value, 1_000_000.0) == expected


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "succeeded"),
        (204, "succeeded"),
        (299, "succeeded"),
        (408, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (599, "retry"),
        (301, "failed"),
        (304, "failed"),
        (400, "failed"),
        (401, "failed"),
        (404, "failed"),
        (410, "failed"),
        (422, "failed"),
        (100, "failed"),
    ],
)
def test_status_rules(status, outcome) -> None:
    assert classify(status) == outcome


def test_body_and_times() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    assert request_body(None) == b"null"
    assert request_body({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert rfc3339(datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)) == "2031-03-04T05:06:07Z"
    paris = timezone(timedelta(hours=1))
    assert rfc3339(datetime(2031, 3, 4, 6, 6, 7, 250, tzinfo=paris)) == "2031-03-04T05:06:07.000250Z"


def test_push_settings_are_checked() -> None:
    assert Settings(push_allow="10.0.0.0/8, 127.0.0.1").validated().push_policy.allows("127.0.0.1")
    assert not Settings().validated().push_policy.allows("127.0.0.1")
    with pytest.raises(ConfigError, match="push_allow: must be a comma-separated list"):
        Settings(push_allow="10.0.0.0/33").validated()
    with pytest.raises(ConfigError, match="push_concurrency: must be a whole number from 1 to 10000"):
        Settings(push_concurrency=0).validated()
    with pytest.raises(ConfigError, match="push_per_host: must be a whole number from 1 to 10000"):
        Settings(push_per_host=10_001).validated()
