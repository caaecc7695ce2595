"""``scheduler demo``: the whole engine on its own private PostgreSQL, as a user runs it.

Runs the installed console script as a subprocess (it starts, migrates and
removes its own server; the test cluster is not used), reads its report, and
checks that the server it started is gone afterwards: no process runs in or
mentions its directory, the directory is deleted, nothing listens on its port.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("scheduler")


def private_dirs() -> set[Path]:
    roots = {Path("/dev/shm"), Path(tempfile.gettempdir())}
    return {p for root in roots if root.is_dir() for p in root.glob("scheduler-pg-*")}


def directory_of_port(candidates: set[Path], port: int) -> Path | None:
    for directory in candidates:
        try:
            conf = (directory / "data" / "postgresql.conf").read_text(errors="replace")
        except OSError:
            continue
        if re.search(rf"^port = {port}$", conf, re.MULTILINE):
            return directory
    return None


def processes_using(directory: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(directory) in cmdline or cwd.startswith(str(directory)):
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_demo_fires_audits_clean_and_leaves_no_server() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["PYTHONUNBUFFERED"] = "1"
    before = private_dirs()
    proc = subprocess.Popen(
        [str(SCRIPT), "demo", "--seconds", "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    port = directory = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            match = re.search(r"PostgreSQL from \w+ binaries on 127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                directory = directory_of_port(private_dirs() - before, port)
        status = proc.wait(timeout=120)
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:  # only on a failure above: SIGTERM lets the demo remove its server
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output = "\n".join(lines)

    assert status == 0, f"{output}\n--- stderr ---\n{stderr}"
    assert port is not None, output
    assert directory is not None, f"no private server directory with port {port}"
    fired = re.search(r"^runs fired: (\d+)$", output, re.MULTILINE)
    assert fired is not None, output
    assert int(fired.group(1)) > 0
    # 40 every-second jobs alone fire 40 runs a second: 6 s cannot give fewer than ~100.
    assert int(fired.group(1)) >= 100, output
    in_window = re.search(r"^runs in window: (\d+) of (\d+) expected$", output, re.MULTILINE)
    assert in_window is not None, output
    assert in_window.group(1) == in_window.group(2) and int(in_window.group(2)) > 0
    for key in ("missing", "duplicates", "unexpected"):
        assert f"\n{key}: 0" in f"\n{output}", output
    assert re.search(r"^imported 1356 cron jobs from the real corpus, rejected 144 lines", output, re.MULTILINE)

    # Nothing of the private server is left.
    assert processes_using(directory) == []
    assert not directory.exists(), f"{directory} left behind"
    assert not port_open(port), f"something still listens on {port}"
