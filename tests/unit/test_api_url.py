"""``scheduler worker --api-url`` values (scheduler/delivery/api_client.validate_api_url): every bad
one is a ValidationError naming ``api_url`` before anything starts, never a traceback later
(a trial's ``http://[::1`` raised urlsplit's ValueError; ``http://user:pw@host`` started and
then failed in aiohttp on the first call; ``http://host:99999`` retried forever)."""

from __future__ import annotations

import pytest

from scheduler.delivery.api_client import validate_api_url
from scheduler.errors import ValidationError


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("ftp://x", "must be an http:// or https:// URL"),
        ("http://[::1", "must be an http:// or https:// URL"),
        ("http://127.0.0.1:99999", "port must be a whole number from 1 to 65535"),
        ("http://127.0.0.1:0", "port must be a whole number from 1 to 65535"),
        ("http://127.0.0.1:port", "port must be a whole number from 1 to 65535"),
        ("http://user:pw@127.0.0.1:8080", "must not carry credentials"),
        ("http://user@127.0.0.1:8080", "must not carry credentials"),
        ("http://127.0.0.1:8080/?a=1", "must be an http:// or https:// URL"),
        ("http://127.0.0.1:8080/#f", "must be an http:// or https:// URL"),
        ("ftp://user:pw@127.0.0.1", "must not carry credentials"),
        ("http://user:pw@[::1", "must not carry credentials"),
        ("http://127.0.0.1:8080/?key=pw", "must be an http:// or https:// URL"),
        ("http://user:pw/x@127.0.0.1:8080/", "must not carry credentials"),
        ("http://127.0.0.1:8080/x y", "must not contain spaces or unprintable characters"),
        ("http://127.0.0.1:8080/x\ty", "must not contain spaces or unprintable characters"),
    ],
)
def test_a_bad_api_url_is_refused_naming_the_field_and_the_rule(url, rule) -> None:
    with pytest.raises(ValidationError) as err:
        validate_api_url(url)
    assert str(err.value).startswith(f"api_url: {rule}")
    assert "pw" not in str(err.value)  # a password in the URL is never echoed


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("https://api.example.com", "https://api.example.com"),
        ("http://[::1]:8080", "http://[::1]:8080"),
        ("http://h:65535/base/", "http://h:65535/base"),
    ],
)
def test_a_good_api_url_is_kept_without_its_trailing_slash(url, kept) -> None:
    assert validate_api_url(url) == kept


def test_a_bad_api_url_is_refused_before_the_handler_is_imported(tmp_path) -> None:
    """``scheduler worker --api-url BAD --handler H``: the URL is checked before the
    handler's module is imported (user code, possibly slow or failing): the error
    names ``api_url`` even when the handler cannot be imported either."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_API_KEY"] = "k"
    done = subprocess.run(
        [sys.executable, "-m", "scheduler", "worker", "--api-url", "http://h:99999", "--handler", "no_such_mod:f"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: api_url: port must be a whole number from 1 to 65535 (got 'http://h:99999')"
    ]
