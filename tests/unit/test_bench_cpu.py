"""bench/cpu.py: CPU seconds per part of a bench run, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.cpu import CpuMeter, cpu_s, describe, group_of


@pytest.mark.parametrize(
    "name, group",
    [
        ("scheduler-fire:deliver-0", "store: fire"),
        ("scheduler-fire-write1:deliver-0", "store: fire"),
        ("scheduler-worker-claim", "store: worker"),
        ("scheduler-worker-heartbeat", "store: worker"),
        ("scheduler-lease:n1", "store: lease"),
        ("bench", "store: bench"),
        ("bench-workers", "store: bench"),
        ("walwriter", "store: background"),
        ("autovacuum worker", "store: background"),
        ("psql", "store: background"),
    ],
)
def test_a_backend_is_grouped_by_its_application_name(name, group) -> None:
    assert group_of(name) == group


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_meter_counts_each_groups_cpu_between_start_and_stop() -> None:
    idle = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"], stdout=subprocess.PIPE
    )
    try:
        assert idle.stdout is not None
        idle.stdout.readline()  # its interpreter's start-up is over before the window (CI saw it counted)
        me = os.getpid()
        # A backend map naming a process that is not postgres (this one) is ignored: pids are
        # taken as the store's only when they are local postgres processes.
        meter = CpuMeter({"bench": [me], "idle": [idle.pid]}, lambda: {me: "scheduler-fire:x"})
        burn(0.05)  # before the window: not counted
        meter.start()
        burn(0.2)
        cpu = meter.stop()
    finally:
        idle.kill()
        idle.wait()
        idle.stdout.close()
    assert set(cpu) == {"bench", "total"}  # the idle child spent nothing: left out
    assert 0.15 <= cpu["bench"] <= 1.0
    assert cpu["total"] == cpu["bench"]
    assert cpu_s(idle.pid) is None  # gone


def test_a_process_that_ends_inside_the_window_keeps_its_cpu_up_to_the_last_sample() -> None:
    """A firing session closed after a failed tick and opened again: its CPU must not vanish."""
    burn_then_exit = (
        "import sys, time\nsys.stdin.readline()\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    )
    short = subprocess.Popen([sys.executable, "-c", burn_then_exit], stdin=subprocess.PIPE)
    meter = CpuMeter({"short": [short.pid]}, dict, sample_every_s=0.02)
    try:
        meter.start()
        assert short.stdin is not None
        short.stdin.write(b"go\n")
        short.stdin.close()
        short.wait(10)  # reaped: /proc no longer has it when the meter stops
        assert cpu_s(short.pid) is None
        cpu = meter.stop()
    finally:
        short.kill()
        short.wait()
    # Its 0.3 s of burning, less what the last sampling interval missed (wide: a loaded machine
    # delays the sampler); without sampling it counted nothing.
    assert 0.15 <= cpu["short"] <= 1.0


def test_the_line_gives_each_group_the_total_against_the_cores_and_per_run() -> None:
    line = describe({"workers": 10.0, "store: fire": 8.5, "total": 18.5}, 10.0, 300_000)
    assert line.startswith("CPU over 10.0 s (s): workers 10.00, store: fire 8.50; total 18.50 of ")
    assert line.endswith(" × 10.0, 62 µs/run")
