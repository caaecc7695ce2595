"""Child processes: ``scheduler node`` processes for the bench and the cluster tests.

:class:`NodeProcess` is the one definition of a node child process: started
with ``python -m scheduler ARGS``, signalled, stopped (SIGTERM, then SIGKILL
after a timeout), its peak memory and its log read. The bench's workloads
start nodes with :func:`bench.load.start_node`; the cluster-test harness
(``tests/cluster/harness.py``) builds on this class, with its JSON logs read
into events. :func:`stop_child` stops any child the same way (the bench's
naive and peer workers too).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def stop_child(proc: subprocess.Popen, log_file: IO[bytes] | None, timeout_s: float = 30.0) -> int | None:
    """SIGTERM ``proc``, wait ``timeout_s`` seconds, then SIGKILL; close ``log_file`` (if any);
    return the exit status (negative: the signal that ended it)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    if log_file is not None:
        log_file.close()
    return proc.returncode


class NodeProcess:
    """One ``python -m scheduler ARGS`` child process (a ``scheduler node``), started by :meth:`start`.

    ``args`` follow ``python -m scheduler`` (``["node", "--node-id", ...]``);
    ``env`` is the child's whole environment. Output goes to ``log_path``
    (appended), one of two ways:

    * ``read_events=False``: the child's stdout and stderr are the log file
      itself; nothing in this process reads them (the bench measures the
      node, not a reader);
    * ``read_events=True``: stderr is read on a thread, appended to the log
      and parsed: :attr:`events` holds every JSON record (a dict with
      ``ts``, ``level``, ``event`` and the fields, plus ``_mono``: this
      process's monotonic time the line was read) and :attr:`garbage` the
      lines that are not JSON (e.g. a traceback).

    ``die_with_parent=True`` gives the child ``PR_SET_PDEATHSIG`` = SIGKILL
    (it dies with the test process even if no teardown runs); otherwise it
    runs in a session of its own (a Ctrl-C in the terminal reaches only the
    parent, which stops its children itself).
    """

    def __init__(
        self,
        node_id: str,
        log_path: Path,
        args: Sequence[str],
        env: Mapping[str, str],
        *,
        read_events: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.node_id = node_id
        self.log_path = log_path
        self.args = list(args)
        self.env = dict(env)
        self.read_events = read_events
        self.die_with_parent = die_with_parent
        self.events: list[dict[str, Any]] = []
        self.garbage: list[str] = []
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._reader: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> NodeProcess:
        """Launch the process; returns at once (self)."""
        if self.read_events:
            output = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
        else:
            self._log = open(self.log_path, "ab")
            output = {"stdout": self._log, "stderr": subprocess.STDOUT}
        session = {"preexec_fn": _die_with_parent} if self.die_with_parent else {"start_new_session": True}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", *self.args], stdin=subprocess.DEVNULL, env=self.env, **output, **session
        )
        if self.read_events:
            self._reader = threading.Thread(target=self._read, name=f"stderr-{self.node_id}", daemon=True)
            self._reader.start()
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    def returncode(self) -> int | None:
        """Exit status if the process has exited, else None (reaps it)."""
        return None if self._proc is None else self._proc.poll()

    def state(self) -> str:
        """Linux process state letter (``R``, ``S``, ``T`` = stopped, ...); ``X`` if gone."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return "X"
        return stat.rsplit(")", 1)[1].split()[0]

    def peak_rss_mb(self) -> float | None:
        """Peak resident set size (VmHWM) in MB, or None once the process is gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def signal(self, sig: int) -> None:
        """Send ``sig`` if the process still runs (else nothing)."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap (``kill -9``); the store sees its sockets close."""
        self.signal(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(10)
        self._finish_output()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait ``timeout_s`` seconds, then SIGKILL; return the exit status."""
        assert self._proc is not None, "not started"
        code = stop_child(self._proc, None, timeout_s)
        self._finish_output()
        return code

    def destroy(self) -> None:
        """Teardown: SIGKILL if still running (stopped processes too), reap; never raises."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(10)
        self._finish_output()

    def _finish_output(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
        if self._log is not None:
            self._log.close()

    # ---- logs

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        with open(self.log_path, "ab") as raw:
            for line in self._proc.stderr:
                raw.write(line)
                raw.flush()
                text = line.decode(errors="replace").rstrip("\n")
                try:
                    record = json.loads(text)
                    if not isinstance(record, dict):
                        raise ValueError
                except ValueError:
                    with self._lock:
                        self.garbage.append(text)
                    continue
                record["_mono"] = time.monotonic()
                with self._lock:
                    self.events.append(record)

    def events_named(self, name: str, since_mono: float | None = None) -> list[dict[str, Any]]:
        """Events called ``name`` (read at or after ``since_mono``, this process's monotonic time)."""
        with self._lock:
            return [
                e for e in self.events if e.get("event") == name and (since_mono is None or e["_mono"] >= since_mono)
            ]

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the log file ("(no log)" without one)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def problems(self) -> list[str]:
        """Signs of a crash in the events read: a Python traceback on stderr, or error-level records.

        Other non-JSON stderr lines (``garbage``) are not counted: libraries
        such as psycopg log plain-text warnings there (e.g. "error ignored in
        rollback" after the store ended a frozen node's transaction).
        """
        with self._lock:
            tracebacks = [line for line in self.garbage if line.startswith("Traceback")]
            errors = [
                json.dumps({k: v for k, v in e.items() if k != "_mono"})
                for e in self.events
                if e.get("level") in ("error", "critical")
            ]
            return tracebacks + errors
