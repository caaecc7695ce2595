"""``python -m bench`` as a user runs it: a store it cannot reach is a one-line error."""

from __future__ import annotations

import subprocess
import sys


def test_a_store_that_cannot_be_reached_is_one_line_naming_it_without_the_password() -> None:
    # A trial got psycopg's traceback (exit 1) from `bench deliver --dsn` at a closed port.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "deliver",
            "--mode",
            "push",
            "--dsn",
            "postgresql://nobody:sekret@127.0.0.1:1/x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("bench: error: store: connection failed: ")
    assert "port 1 failed" in lines[0] and "sekret" not in result.stderr


def test_push_options_are_refused_in_pull_mode_before_anything_runs() -> None:
    # A trial's `deliver --mode pull --receiver raw` was accepted and the option ignored.
    from click.testing import CliRunner

    from bench.__main__ import cli

    for option, value in [("--receiver", "raw"), ("--push-concurrency", "8"), ("--push-per-host", "2")]:
        result = CliRunner().invoke(
            cli, ["deliver", "--mode", "pull", option, value, "--dsn", "postgresql://nobody@127.0.0.1:1/x"]
        )
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{option}': a push option: give it with --mode push" in result.output
