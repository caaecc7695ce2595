"""``GET /v1/explain`` over HTTP: the next fires with their wall time, and `jobs next`'s errors as 422."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from scheduler.cli import cli


@pytest.fixture
def get(api):
    token = api.key("acme", "tenant")

    def call(**params: str) -> httpx.Response:
        return httpx.get(f"{api.url}/v1/explain", params=params, headers={"Authorization": f"Bearer {token}"})

    return call


def test_the_next_fires_across_a_dst_change_with_their_local_wall_time(get):
    """Berlin, 02:30 daily: on 2024-03-31 02:30 does not exist (clocks jump 02:00 → 03:00)."""
    response = get(cron="30 2 * * *", tz="Europe/Berlin", after="2024-03-29T12:00:00Z", count="3")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "cron": "30 2 * * *",
        "tz": "Europe/Berlin",
        "dialect": "unix",
        "after": "2024-03-29T12:00:00Z",
        "fires": [
            {"at": "2024-03-30T01:30:00Z", "local": "2024-03-30T02:30:00+01:00"},
            {"at": "2024-03-31T01:00:00Z", "local": "2024-03-31T03:00:00+02:00"},
            {"at": "2024-04-01T00:30:00Z", "local": "2024-04-01T02:30:00+02:00"},
        ],
        "exhausted": False,
        "truncated": False,
    }


def test_the_fires_are_those_jobs_next_prints(get):
    args = ["--cron", "0 0 0 13 * FRI", "--dialect", "seconds", "--after", "2024-01-01T00:00:00Z", "--count", "4"]
    printed = CliRunner().invoke(cli, ["jobs", "next", *args]).stdout.split()
    response = get(cron="0 0 0 13 * FRI", dialect="seconds", after="2024-01-01T00:00:00Z", count="4")
    assert [fire["at"] for fire in response.json()["fires"]] == printed
    assert printed == ["2024-09-13T00:00:00Z", "2024-12-13T00:00:00Z", "2025-06-13T00:00:00Z", "2026-02-13T00:00:00Z"]


def test_count_defaults_to_5_and_after_to_now(get):
    response = get(cron="0 0 1 1 *")
    assert response.status_code == 200
    assert len(response.json()["fires"]) == 5


def test_a_schedule_that_runs_out_of_range_says_exhausted(get):
    response = get(cron="0 0 1 1 *", after="9995-06-01T00:00:00Z", count="10")
    body = response.json()
    assert [fire["at"] for fire in body["fires"]] == ["9996-01-01T00:00:00Z", "9997-01-01T00:00:00Z"]
    assert body["exhausted"] is True


def test_a_listing_over_the_time_budget_stops_with_truncated(get, monkeypatch):
    """The budget is CPU time (explain.BUDGET_S, 2 s); at 0 s the listing stops after the first fire."""
    from scheduler.api import explain

    monkeypatch.setattr(explain, "BUDGET_S", 0.0)
    body = get(cron="0 0 29 2 *", after="2024-01-01T00:00:00Z", count="3").json()
    assert body["fires"] == [{"at": "2024-02-29T00:00:00Z", "local": "2024-02-29T00:00:00+00:00"}]
    assert (body["truncated"], body["exhausted"]) == (True, False)


def _cli_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli, ["jobs", "next", *args])
    assert result.exit_code == 2
    return result.stderr.strip().removeprefix("error: ")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "* * * * *\n"}, "cron"),  # one line, as when a job is saved
        ({"cron": "0 3 * * *\n0 4 * * *"}, "cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"cron": "* * * * *", "tz": "../../etc/passwd"}, "tz"),
        ({"cron": "* * * * *", "after": "2024-01-01T00:00:00"}, "after"),
        ({"cron": "* * * * *", "after": "yesterday"}, "after"),
        ({"cron": "* * * * *", "count": "0"}, "count"),
        ({"cron": "* * * * *", "count": "10001"}, "count"),
        ({"cron": "* * * * *", "count": "-1"}, "count"),
        ({"cron": "* * * * *", "count": "٦٠"}, "count"),
        ({"cron": "* * * * *", "count": "1e3"}, "count"),
        ({"cron": "* * * * *", "count": "9" * 5000}, "count"),
    ],
)
def test_bad_input_is_422_with_the_clis_message_naming_the_field(get, params, field):
    response = get(**({"after": "2024-01-01T00:00:00Z"} | params))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    cli_args = [f"--{name}={value}" for name, value in ({"after": "2024-01-01T00:00:00Z"} | params).items()]
    assert body == {
        "type": "about:blank",
        "title": "Unprocessable Content",
        "status": 422,
        "detail": _cli_error(cli_args),
        "field": field,
    }


def test_an_unknown_dialect_is_422_naming_dialect(get):
    """The CLI refuses it as a click choice; the API with the schedule parser's own message."""
    body = get(cron="* * * * *", dialect="quartz").json()
    assert (body["status"], body["field"], body["detail"]) == (
        422,
        "dialect",
        "dialect: dialect must be 'unix' (5 fields) or 'seconds' (6 fields, seconds first) (got 'quartz')",
    )


def test_a_missing_cron_is_422_naming_cron(get):
    body = get().json()
    assert (body["status"], body["field"], body["detail"]) == (422, "cron", "cron: is required (?cron=EXPR)")
