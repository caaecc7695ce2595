"""CPU seconds each part of a bench run used over its measured window (Linux ``/proc``).

Why: on the 2-core build machine the same build's herd moved by 20-30 %
between hours because every process got slower alike (docs/performance.md,
"2026-12-03, morning" and "midday"); the CPU each part spent per run tells
a slower machine from a slower build, where a wall-clock figure cannot.

Groups (:func:`group_of`): the bench's own child processes as named by the
caller (``node``, ``workers``, ``receiver``), and, when the store runs on
this machine (its backends' pids are in ``/proc`` with a ``postgres``
command line), its backends by ``application_name``: ``store: fire``
(``scheduler-fire-read:<node>``, ``scheduler-fire-write0:<node>``, ...),
``store: worker`` (a worker's claim, ack and heartbeat sessions),
``store: bench`` (this load generator's own queries), ``store: background``
(the WAL writer, checkpointer, autovacuum, …). A process that starts inside
the window counts from its start; one that ends inside it keeps what it had
spent by the meter's last sample (every ``sample_every_s``; a firing session
closed after a failed tick and opened again used to take its CPU with it, and
``store: fire`` read ~2 s of a herd's ~18).
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far; None if it is gone (or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _is_postgres(pid: int) -> bool:
    """Whether ``pid`` is a local PostgreSQL process: a backend's title (``postgres: user db
    host(port) idle``) or the postmaster's command (``…/bin/postgres -D …``)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].split(b" ", 1)[0]
    except OSError:
        return False
    return command in (b"postgres", b"postgres:") or command.endswith(b"/postgres")


def group_of(application_name: str) -> str:
    """The group of a store backend named ``application_name`` (or, for a background
    process, its ``backend_type``): ``scheduler-fire-write0:node-1`` → ``store: fire``,
    ``scheduler-worker-claim`` → ``store: worker``, ``bench-workers`` → ``store: bench``,
    anything else → ``store: background``."""
    name = application_name.split(":", 1)[0]
    if name.startswith("scheduler-"):
        return "store: " + name.removeprefix("scheduler-").split("-", 1)[0]
    if name == "bench" or name.startswith("bench-"):
        return "store: bench"
    return "store: background"


class CpuMeter:
    """CPU per group between :meth:`start` and :meth:`stop` (module doc).

    ``processes``: group → pids of the bench's children; ``backends()``
    returns ``{pid: application_name or backend_type}`` of the store's
    processes (``pg_stat_activity``), or ``{}`` for none; its pids count
    only if they are local ``postgres`` processes. Both are read at
    :meth:`start`, at :meth:`stop` and, with ``sample_every_s`` (seconds),
    every so often in between on a thread of the meter, so that a process
    ending inside the window keeps its CPU up to the last sample
    (``backends`` must then be callable from that thread: a psycopg
    connection is).
    """

    def __init__(
        self,
        processes: Mapping[str, Iterable[int]],
        backends: Callable[[], dict[int, str]],
        *,
        sample_every_s: float | None = None,
    ) -> None:
        self._groups = {pid: group for group, pids in processes.items() for pid in pids}
        self._backends = backends
        self._every = sample_every_s
        self._known: dict[int, str] = {}
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._sampler: threading.Thread | None = None

    def _pids(self) -> dict[int, str]:
        pids = dict(self._groups)
        for pid, name in self._backends().items():
            if pid not in pids and _is_postgres(pid):
                pids[pid] = group_of(name)
        return pids

    def start(self) -> None:
        """Read every process's CPU so far (the window's start); start sampling if asked."""
        self._known = self._pids()
        self._start = {pid: t for pid in self._known if (t := cpu_s(pid)) is not None}
        self._last = dict(self._start)
        if self._every is not None:
            self._stopped.clear()
            self._sampler = threading.Thread(target=self._sample_until_stopped, name="cpu-meter", daemon=True)
            self._sampler.start()

    def sample(self) -> None:
        """Read the CPU so far of every process known now (a process that then ends keeps it)."""
        pids = self._pids()
        readings = {pid: t for pid in pids if (t := cpu_s(pid)) is not None}
        with self._lock:
            for pid, group in pids.items():
                self._known.setdefault(pid, group)
            self._last.update(readings)

    def _sample_until_stopped(self) -> None:
        assert self._every is not None
        while not self._stopped.wait(self._every):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 (a failed sample leaves the previous one; stop reads again)
                continue

    def stop(self) -> dict[str, float]:
        """CPU seconds per group since :meth:`start` (rounded to 10 ms), largest first, and ``total``."""
        self._stopped.set()
        if self._sampler is not None:
            self._sampler.join()
            self._sampler = None
        self.sample()
        spent: collections.Counter[str] = collections.Counter()
        with self._lock:
            for pid, group in self._known.items():
                last = self._last.get(pid)
                if last is not None:
                    spent[group] += last - self._start.get(pid, 0.0)
        out = {group: round(s, 2) for group, s in spent.most_common() if s >= 0.005}
        out["total"] = round(sum(spent.values()), 2)
        return out


_BACKENDS_SQL = "SELECT pid, coalesce(nullif(application_name, ''), backend_type) AS name FROM pg_stat_activity"
"""Every store process, the bench's own session included (its polls take CPU from what it measures)."""


def store_backends(conn) -> Callable[[], dict[int, str]]:
    """``backends`` for :class:`CpuMeter`: the store's processes as ``conn`` (the bench's
    autocommit connection) sees them in ``pg_stat_activity``."""

    def read() -> dict[int, str]:
        return {row["pid"]: row["name"] for row in conn.execute(_BACKENDS_SQL).fetchall()}

    return read


def describe(cpu: Mapping[str, float], window_s: float, runs: int) -> str:
    """One line: each group's CPU seconds, the total against the machine's cores × the
    window, and µs of CPU per run."""
    total = cpu.get("total", 0.0)
    parts = ", ".join(f"{group} {s:.2f}" for group, s in cpu.items() if group != "total")
    per_run = f", {1e6 * total / runs:.0f} µs/run" if runs else ""
    cores = os.cpu_count() or 1
    return f"CPU over {window_s:.1f} s (s): {parts}; total {total:.2f} of {cores} × {window_s:.1f}{per_run}"


__all__ = ["CpuMeter", "cpu_s", "describe", "group_of", "store_backends"]
