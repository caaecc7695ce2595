"""Every validation rule of a job's delivery spec (scheduler/delivery/targets.py).

Each refusal is asserted by its exact one-line message, which names the
field and the rule; hostile input (NaN, megabytes of text, bytes that are
not UTF-8, JSON nested thousands deep) gets the same kind of line, never a
traceback. No store needed.
"""

from __future__ import annotations

import json

import pytest

from scheduler.delivery.ssrf import AddressPolicy
from scheduler.delivery.targets import (
    MAX_PAYLOAD_BYTES,
    DeliverySpec,
    check_targets,
    parse_payload,
    target_text,
)
from scheduler.errors import ValidationError
from scheduler.identity import identity_of
from scheduler.spec import JobSpec

URL = "https://93.184.216.34/hook"


def refused(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        DeliverySpec.build(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- defaults


def test_defaults_are_the_tenants_default_queue_and_the_documented_policy() -> None:
    spec = DeliverySpec.build()
    assert spec == DeliverySpec(
        queue="default",
        url=None,
        method=None,
        headers=(),
        timeout_s=None,
        payload=None,
        max_attempts=5,
        backoff_base_s=1.0,
        backoff_cap_s=300.0,
        max_age_s=None,
        overlap="allow",
    )
    assert spec.delivery_row() is None
    assert spec.job_fields() == {"queue": "default", "overlap": "allow"}
    assert JobSpec.build(tenant="acme", cron="* * * * *").delivery == spec


def test_a_url_target_defaults_to_post_and_ten_seconds_and_has_no_queue() -> None:
    spec = DeliverySpec.build(url=URL)
    assert (spec.queue, spec.url, spec.method, spec.timeout_s, spec.headers) == (None, URL, "POST", 10.0, ())
    assert spec.job_fields() == {"queue": None, "overlap": "allow"}
    assert spec.delivery_row() == {
        "url": URL,
        "method": "POST",
        "headers": None,
        "timeout_s": 10.0,
        "payload": None,
        "max_attempts": 5,
        "backoff_base_s": 1.0,
        "backoff_cap_s": 300.0,
        "max_age_s": None,
    }


def test_every_field_parsed_from_text() -> None:
    spec = DeliverySpec.build(
        url=URL,
        method="put",
        headers=["X-Team: blue ", "Authorization:Bearer s3cret"],
        timeout_s="2.5",
        payload='{ "b": [1, 2.5, "é"], "a": null }',
        max_attempts="7",
        backoff_base_s="0.5",
        backoff_cap_s="60",
        max_age_s="1d12h",
        overlap="buffer_one",
    )
    assert spec == DeliverySpec(
        queue=None,
        url=URL,
        method="PUT",
        headers=(("Authorization", "Bearer s3cret"), ("X-Team", "blue")),
        timeout_s=2.5,
        payload='{"b":[1,2.5,"é"],"a":null}',
        max_attempts=7,
        backoff_base_s=0.5,
        backoff_cap_s=60.0,
        max_age_s=129_600,
        overlap="buffer_one",
    )
    assert spec.delivery_row()["headers"] == '{"Authorization": "Bearer s3cret", "X-Team": "blue"}'


def test_a_queue_with_only_a_payload_or_a_policy_needs_a_row_overlap_alone_does_not() -> None:
    assert DeliverySpec.build(queue="emails", overlap="forbid").delivery_row() is None
    assert DeliverySpec.build(payload="{}").delivery_row()["payload"] == "{}"
    assert DeliverySpec.build(max_attempts=1).delivery_row()["max_attempts"] == 1
    assert DeliverySpec.build(max_age_s=60).delivery_row()["max_age_s"] == 60
    assert DeliverySpec.build(backoff_cap_s=10).delivery_row()["backoff_cap_s"] == 10.0


def test_a_json_null_payload_is_no_payload() -> None:
    assert DeliverySpec.build(payload="null").payload is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1", 1), ("90m", 5_400), ("12h", 43_200), ("7d", 604_800), ("1d12h", 129_600), ("30d", 2_592_000), (45, 45)],
)
def test_max_age_forms(text, seconds) -> None:
    assert DeliverySpec.build(max_age_s=text).max_age_s == seconds


# ---------------------------------------------------------------- target


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queue": "q", "url": URL}, "target: give either --queue or --url, not both"),
        ({"queue": ""}, "queue: must be 1-100 characters of letters, digits and . _ - (got '')"),
        ({"queue": "a b"}, "queue: must be 1-100 characters of letters, digits and . _ - (got 'a b')"),
        ({"queue": "q\n"}, "queue: must be 1-100 characters of letters, digits and . _ - (got 'q\\n')"),
        ({"queue": "é"}, "queue: must be 1-100 characters of letters, digits and . _ - (got 'é')"),
        (
            {"queue": "q" * 101},
            f"queue: must be 1-100 characters of letters, digits and . _ - (got '{'q' * 80}…' (101 characters))",
        ),
        ({"method": "POST"}, "method: applies to --url targets only"),
        ({"headers": ["A: b"]}, "header: applies to --url targets only"),
        ({"timeout_s": 5}, "timeout_s: applies to --url targets only"),
        ({"url": URL, "method": "GET"}, "method: must be one of POST, PUT (got 'GET')"),
        ({"url": "ftp://93.184.216.34/x"}, "url: scheme must be http or https (got 'ftp')"),
        (
            {"url": "https://u:p@93.184.216.34/"},
            "url: must not carry user:password (send credentials as a header) (got '93.184.216.34')",
        ),
        ({"url": "https:///path"}, "url: must name a host (got 'https:///***')"),
        (  # a trial: was "host does not resolve" (the resolver does not take %25eth0)
            {"url": "http://[fe80::1%25eth0]/x"},
            "url: must not name an IPv6 zone (%25...: push targets are reached without one) "
            "(got 'http://[fe80::1%25eth0]/***')",
        ),
        (  # a trial: urlsplit takes an "IPvFuture" literal, whose text then went to the resolver as a name
            {"url": "http://[v1.x]/"},
            "url: must be an http(s) URL with a valid host and port (got 'http://[v1.x]/')",
        ),
        (
            {"url": "http://[1.2.3.4]/"},
            "url: must be an http(s) URL with a valid host and port (got 'http://[1.2.3.4]/')",
        ),
        ({"url": "http://example.com:0/"}, "url: port must be 1-65535 (got 'http://example.com:0/')"),
        (  # never sent (HTTP has no fragment on the wire): the endpoint would not see it
            {"url": "https://93.184.216.34/hook#v2"},
            "url: must not carry a #fragment (it is never sent to the endpoint) (got 'https://93.184.216.34/***#***')",
        ),
        (
            {"url": "https://93.184.216.34/hook#"},
            "url: must not carry a #fragment (it is never sent to the endpoint) (got 'https://93.184.216.34/***#***')",
        ),
        ({"url": "https://[2606:2800::1]:00/x"}, "url: port must be 1-65535 (got 'https://[2606:2800::1]:00/***')"),
    ],
)
def test_target_rules(kwargs, message) -> None:
    assert refused(**kwargs) == message


def test_ports_1_and_65535_are_accepted() -> None:
    assert DeliverySpec.build(url="http://93.184.216.34:1/").target_text() == "POST http://93.184.216.34:1"
    assert DeliverySpec.build(url="http://93.184.216.34:65535/").target_text() == "POST http://93.184.216.34:65535"


def test_queue_limits_accepted() -> None:
    assert DeliverySpec.build(queue="A-z_0.9" + "q" * 93).queue == "A-z_0.9" + "q" * 93


def test_validated_refuses_a_spec_built_with_both_or_neither_target() -> None:
    with pytest.raises(ValidationError) as info:
        DeliverySpec(queue="q", url=URL, method="POST", timeout_s=1.0).validated()
    assert str(info.value) == "target: give exactly one of --queue or --url"
    with pytest.raises(ValidationError) as info:
        DeliverySpec(queue=None).validated()
    assert str(info.value) == "target: give exactly one of --queue or --url"


# ---------------------------------------------------------------- headers


NAME_RULE = "header: name must be 1-100 characters of letters, digits and !#$%&'*+.^_`|~-"
VALUE_RULE = "must be at most 4096 characters of printable ASCII (no CR, LF or other control characters)"
RESERVED = "header: name is set by the engine or breaks HTTP (Host, Content-*, Scheduler-*, ...)"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("no colon", "header: must be 'Name: value' (got 'no')"),
        # The colon forgotten before a secret: only what could be the name is echoed.
        ("Authorization Bearer sekrit123", "header: must be 'Name: value' (got 'Authorization')"),
        (": value", f"{NAME_RULE} (got '')"),
        ("Bad Name: v", f"{NAME_RULE} (got 'Bad Name')"),
        ("Bad(Name): v", f"{NAME_RULE} (got 'Bad(Name)')"),
        ("X" * 101 + ": v", f"{NAME_RULE} (got '{'X' * 80}…' (101 characters))"),
        ("X-Token: a\r\nHost: evil", f"header: value of X-Token {VALUE_RULE}"),
        ("X-Token: a\nb", f"header: value of X-Token {VALUE_RULE}"),
        ("X-Token: a\x00b", f"header: value of X-Token {VALUE_RULE}"),
        ("X-Token: é", f"header: value of X-Token {VALUE_RULE}"),
        ("X-Token: " + "v" * 4097, f"header: value of X-Token {VALUE_RULE}"),
        ("Host: a", f"{RESERVED} (got 'Host')"),
        ("content-length: 1", f"{RESERVED} (got 'content-length')"),
        ("Content-Type: text/plain", f"{RESERVED} (got 'Content-Type')"),
        # The body is always plain JSON: a Content-Encoding (or -Range, -MD5) would lie about it.
        ("Content-Encoding: gzip", f"{RESERVED} (got 'Content-Encoding')"),
        ("content-range: bytes 0-1/2", f"{RESERVED} (got 'content-range')"),
        ("Content-MD5: x", f"{RESERVED} (got 'Content-MD5')"),
        ("Transfer-Encoding: chunked", f"{RESERVED} (got 'Transfer-Encoding')"),
        ("Connection: close", f"{RESERVED} (got 'Connection')"),
        ("Idempotency-Key: x", f"{RESERVED} (got 'Idempotency-Key')"),
        ("Scheduler-Signature: x", f"{RESERVED} (got 'Scheduler-Signature')"),
        ("SCHEDULER-RUN: x", f"{RESERVED} (got 'SCHEDULER-RUN')"),
    ],
)
def test_header_rules(header, message) -> None:
    assert refused(url=URL, headers=[header]) == message


def test_header_value_is_never_echoed() -> None:
    message = refused(url=URL, headers=["Authorization: Bearer topsecret\r"])
    assert "topsecret" not in message


def test_headers_at_most_twenty_no_name_twice() -> None:
    twenty = [f"X-H{i}: {i}" for i in range(20)]
    assert len(DeliverySpec.build(url=URL, headers=twenty).headers) == 20
    assert refused(url=URL, headers=[*twenty, "X-More: 1"]) == "header: at most 20 headers (got '21 or more')"
    assert refused(url=URL, headers=["X-A: 1", "x-a: 2"]) == "header: name given twice (got 'x-a')"


def test_headers_as_a_mapping() -> None:
    spec = DeliverySpec.build(url=URL, headers={"b-h": "2", "A-H": " 1 "})
    assert spec.headers == (("A-H", "1"), ("b-h", "2"))


# ---------------------------------------------------------------- numbers


TIMEOUT = "timeout_s: must be a number of seconds above 0 and at most 300, in ASCII digits"
ATTEMPTS = "max_attempts: must be a whole number from 1 to 100 in ASCII digits"
BACKOFF = "must be a number of seconds above 0 and at most 86400, in ASCII digits"
MAX_AGE = (
    "max_age_s: must be a duration from 1 second to 30 days (2592000 s): whole seconds, "
    "or e.g. 90m, 12h, 7d, 1d12h (ASCII digits)"
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": URL, "timeout_s": "0"}, f"{TIMEOUT} (got '0')"),
        ({"url": URL, "timeout_s": "-1"}, f"{TIMEOUT} (got '-1')"),
        ({"url": URL, "timeout_s": "300.001"}, f"{TIMEOUT} (got '300.001')"),
        ({"url": URL, "timeout_s": "nan"}, f"{TIMEOUT} (got 'nan')"),
        ({"url": URL, "timeout_s": float("nan")}, f"{TIMEOUT} (got nan)"),
        ({"url": URL, "timeout_s": "inf"}, f"{TIMEOUT} (got 'inf')"),
        ({"url": URL, "timeout_s": "1e999"}, f"{TIMEOUT} (got '1e999')"),
        ({"url": URL, "timeout_s": "٥"}, f"{TIMEOUT} (got '٥')"),
        ({"url": URL, "timeout_s": True}, f"{TIMEOUT} (got true)"),
        ({"max_attempts": "0"}, f"{ATTEMPTS} (got '0')"),
        ({"max_attempts": "101"}, f"{ATTEMPTS} (got '101')"),
        ({"max_attempts": "1.5"}, f"{ATTEMPTS} (got '1.5')"),
        ({"max_attempts": "٥"}, f"{ATTEMPTS} (got '٥')"),
        ({"max_attempts": "9" * 5000}, f"{ATTEMPTS} (got '{'9' * 80}…' (5000 characters))"),
        ({"backoff_base_s": "0"}, f"backoff_base_s: {BACKOFF} (got '0')"),
        ({"backoff_base_s": "NaN"}, f"backoff_base_s: {BACKOFF} (got 'NaN')"),
        ({"backoff_cap_s": "86400.5"}, f"backoff_cap_s: {BACKOFF} (got '86400.5')"),
        ({"backoff_cap_s": "-0"}, f"backoff_cap_s: {BACKOFF} (got '-0')"),
        (  # a trial: only the cap was given, and the refusal blamed the base (and its variable went unnamed)
            {"backoff_cap_s": "0.5"},
            "backoff_cap_s: must not be below --backoff-base-s (1 s, its default) (got '0.5')",
        ),
        (
            {"backoff_base_s": "10", "backoff_cap_s": "5"},
            "backoff_base_s: must not exceed --backoff-cap-s (5 s) (got '10')",
        ),
        ({"backoff_base_s": "301"}, "backoff_base_s: must not exceed --backoff-cap-s (300 s) (got '301')"),
        ({"max_age_s": "0"}, f"{MAX_AGE} (got '0')"),
        ({"max_age_s": "0s"}, f"{MAX_AGE} (got '0s')"),
        ({"max_age_s": "31d"}, f"{MAX_AGE} (got '31d')"),
        ({"max_age_s": "2592001"}, f"{MAX_AGE} (got '2592001')"),
        ({"max_age_s": "1.5h"}, f"{MAX_AGE} (got '1.5h')"),
        ({"max_age_s": "1w"}, f"{MAX_AGE} (got '1w')"),
        ({"max_age_s": "٥m"}, f"{MAX_AGE} (got '٥m')"),
        ({"max_age_s": ""}, f"{MAX_AGE} (got '')"),
        ({"overlap": "skip"}, "overlap: must be one of allow, forbid, buffer_one, replace (got 'skip')"),
    ],
)
def test_number_and_policy_rules(kwargs, message) -> None:
    assert refused(**kwargs) == message


def test_number_bounds_accepted() -> None:
    spec = DeliverySpec.build(
        url=URL, timeout_s="300", max_attempts="100", backoff_base_s="86400", backoff_cap_s="86400", max_age_s="30d"
    )
    assert (spec.timeout_s, spec.max_attempts, spec.backoff_base_s, spec.backoff_cap_s, spec.max_age_s) == (
        300.0,
        100,
        86_400.0,
        86_400.0,
        2_592_000,
    )
    assert DeliverySpec.build(url=URL, timeout_s="0.001", max_attempts=1, backoff_base_s="1e-3").timeout_s == 0.001


# ---------------------------------------------------------------- payload


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("", "payload: must be valid JSON (Expecting value at line 1 column 1)"),
        ("{", "payload: must be valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
        ("NaN", "payload: must be valid JSON (NaN and Infinity are not JSON) (got 'NaN')"),
        ('{"a": Infinity}', "payload: must be valid JSON (NaN and Infinity are not JSON) (got 'Infinity')"),
        ("1e999", "payload: numbers must be finite double-precision values (got '1e999')"),
        ('"a\\u0000b"', "payload: strings must not contain \\u0000 (the store cannot keep it)"),
        ('{"\\u0000": 1}', "payload: strings must not contain \\u0000 (the store cannot keep it)"),
        ('"\\ud800"', "payload: must be valid Unicode (an unpaired surrogate escape, e.g. \\ud800)"),
        (b'"\xff"', "payload: must be UTF-8 text (bad byte at offset 1)"),
        ("[" * 65 + "]" * 65, "payload: must nest arrays and objects at most 64 deep"),
        ("[" * 100_000, "payload: must nest arrays and objects at most 64 deep"),
        ('{"a":' * 65 + "1" + "}" * 65, "payload: must nest arrays and objects at most 64 deep"),
        (
            '"' + "x" * 65_535 + '"',
            "payload: is 65,537 bytes as compact UTF-8 JSON; the limit is 65,536 bytes (64 kB)",
        ),
        (
            '"' + "é" * 40_000 + '"',
            "payload: is 80,002 bytes as compact UTF-8 JSON; the limit is 65,536 bytes (64 kB)",
        ),
        (
            "x" * 10_000_000,
            "payload: input is 10,000,000 bytes or characters; at most 1,048,576 are read "
            "(and the compact JSON may be at most 65,536 bytes)",
        ),
        (12, "payload: must be JSON text (got 'int')"),
        ('{"a":1,"a":2}', "payload: must not give an object key twice (got 'a')"),
        ('[{"x":{"k":[{"b":1, "b":1}]}}]', "payload: must not give an object key twice (got 'b')"),
        ('{"\\u00e9":1,"é":2}', "payload: must not give an object key twice (got 'é')"),
        # Python refuses to convert integers of more than 4,300 digits: a traceback from the CLI.
        ('{"a":' + "9" * 5000 + "}", "payload: numbers must have at most 4300 digits (got '99999999999999999999...')"),
        ("-" + "1" * 4301, "payload: numbers must have at most 4300 digits (got '-1111111111111111111...')"),
    ],
)
def test_payload_rules(payload, message) -> None:
    assert refused(payload=payload) == message


def test_payload_at_the_limit_and_compacted_before_measuring() -> None:
    exactly = '"' + "x" * (MAX_PAYLOAD_BYTES - 2) + '"'
    assert DeliverySpec.build(payload=exactly).payload == exactly
    pretty = json.dumps({"k": "x" * (MAX_PAYLOAD_BYTES - 8)}, indent=8)  # 65,536 compact, more as typed
    assert len(pretty) > MAX_PAYLOAD_BYTES
    assert len(parse_payload(pretty).encode()) == MAX_PAYLOAD_BYTES
    deep = "[" * 64 + "]" * 64
    assert parse_payload(deep) == deep


def test_arguments_that_were_not_utf8_are_refused_in_one_line() -> None:
    # Python hands undecodable argv bytes over as lone surrogates (surrogateescape).
    assert (
        refused(payload='"caf\udce9"') == "payload: must be valid Unicode (an unpaired surrogate escape, e.g. \\ud800)"
    )
    assert (
        refused(queue="caf\udce9") == "queue: must be 1-100 characters of letters, digits and . _ - (got 'caf\\udce9')"
    )
    assert (
        refused(url="https://caf\udce9.example/") == f"url: {URL_CHARACTERS_RULE} (got 'https://caf\\udce9.example/')"
    )
    assert refused(url=URL, headers=["X-A: caf\udce9"]) == f"header: value of X-A {VALUE_RULE}"


URL_CHARACTERS_RULE = "must not contain spaces or unprintable characters (percent-encode them: a space is %20)"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://93.184.216.34/a b", f"url: {URL_CHARACTERS_RULE} (got 'https://93.184.216.34/***')"),
        ("https://93.184.216.34/a\tb", f"url: {URL_CHARACTERS_RULE} (got 'https://93.184.216.34/***')"),
        ("https://exa mple.com/", f"url: {URL_CHARACTERS_RULE} (got 'https://exa mple.com/')"),
        ("https://a.example/" + "x" * 2100, "url: must be at most 2048 characters (got 'https://a.example/***')"),
        ("", "url: must be an http(s) URL (got '')"),
    ],
)
def test_a_malformed_url_is_refused_by_the_rule_it_breaks(url: str, message: str) -> None:
    """A space or a tab was refused by the length rule ('of at most 2048 characters'; a trial)."""
    assert refused(url=url).startswith(message)


def test_keys_differing_in_case_or_level_are_not_duplicates() -> None:
    assert parse_payload('{"a":1,"A":2,"b":{"a":3}}') == '{"a":1,"A":2,"b":{"a":3}}'


def test_payload_accepts_bytes_and_keeps_non_ascii() -> None:
    assert parse_payload('{"name": "Zoë"}'.encode()) == '{"name":"Zoë"}'


# ---------------------------------------------------------------- comparison, rows, identity


def test_same_as_compares_payloads_as_json_values() -> None:
    mine = DeliverySpec.build(payload='{"a": 1e2, "b": [1.50]}')
    stored = DeliverySpec.from_rows(
        {"queue": "default", "overlap": "allow"},
        {
            "payload": {"b": [1.5], "a": 100},  # as psycopg decodes the JSONB the store kept
            "url": None,
            "method": None,
            "headers": None,
            "timeout_s": None,
            "max_attempts": 5,
            "backoff_base_s": 1.0,
            "backoff_cap_s": 300.0,
            "max_age_s": None,
        },
    )
    assert mine.same_as(stored)
    assert not mine.same_as(DeliverySpec.build(payload='{"a": 101, "b": [1.5]}'))
    assert not mine.same_as(DeliverySpec.build())
    assert not mine.same_as(DeliverySpec.build(payload='{"a": 1e2, "b": [1.50]}', max_attempts=4))


def test_from_rows_round_trips_a_url_target() -> None:
    spec = DeliverySpec.build(url=URL, headers=["B: 2", "a: 1"], payload="[1]", max_age_s=60, overlap="replace")
    row = spec.delivery_row()
    decoded = {**row, "headers": json.loads(row["headers"]), "payload": json.loads(row["payload"])}
    back = DeliverySpec.from_rows(spec.job_fields(), decoded)
    assert back == spec


def test_delivery_is_not_part_of_the_schedule_identity() -> None:
    plain = JobSpec.build(tenant="acme", cron="0 0 * * *")
    pushed = JobSpec.build(
        tenant="acme",
        cron="0 0 * * *",
        delivery=DeliverySpec.build(url=URL, payload="{}", overlap="forbid", max_attempts=2),
    )
    row = {"anchor_at": None}
    assert identity_of({**plain.row_fields(), **row}) == identity_of({**pushed.row_fields(), **row})
    assert pushed.row_fields()["queue"] is None and pushed.row_fields()["overlap"] == "forbid"


def test_describe_lists_header_names_never_values() -> None:
    spec = DeliverySpec.build(url=URL + "?token=abc", headers=["Authorization: Bearer s3cret"], payload='{"a":1}')
    described = spec.describe()
    assert described == {
        "target": "POST https://93.184.216.34",
        "url": URL + "?token=abc",
        "method": "POST",
        "header_names": ["Authorization"],
        "timeout_s": 10.0,
        "payload": {"a": 1},
        "max_attempts": 5,
        "backoff_base_s": 1.0,
        "backoff_cap_s": 300.0,
        "max_age_s": None,
        "overlap": "allow",
    }
    assert "s3cret" not in json.dumps(described)
    assert DeliverySpec.build(queue="mail").describe()["target"] == "queue mail"


@pytest.mark.parametrize(
    ("row", "text"),
    [
        ({"queue": "default"}, "queue default"),
        ({"queue": None, "url": "https://h.example:8443/a?token=x", "method": "PUT"}, "PUT https://h.example:8443"),
        ({"queue": None, "url": "http://[2001:db8::1]/a", "method": "POST"}, "POST http://[2001:db8::1]"),
    ],
)
def test_target_text_of_a_listed_row(row, text) -> None:
    assert target_text(row) == text


# ---------------------------------------------------------------- save-time SSRF


def test_check_targets_resolves_each_url_once_and_names_the_refused_address() -> None:
    calls: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return {"public.example": ["93.184.216.34"], "inside.example": ["10.1.2.3"]}[host]

    public = DeliverySpec.build(url="https://public.example/a")
    inside = DeliverySpec.build(url="http://inside.example:8080/a")
    check_targets([public, public, DeliverySpec.build()], AddressPolicy(), resolve=resolve)
    assert calls == [("public.example", 443)]
    with pytest.raises(ValidationError) as info:
        check_targets([inside], AddressPolicy(), resolve=resolve)
    assert str(info.value) == (
        "url: resolves to an address push targets may not reach (loopback, private, link-local, metadata "
        "or reserved); an operator may allow a network with push_allow (got 'inside.example -> 10.1.2.3')"
    )
    check_targets([inside], AddressPolicy.parse("10.0.0.0/8"), resolve=resolve)


@pytest.mark.parametrize("value", [1, None, True, ["a"]])
def test_a_header_value_that_is_not_text_says_so(value) -> None:
    # The API's {"headers": {"X-A": 1}} was told its value must be printable ASCII of at most 4,096 characters.
    assert (
        refused(url=URL, headers={"X-A": value})
        == "header: value of X-A must be a string (text), not a number, list or null"
    )


METADATA_RULE = (
    "url: resolves to a cloud metadata address, which push targets may not reach; push_allow opens it only "
    "with an entry of /16 or narrower (/64 for IPv6), never through a wider network such as 0.0.0.0/0"
)


@pytest.mark.parametrize("allow", ["", "0.0.0.0/0", "169.254.0.0/15", "::/0"])
@pytest.mark.parametrize("address", ["169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254"])
def test_a_metadata_address_is_refused_with_the_rule_that_opens_it(allow: str, address: str) -> None:
    # A trial allowed 0.0.0.0/0 and was told only that "an operator may allow a network with push_allow".
    def resolve(host: str, port: int) -> list[str]:
        return [address]

    with pytest.raises(ValidationError) as info:
        check_targets([DeliverySpec.build(url="http://meta.example/")], AddressPolicy.parse(allow), resolve=resolve)
    assert str(info.value) == f"{METADATA_RULE} (got 'meta.example -> {address}')"


def test_a_metadata_address_under_a_narrow_enough_entry_is_allowed() -> None:
    def resolve(host: str, port: int) -> list[str]:
        return ["169.254.169.254"]

    check_targets(
        [DeliverySpec.build(url="http://meta.example/")], AddressPolicy.parse("169.254.0.0/16"), resolve=resolve
    )
