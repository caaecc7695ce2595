"""``scheduler api`` warns when it serves plain HTTP beyond loopback (scheduler/api/server.py)."""

from __future__ import annotations

import pytest
from helpers import json_log_records

from scheduler.api.server import warn_if_plain_http_beyond_loopback


def logged(host: str, tls: bool) -> tuple[bool, list[dict]]:
    with json_log_records() as records:
        warned = warn_if_plain_http_beyond_loopback(host, tls)
    return warned, records


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "api.internal"])
def test_plain_http_on_a_reachable_address_is_warned_about(host: str) -> None:
    warned, records = logged(host, tls=False)
    assert warned
    (record,) = records
    assert (record["event"], record["level"], record["host"]) == ("api_plain_http", "warning", host)
    assert "clear text" in record["why"] and "--ssl-certfile" in record["why"]


@pytest.mark.parametrize(
    ("host", "tls"), [("127.0.0.1", False), ("::1", False), ("localhost", False), ("0.0.0.0", True)]
)
def test_loopback_or_tls_is_quiet(host: str, tls: bool) -> None:
    assert logged(host, tls) == (False, [])
