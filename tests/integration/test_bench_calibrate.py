"""``bench calibrate`` (bench/calibrate.py): the fixed work each benchmark is timed against
is the same work every time, each timing is the best of its tries, and nothing is left
in the store."""

from __future__ import annotations

import json

import psycopg
import pytest
from click.testing import CliRunner

from bench import calibrate as calibrate_mod
from bench.__main__ import cli
from bench.calibrate import Calibration, best_ms, calibrate, python_work


def test_the_python_work_is_the_same_work_every_time() -> None:
    assert (
        python_work(1_000) == python_work(1_000) == sum(len(f"{i * 7919 % 1_000}:t{i % 51}:{i}") for i in range(1_000))
    )


def test_best_ms_keeps_the_fastest_try(monkeypatch) -> None:
    ticks = iter([0.0, 0.5, 1.0, 1.2, 2.0, 2.9])  # tries of 500, 200 and 900 ms
    monkeypatch.setattr(calibrate_mod.time, "perf_counter", lambda: next(ticks))
    assert best_ms(lambda: None, repeats=3) == pytest.approx(200.0)


def test_calibrate_times_the_store_and_leaves_nothing_behind(pg_dsn: str) -> None:
    machine = calibrate(pg_dsn, repeats=1)
    assert isinstance(machine, Calibration)
    assert machine.python_ms > 0 and machine.store_scan_ms > 0 and machine.store_insert_ms > 0
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass('bench_calibrate')").fetchone() == (None,)


def test_the_command_prints_one_line_per_calibration(pg_dsn: str) -> None:
    result = CliRunner().invoke(cli, ["calibrate", "--dsn", pg_dsn, "--times", "2", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert len(lines) == 2 and all(set(line) == {"python_ms", "store_scan_ms", "store_insert_ms"} for line in lines)
    bad = CliRunner().invoke(cli, ["calibrate", "--dsn", pg_dsn, "--times", "0"])
    assert bad.exit_code == 2 and "--times" in bad.output
