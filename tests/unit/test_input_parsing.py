"""Number parsing and echo clipping of user input (scheduler/spec.py, scheduler/errors.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from scheduler.errors import CLI_WORDS, NotFoundError, ValidationError, clip
from scheduler.spec import JobSpec, parse_decimal, parse_whole


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("60", 60),
        (" 60 ", 60),
        ("+7", 7),
        ("-3", -3),
        (60, 60),
        (60.0, 60),
        ("99999999999999999999", 99999999999999999999),
    ],
)
def test_whole_numbers_are_parsed_as_integers(value, expected) -> None:
    assert parse_whole("n", value) == expected


@pytest.mark.parametrize("value", ["٦٠", "６０", "1e3", "1_000", "1.5", "", "0x10", True, 1.5, float("inf"), None])
def test_anything_but_ascii_digits_is_refused(value) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_whole("n", value, unit="seconds")
    assert str(caught.value).startswith("n: must be a whole number of seconds in ASCII digits")


def test_bounds_echo_the_value_as_typed() -> None:
    with pytest.raises(ValidationError) as caught:
        parse_whole("n", "9" * 10_000, maximum=10)
    assert str(caught.value) == f"n: must be at most 10 (got '{'9' * 80}…' (10000 characters))"
    with pytest.raises(ValidationError) as caught:
        parse_whole("n", "9" * 10_000)
    assert str(caught.value).startswith("n: must have at most 100 digits")
    with pytest.raises(ValidationError) as caught:
        parse_whole("w", "0", minimum=1, maximum=1000, rule="must be a whole number from 1 to 1000")
    assert str(caught.value) == "w: must be a whole number from 1 to 1000 (got '0')"


def test_decimals_are_ascii_only() -> None:
    assert [parse_decimal("r", v) for v in ("2", "0.5", ".5", "1e3", 3)] == [2.0, 0.5, 0.5, 1000.0, 3.0]
    for value in ("٥", "inf", "nan", "1,5"):
        with pytest.raises(ValidationError):
            parse_decimal("r", value)


def test_clip() -> None:
    assert clip("abc") == "'abc'"
    assert clip("x" * 81) == f"'{'x' * 80}…' (81 characters)"
    assert clip("it's" * 30) == '"' + ("it's" * 20) + '…" (120 characters)'
    assert clip(10**30) == "1" + "0" * 30


def test_an_instant_is_echoed_as_iso_text_not_a_repr() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert str(ValidationError("until", "must be after --since", when)) == (
        "until: must be after --since (got 2030-01-01T00:00:00Z)"
    )
    assert clip(datetime(2030, 1, 1, 1, 30, 0, 500, tzinfo=timezone(timedelta(hours=1)))) == (
        "2030-01-01T00:30:00.000500Z"
    )
    assert clip(datetime(2030, 1, 1)) == "2030-01-01T00:00:00"


def test_spec_api_refuses_an_option_the_policy_ignores_and_an_empty_zone() -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.build(tenant="a", interval_s=60, misfire="skip", catchup_window_s=60)
    assert caught.value.field == "catchup_window_s"
    with pytest.raises(ValidationError) as caught:
        JobSpec.build(tenant="a", cron="0 1 * * *", tz="")
    assert caught.value.field == "tz"
    spec = JobSpec.build(tenant="a", interval_s="60", misfire="once", misfire_grace_s="5")
    assert (spec.interval_s, spec.misfire_grace_s, spec.catchup_window_s) == (60, 5, 86_400)


@pytest.mark.parametrize("name", [5, ["a"], b"bytes", "", "x" * 201, "tab\there"])
def test_a_name_that_is_not_printable_text_is_refused(name) -> None:
    with pytest.raises(ValidationError) as caught:  # a non-string was a TypeError (a 500 from the API)
        JobSpec.build(tenant="a", interval_s=60, name=name)
    assert str(caught.value).startswith("name: must be 1-200 printable characters")


@pytest.mark.parametrize("name", ["a/b", "/", ".", ".."])
def test_a_name_the_http_api_cannot_address_is_refused_everywhere(name) -> None:
    """A job name is one URL path segment of the tenant API (/v1/schedules/<name>): a name the
    CLI or an import saved with a '/' (or '.', '..') could be neither read, listed in an apply
    nor kept by an apply's prune. The rule is the spec's, so every way in refuses it."""
    with pytest.raises(ValidationError) as caught:
        JobSpec.build(tenant="a", interval_s=60, name=name)
    assert str(caught.value) == f"name: must not contain / or be . or .. (it is one URL path segment) (got {name!r})"
    assert JobSpec.build(tenant="a", interval_s=60, name="a.b..c").name == "a.b..c"


def test_a_rule_names_other_inputs_in_each_surfaces_words():
    """``str()`` is the CLI's message (flags); ``render`` another surface's words; only the
    placeholders of CLI_WORDS are replaced (other braces are left as written)."""
    error = ValidationError("until", "must be after {since}, not {literal}", "2030-01-01")
    assert str(error) == "until: must be after --since, not {literal} (got '2030-01-01')"
    assert (error.rule, error.template) == (
        "must be after --since, not {literal}",
        "must be after {since}, not {literal}",
    )
    assert error.render({"since": "since"}) == "until: must be after since, not {literal} (got '2030-01-01')"
    assert error.render({}) == "until: must be after since, not {literal} (got '2030-01-01')"
    missing = NotFoundError("tenant: no tenant 'x'", hint="create it with {tenants_add}")
    assert str(missing) == "tenant: no tenant 'x' (create it with `scheduler tenants add`)"
    assert (
        missing.render({"tenants_add": "POST /v1/tenants"}) == "tenant: no tenant 'x' (create it with POST /v1/tenants)"
    )
    assert str(NotFoundError("job: no job {cron}")) == "job: no job {cron}"  # a message is never rendered


def test_the_api_has_a_word_for_everything_the_cli_names():
    from scheduler.api.errors import API_WORDS

    assert sorted(API_WORDS) == sorted(CLI_WORDS)
    assert [word for word in API_WORDS.values() if word.startswith("--") or "scheduler " in word] == []


@pytest.mark.parametrize(
    "cron",
    ["* * * * *\n", "* * * * *\r\n", "0 3 * * *\n0 4 * * *", "0\x0b3 * * *", "0 3 * * *\x00", "0\u00a03 * * *"],
)
def test_a_cron_expression_must_be_one_line_of_spaces_or_tabs(cron) -> None:
    # It parsed (str.split splits on any whitespace) and was stored as typed: a line break in
    # `jobs list`, and a second line that looked like a second schedule and was not one.
    with pytest.raises(ValidationError) as caught:
        JobSpec.build(tenant="a", cron=cron)
    assert str(caught.value).startswith(
        "cron: must be one line of fields separated by spaces or tabs (no line breaks or other control characters)"
    )


@pytest.mark.parametrize("cron", ["0\t3\t*\t*\t*", " 0 3 * * * ", "0  3 * *\t *"])
def test_a_cron_expression_with_tabs_or_extra_spaces_is_accepted_as_typed(cron) -> None:
    # FreeBSD's crontab separates fields with tabs: real input (the corpus has such lines).
    assert JobSpec.build(tenant="a", cron=cron).cron == cron
