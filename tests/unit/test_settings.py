"""Settings: one validated object from flags, environment, a TOML file and defaults.

Pins the precedence flag > env > file > default (``settings.resolve`` and
``scheduler config show`` through the real CLI), the config file's checks,
the one-line exit-2 error for invalid combinations, and the masked password.
No store needed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from scheduler import settings as settings_mod
from scheduler.cli import SETTING_HELP, cli
from scheduler.errors import ConfigError
from scheduler.settings import Settings


def run(args: list[str], env: dict[str, str] | None = None):
    """Invoke the CLI in process with no SCHEDULER_* variable but ``env``."""
    clean: dict[str, str | None] = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    clean.update(env or {})
    return CliRunner().invoke(cli, args, env=clean, catch_exceptions=False)


def show(args: list[str], env: dict[str, str] | None = None) -> dict:
    result = run(["config", "show", "--json", *args], env)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scheduler.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- precedence


def test_resolve_takes_flag_then_env_then_file_then_default():
    settings, sources = settings_mod.resolve(
        flags={"lease_ttl_s": 20.0},
        env={"lease_ttl_s": 30.0, "renew_interval_s": 4.0},
        file_values={"lease_ttl_s": 40.0, "renew_interval_s": 5.0, "poll_interval_s": 2.0},
    )
    assert (settings.lease_ttl_s, sources["lease_ttl_s"]) == (20.0, "flag")
    assert (settings.renew_interval_s, sources["renew_interval_s"]) == (4.0, "env")
    assert (settings.poll_interval_s, sources["poll_interval_s"]) == (2.0, "file")
    assert (settings.tick_interval_s, sources["tick_interval_s"]) == (settings_mod.TICK_INTERVAL_S, "default")
    assert set(sources) == {f.name for f in dataclasses.fields(Settings)}


def test_config_show_reports_each_source(tmp_path):
    path = write(
        tmp_path,
        'lease_ttl_s = 12\nrenew_interval_s = 2.5\npoll_interval_s = 0.75\nmetrics_port = 9464\nlog_format = "json"\n',
    )
    out = show(
        ["--config", str(path), "--lease-ttl-s", "15"],
        {"SCHEDULER_RENEW_INTERVAL_S": "2", "SCHEDULER_METRICS_HOST": "0.0.0.0"},
    )
    assert out["lease_ttl_s"] == {"value": 15.0, "source": "flag"}
    assert out["renew_interval_s"] == {"value": 2.0, "source": "env"}
    assert out["poll_interval_s"] == {"value": 0.75, "source": "file"}
    assert out["metrics_port"] == {"value": 9464, "source": "file"}
    assert out["metrics_host"] == {"value": "0.0.0.0", "source": "env"}
    assert out["log_format"] == {"value": "json", "source": "file"}
    assert out["tick_interval_s"] == {"value": 1.0, "source": "default"}
    # timeouts left unset are derived from the TTL, and shown so
    assert out["lock_timeout_s"] == {"value": None, "source": "default", "effective": 3.0}


def test_config_file_from_scheduler_config_env(tmp_path):
    path = write(tmp_path, "max_rate_per_s = 500\n")
    out = show([], {"SCHEDULER_CONFIG": str(path)})
    assert out["max_rate_per_s"] == {"value": 500.0, "source": "file"}


def test_root_log_format_flag_counts_as_a_flag(tmp_path):
    path = write(tmp_path, 'log_format = "text"\n')
    result = run(
        ["--log-format", "json", "config", "show", "--json", "--config", str(path)], {"SCHEDULER_LOG_FORMAT": "text"}
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["log_format"] == {"value": "json", "source": "flag"}


def test_every_setting_has_a_flag_an_env_var_and_help():
    result = run(["node", "--help"])
    assert result.exit_code == 0
    for field in dataclasses.fields(Settings):
        assert f"--{field.name.replace('_', '-')}" in result.stdout, field.name
        assert f"SCHEDULER_{field.name.upper()}" in result.stdout.replace("\n", "").replace(" ", ""), field.name
        assert SETTING_HELP.get(field.name), field.name
    assert "SCHEDULER_CONFIG" in result.stdout


def test_text_output_lists_every_setting_with_its_source(tmp_path):
    result = run(["config", "show", "--metrics-port", "0"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SETTING", "VALUE", "SOURCE"]
    by_name = {line.split()[0]: line.split()[-1] for line in lines[1:]}
    assert set(by_name) == {f.name for f in dataclasses.fields(Settings)}
    assert by_name["metrics_port"] == "flag"
    assert by_name["lease_ttl_s"] == "default"


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("where", ["flag", "env", "file"])
def test_config_show_masks_the_password(tmp_path, where):
    dsn = "postgresql://scheduler:Hunter2-Secret@db.example:5432/scheduler"
    args: list[str] = []
    env: dict[str, str] = {}
    if where == "flag":
        args = ["--dsn", dsn]
    elif where == "env":
        env = {"SCHEDULER_DSN": dsn}
    else:
        args = ["--config", str(write(tmp_path, f'dsn = "{dsn}"\n'))]
    for output in (run(["config", "show", *args], env), run(["config", "show", "--json", *args], env)):
        assert output.exit_code == 0, output.stderr
        assert "Hunter2-Secret" not in output.stdout + output.stderr
        assert "postgresql://scheduler:***@db.example:5432/scheduler" in output.stdout


@pytest.mark.parametrize(
    ("dsn", "rule"),
    [
        ("postgresql://u:p@ss@h/db", "dsn: a URI may hold '@' only once"),
        ("mysql://x/y", "dsn: must be a URI (postgresql://user:password@host:5432/dbname) or libpq keywords"),
    ],
)
@pytest.mark.parametrize("where", ["flag", "env", "file"])
def test_config_show_refuses_a_dsn_the_node_refuses(tmp_path, dsn, rule, where):
    """``config show`` exits 2 on a DSN ``scheduler node`` refuses, with the same rule and where
    the DSN was set (it showed an unescaped '@' masked as a valid DSN and exited 0; a trial),
    and never echoes the password."""
    args, env = (["--dsn", dsn], {}) if where == "flag" else ([], {"SCHEDULER_DSN": dsn})
    if where == "file":
        args, env = ["--config", str(write(tmp_path, f'dsn = "{dsn}"\n'))], {}
    for as_json in ([], ["--json"]):
        result = run(["config", "show", *as_json, *args], env)
        assert result.exit_code == 2, (result.stdout, result.stderr)
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"error: {rule}") and result.stdout == ""
        set_by = {"flag": None, "env": "SCHEDULER_DSN", "file": f"dsn in {tmp_path / 'scheduler.toml'}"}[where]
        assert line.endswith(f"; set by {set_by}") if set_by else "; set by" not in line
        assert "p@ss" not in line


# ---------------------------------------------------------------- invalid input


def one_line_error(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("command", [["config", "show"], ["node", "--dsn", "postgresql://u@127.0.0.1:1/x"]])
def test_renew_interval_not_below_ttl_is_one_line_naming_both(command):
    line = one_line_error(run([*command, "--lease-ttl-s", "5", "--renew-interval-s", "5"]))
    assert "renew_interval_s" in line and "lease_ttl_s" in line


def test_invalid_combination_from_env_and_file(tmp_path):
    path = write(tmp_path, "lease_ttl_s = 3\n")
    line = one_line_error(run(["config", "show", "--config", str(path)], {"SCHEDULER_RENEW_INTERVAL_S": "2.8"}))
    assert "renew_interval_s" in line and "lease_ttl_s" in line and "safety_margin_s" in line


@pytest.mark.parametrize(
    "text, words",
    [
        ("bogus = 1\n", ["unknown setting 'bogus'"]),
        ('lease_ttl_s = "ten"\n', ["lease_ttl_s", "must be a number"]),
        ("metrics_port = 9464.5\n", ["metrics_port", "whole number"]),
        ("metrics_port = 70000\n", ["metrics_port", "0-65535"]),
        ('log_format = "xml"\n', ["log_format", "text, json"]),
        ("retention_s = -1\n", ["retention_s", "> 0"]),
        ("retention_s = 99999999999999999999\n", ["retention_s", "at most"]),
        ("lease_ttl_s = \n", ["not valid TOML"]),
    ],
)
def test_bad_config_file_is_one_line(tmp_path, text, words):
    line = one_line_error(run(["config", "show", "--config", str(write(tmp_path, text))]))
    for word in words:
        assert word in line, line


@pytest.mark.parametrize(
    "option", ["--lease-ttl-s 99999999", "--lease-ttl-s 1e20", "--poll-interval-s 1e12", "--tick-interval-s 90000"]
)
def test_a_timing_past_a_day_is_refused_naming_it(option):
    """A node with a lease TTL of 1e8 s derived store timeouts PostgreSQL refuses (a
    lock_timeout of 2e10 ms) and retried its connection for ever, logging store_unavailable."""
    name, value = option.split()
    line = one_line_error(run(["node", "--dsn", "postgresql://u@127.0.0.1:1/x", name, value]))
    assert f"{name.removeprefix('--').replace('-', '_')}: must be at most 86400 seconds" in line, line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('lease_ttl_s = "abc"\n', "error: lease_ttl_s: must be a number (got 'abc')"),
        ("lease_ttl_s = 0\n", "error: lease_ttl_s: must be a finite number > 0 (got 0.0)"),
    ],
)
def test_a_bad_value_in_the_config_file_is_refused_in_one_form(tmp_path, text, message):
    """A value of the wrong type and one out of range, both in the config file, end alike:
    ``field: rule (got value); set by field in FILE`` (the wrong type read ``(got 'abc' in
    FILE)`` and the range ``field must be``; a trial)."""
    path = write(tmp_path, text)
    assert one_line_error(run(["config", "show", "--config", str(path)])) == f"{message}; set by lease_ttl_s in {path}"


def test_missing_config_file_is_one_line(tmp_path):
    line = one_line_error(run(["config", "show", "--config", str(tmp_path / "nope.toml")]))
    assert "nope.toml" in line


def test_node_without_dsn_is_one_line():
    line = one_line_error(run(["node", "--metrics-port", "0"]))
    assert "dsn" in line and "SCHEDULER_DSN" in line


def test_bad_env_value_is_one_line_naming_the_variable():
    """An operator reading the error did not type the value: a systemd unit or a
    container set it, so the error names the variable as well as the field."""
    line = one_line_error(run(["config", "show"], {"SCHEDULER_METRICS_PORT": "http"}))
    assert line == (
        "error: metrics_port: must be a whole number in ASCII digits (got 'http'); set by SCHEDULER_METRICS_PORT"
    )
    line = one_line_error(run(["node", "--dsn", "postgresql://u@127.0.0.1:1/x"], {"SCHEDULER_LEASE_TTL_S": "ten"}))
    assert line == "error: lease_ttl_s: must be a number in ASCII digits (got 'ten'); set by SCHEDULER_LEASE_TTL_S"


def test_a_flag_error_says_no_variable():
    line = one_line_error(run(["config", "show", "--metrics-port", "http"]))
    assert line == "error: metrics_port: must be a whole number in ASCII digits (got 'http')"
    line = one_line_error(run(["config", "show", "--lease-ttl-s", "0"]))
    assert line == "error: lease_ttl_s: must be a finite number > 0 (got 0.0)"


@pytest.mark.parametrize("command", [["config", "show"], ["node", "--dsn", "postgresql://u@127.0.0.1:1/x"]])
def test_env_value_out_of_range_names_the_variable(command):
    line = one_line_error(run(command, {"SCHEDULER_LEASE_TTL_S": "0"}))
    assert line == "error: lease_ttl_s: must be a finite number > 0 (got 0.0); set by SCHEDULER_LEASE_TTL_S"


def test_invalid_combination_says_where_each_value_was_set(tmp_path):
    path = write(tmp_path, "lease_ttl_s = 3\n")
    line = one_line_error(
        run(["config", "show", "--config", str(path), "--safety-margin-s", "1"], {"SCHEDULER_RENEW_INTERVAL_S": "2.8"})
    )
    assert line.endswith(f"; set by SCHEDULER_RENEW_INTERVAL_S, lease_ttl_s in {path}"), line


def test_settings_check_messages_name_the_settings():
    with pytest.raises(ConfigError, match="retention_batch_rows"):
        Settings(retention_batch_rows=0).check()
    with pytest.raises(ConfigError, match="metrics_host"):
        Settings(metrics_host="").check()
    with pytest.raises(ConfigError, match="lock_timeout_s .* lease_ttl_s"):
        Settings(lock_timeout_s=20.0).check()
    assert Settings(metrics_port=0, retention_s=86_400.0).validated().node_id


def test_push_allow_is_a_setting_parsed_into_the_address_policy():
    assert show([], {"SCHEDULER_PUSH_ALLOW": "10.0.0.0/8, 127.0.0.1"})["push_allow"] == {
        "value": "10.0.0.0/8, 127.0.0.1",
        "source": "env",
    }
    policy = Settings(push_allow="10.0.0.0/8, 127.0.0.1").push_policy
    assert (policy.allows("10.1.2.3"), policy.allows("127.0.0.1"), policy.allows("127.0.0.2")) == (True, True, False)
    assert Settings().push_policy.allows("169.254.169.254") is False
    with pytest.raises(ConfigError) as info:
        Settings(push_allow="10.0.0.0/8,intranet").check()
    assert str(info.value) == (
        "push_allow: must be a comma-separated list of networks or addresses (e.g. 10.0.0.0/8) (got 'intranet')"
    )


MULTI_HOST_HELP = "several hosts: postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write"


@pytest.mark.parametrize("command", [["node"], ["api"], ["worker"], ["jobs", "list"], ["db", "upgrade"]])
def test_the_dsn_help_shows_the_multi_host_form(command):
    result = run([*command, "--help"])
    assert result.exit_code == 0, result.stderr
    flat = "".join(result.stdout.split())  # click may wrap inside a long URI
    for text in (
        MULTI_HOST_HELP,
        "(libpq: tried in turn; with target_session_attrs=read-write the first writable one is used; "
        "docs/operations.md)",
    ):
        assert "".join(text.split()) in flat, result.stdout


@pytest.mark.parametrize("node_id", ["n\ny", "tab\there", "n\x00", "bell\x07", " lead", "trail ", "a b"])
def test_a_node_id_is_printable_without_spaces(node_id):
    # It is written to runs, leases and every log line: a newline there splits log lines.
    with pytest.raises(ConfigError) as caught:
        Settings(dsn="postgresql://x@h/db", node_id=node_id).validated()
    assert str(caught.value) == (
        f"node_id: must be 1-200 printable characters without spaces (letters, digits, . _ - : etc.) (got {node_id!r})"
    )


def test_a_node_id_of_host_name_like_text_is_accepted():
    assert Settings(dsn="postgresql://x@h/db", node_id="node-1.eu_west:a").validated().node_id == "node-1.eu_west:a"
