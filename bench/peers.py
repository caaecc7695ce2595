"""The peers a Python user would pick instead, driven on the same PostgreSQL.

Three libraries, each in its own schema of the bench database, each run in
child processes (``python -m bench.peers SYSTEM setup|load|worker``) so that
an import error, a crash or a hang of one costs its own row of the comparison,
never the run:

* **pgqueuer** (``pgqueuer``, asyncpg driver). Its scheduler fires at most
  one cron per entrypoint per minute, so timers are carried through its
  queue as *deferred jobs*: ``load`` enqueues one job per occurrence (herd:
  ``jobs`` jobs with ``execute_after`` = T; steady: ``jobs`` jobs per second
  of the window), in batches through :meth:`pgqueuer.Queries.enqueue`;
  ``worker`` runs a :class:`pgqueuer.QueueManager` whose no-op entrypoint
  records when it was called. Its dequeue batch is ``--batch`` (100; the
  library's default is 10, which halves its throughput here).
* **APScheduler 4** (``apscheduler``, an alpha: the only 4.x there is), its
  :class:`~apscheduler.datastores.sqlalchemy.SQLAlchemyDataStore` on asyncpg.
  ``load`` adds one schedule per timer (herd: a ``DateTrigger`` at T;
  steady: an ``IntervalTrigger`` of 1 s from T to the window's last second),
  ``coalesce=all`` so a late scheduler fires every slot rather than only the
  latest (the default, ``latest``, would drop work), on one task whose
  ``max_running_jobs`` is unlimited (the default, 1, would run one job of the
  task at a time); ``worker`` runs one :class:`~apscheduler.AsyncScheduler`
  (default ``max_concurrent_jobs`` = 100: 1,000 is slower) whose task records
  when it was called.

* **procrastinate** 3 (``procrastinate``, psycopg 3), its tables in the schema
  :data:`PROCRASTINATE_SCHEMA` (the connections' ``search_path``). Like
  pgqueuer it holds no timers that repeat by themselves for this work (its
  periodic tasks are one decorator per schedule in code), so ``load`` defers
  one job per occurrence with ``schedule_at`` = its nominal instant, in
  batches (``batch_defer_async``); ``worker`` runs ``run_worker_async``
  (concurrency ``--batch``, 100 from ``compare``; polling every
  :data:`PROCRASTINATE_POLL_S`: a scheduled job is announced by NOTIFY when
  deferred, not when due) whose async task records when it was called.

A worker records ``(key, nominal, fired)`` per call in memory (``fired`` is
``time.time()`` on entry to the task, ``nominal`` the instant the occurrence
was due), writes its call count to ``RECORDS.count`` every 0.25 s (progress
for the parent), and on SIGTERM or at ``--deadline`` (epoch seconds) writes
the records to ``RECORDS`` (TSV) *before* stopping its library, then exits:
whatever did not fire by then is lost. It creates ``RECORDS.ready`` once it
is running.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from bench.process import stop_child

PGQUEUER_SCHEMA = "bench_pgqueuer"
APSCHEDULER_SCHEMA = "bench_apscheduler"
PROCRASTINATE_SCHEMA = "bench_procrastinate"
PROCRASTINATE_POLL_S = 0.1
"""procrastinate workers' ``fetch_job_polling_interval`` (its default, 5 s, is how late a
scheduled job can start: LISTEN/NOTIFY announces a job when deferred, not when due)."""
PROCRASTINATE_CONCURRENCY = 100
ENTRYPOINT = "bench_fire"
ENQUEUE_CHUNK = 10_000
PGQUEUER_BATCH = 100

RECORDS: list[tuple[str, float, float]] = []
"""(key, nominal epoch s, fired epoch s) of this worker process's calls."""


def asyncpg_dsn(dsn: str) -> str:
    """A ``postgresql://`` URI (asyncpg accepts no driver suffix and no key=value DSN)."""
    from scheduler.store import libpq_dsn

    dsn = libpq_dsn(dsn)
    if "://" not in dsn:
        raise click.UsageError("the peers need a URI DSN (postgresql://user@host:port/db)")
    return dsn.replace("postgres://", "postgresql://", 1)


def registration_order(jobs: int) -> list[int]:
    """Timer numbers 0..jobs-1 in the (seeded, shuffled) order every system registers them,
    so that no system's first-in-first-out order favours one tenant (timer ``i``'s tenant
    is :func:`bench.compare.tenant_of`)."""
    order = list(range(jobs))
    random.Random(jobs).shuffle(order)
    return order


def occurrences(t0: float, seconds: int) -> list[float]:
    """Nominal instants (epoch s): ``t0``, ``t0 + 1``, ... (``seconds`` of them)."""
    return [t0 + k for k in range(seconds)]


# ---------------------------------------------------------------- worker plumbing


class _Recorder:
    """Progress file, ready flag and the final TSV of one worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stop = asyncio.Event()

    def ready(self) -> None:
        self.path.with_suffix(".ready").write_text("ready\n")

    async def progress(self, deadline: float) -> None:
        count_path = self.path.with_suffix(".count")
        tmp = count_path.with_suffix(".count.tmp")
        while not self.stop.is_set():
            tmp.write_text(f"{len(RECORDS)}\n")
            tmp.replace(count_path)
            if time.time() >= deadline:
                self.stop.set()
                break
            try:
                await asyncio.wait_for(self.stop.wait(), 0.25)
            except TimeoutError:
                pass

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            for key, nominal, fired in list(RECORDS):
                out.write(f"{key}\t{nominal:.6f}\t{fired:.6f}\n")
        tmp.replace(self.path)

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)


async def _stop_within(coro, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(coro, timeout_s)
    except (TimeoutError, Exception):  # the records are already written
        pass


# ---------------------------------------------------------------- pgqueuer


async def pgqueuer_setup(dsn: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{PGQUEUER_SCHEMA}" CASCADE')
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def pgqueuer_load(dsn: str, jobs: int, t0: float, seconds: int) -> int:
    """Enqueue ``jobs`` deferred jobs per nominal instant; return the count."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        queries = Queries(AsyncpgDriver(conn))
        order = registration_order(jobs)
        payloads = [f"{i} {nominal:.6f}".encode() for nominal in occurrences(t0, seconds) for i in order]
        for start in range(0, len(payloads), ENQUEUE_CHUNK):
            chunk = payloads[start : start + ENQUEUE_CHUNK]
            nominals = [float(p.split()[1]) for p in chunk]
            now = time.time()  # execute_after is relative to the store's NOW()
            await queries.enqueue(
                [ENTRYPOINT] * len(chunk),
                chunk,
                [0] * len(chunk),
                execute_after=[timedelta(seconds=n - now) for n in nominals],
            )
        # As for the engine's jobs: a herd hits a table analysed long ago.
        await conn.execute(f'VACUUM ANALYZE "{PGQUEUER_SCHEMA}".pgqueuer')
        return len(payloads)
    finally:
        await conn.close()


async def pgqueuer_worker(dsn: str, records: Path, deadline: float, batch: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    recorder = _Recorder(records)
    recorder.install_signals()
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def fire(job) -> None:
        fired = time.time()
        key, nominal = job.payload.split()
        RECORDS.append((key.decode(), float(nominal), fired))

    runner = asyncio.create_task(qm.run(batch_size=batch))
    recorder.ready()
    await recorder.progress(deadline)
    recorder.write()
    qm.shutdown.set()
    await _stop_within(runner, 10)
    await _stop_within(conn.close(), 5)


# ---------------------------------------------------------------- APScheduler 4


async def aps_fire(key: str) -> None:
    """The APScheduler task: record the call (module level, so the data store can name it)."""
    from apscheduler import current_job

    fired = time.time()
    RECORDS.append((key, current_job.get().scheduled_fire_time.timestamp(), fired))


def _aps_scheduler(dsn: str):
    from apscheduler import AsyncScheduler
    from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(asyncpg_dsn(dsn).replace("postgresql://", "postgresql+asyncpg://", 1))
    return engine, AsyncScheduler(SQLAlchemyDataStore(engine, schema=APSCHEDULER_SCHEMA))


async def _recreate_schema(dsn: str, schema: str) -> None:
    """Drop ``schema`` (and everything in it) if it exists, and create it empty."""
    import asyncpg

    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()


async def apscheduler_setup(dsn: str) -> None:
    await _recreate_schema(dsn, APSCHEDULER_SCHEMA)


async def apscheduler_load(dsn: str, jobs: int, t0: float, seconds: int) -> int:
    """Add ``jobs`` schedules (herd: DateTrigger; steady: 1 s IntervalTrigger); return the count."""
    import asyncpg
    from apscheduler import CoalescePolicy
    from apscheduler.triggers.date import DateTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    start = datetime.fromtimestamp(t0, UTC)
    engine, scheduler = _aps_scheduler(dsn)
    try:
        async with scheduler:
            await scheduler.configure_task(aps_fire, max_running_jobs=None)
            for i in registration_order(jobs):
                if seconds == 1:
                    trigger = DateTrigger(start)
                else:
                    trigger = IntervalTrigger(
                        seconds=1, start_time=start, end_time=start + timedelta(seconds=seconds - 1)
                    )
                await scheduler.add_schedule(
                    aps_fire, trigger, id=f"s{i}", args=(f"s{i}",), coalesce=CoalescePolicy.all
                )
    finally:
        await engine.dispose()
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:  # as for the engine's jobs: a herd hits a table analysed long ago
        await conn.execute(f'VACUUM ANALYZE "{APSCHEDULER_SCHEMA}".schedules')
    finally:
        await conn.close()
    return jobs * seconds


async def apscheduler_worker(dsn: str, records: Path, deadline: float) -> None:
    recorder = _Recorder(records)
    recorder.install_signals()
    engine, scheduler = _aps_scheduler(dsn)
    async with scheduler:
        await scheduler.start_in_background()
        recorder.ready()
        await recorder.progress(deadline)
        recorder.write()
        await _stop_within(scheduler.stop(), 10)
    await _stop_within(engine.dispose(), 5)


# ---------------------------------------------------------------- procrastinate


def _procrastinate_app(dsn: str):
    """A procrastinate :class:`~procrastinate.App` on ``dsn`` whose connections use the
    schema :data:`PROCRASTINATE_SCHEMA` (its tables, functions and types live
    there) at READ COMMITTED, whatever the database's default: it is not written
    for SERIALIZABLE (in the test suite's serializable mode its worker ran 2 of
    80 due jobs within 20 s), with the task :func:`procrastinate_fire` registered as :data:`ENTRYPOINT`."""
    import procrastinate

    options = f"-c search_path={PROCRASTINATE_SCHEMA} -c default_transaction_isolation=read\\ committed"
    connector = procrastinate.PsycopgConnector(conninfo=asyncpg_dsn(dsn), kwargs={"options": options})
    app = procrastinate.App(connector=connector)
    app.task(name=ENTRYPOINT)(procrastinate_fire)
    return app


async def procrastinate_fire(key: str, nominal: float) -> None:
    """The procrastinate task: record the call (module level, so workers can name it)."""
    RECORDS.append((key, nominal, time.time()))


async def procrastinate_setup(dsn: str) -> None:
    await _recreate_schema(dsn, PROCRASTINATE_SCHEMA)
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_load(dsn: str, jobs: int, t0: float, seconds: int) -> int:
    """Defer ``jobs`` jobs scheduled at each nominal instant (``schedule_at``); return the count."""
    import asyncpg

    app = _procrastinate_app(dsn)
    count = 0
    async with app.open_async():
        task = app.tasks[ENTRYPOINT]
        order = registration_order(jobs)
        for nominal in occurrences(t0, seconds):
            deferrer = task.configure(schedule_at=datetime.fromtimestamp(nominal, UTC))
            for start in range(0, jobs, ENQUEUE_CHUNK):
                chunk = order[start : start + ENQUEUE_CHUNK]
                await deferrer.batch_defer_async(*({"key": str(i), "nominal": nominal} for i in chunk))
                count += len(chunk)
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:  # as for the engine's jobs: a herd hits a table analysed long ago
        await conn.execute(f'VACUUM ANALYZE "{PROCRASTINATE_SCHEMA}".procrastinate_jobs')
    finally:
        await conn.close()
    return count


async def procrastinate_worker(dsn: str, records: Path, deadline: float, concurrency: int) -> None:
    recorder = _Recorder(records)
    recorder.install_signals()
    app = _procrastinate_app(dsn)
    async with app.open_async():
        runner = asyncio.create_task(
            app.run_worker_async(
                concurrency=concurrency,
                fetch_job_polling_interval=PROCRASTINATE_POLL_S,
                install_signal_handlers=False,
            )
        )
        recorder.ready()
        await recorder.progress(deadline)
        recorder.write()
        runner.cancel()
        await _stop_within(runner, 10)


# ---------------------------------------------------------------- CLI (child processes)

SYSTEMS = {
    "pgqueuer": (pgqueuer_setup, pgqueuer_load),
    "apscheduler": (apscheduler_setup, apscheduler_load),
    "procrastinate": (procrastinate_setup, procrastinate_load),
}


@click.group()
def cli() -> None:
    """Peer schedulers, driven by ``python -m bench compare`` (one child process per step)."""


@cli.command()
@click.argument("system", type=click.Choice(sorted(SYSTEMS)))
@click.option("--dsn", envvar="SCHEDULER_DSN", required=True)
def setup(system: str, dsn: str) -> None:
    """Drop and recreate SYSTEM's schema."""
    asyncio.run(SYSTEMS[system][0](dsn))


@cli.command()
@click.argument("system", type=click.Choice(sorted(SYSTEMS)))
@click.option("--dsn", envvar="SCHEDULER_DSN", required=True)
@click.option("--jobs", type=int, required=True, help="Timers (per nominal instant).")
@click.option("--t0", type=float, required=True, help="First nominal instant (epoch s).")
@click.option("--seconds", type=int, default=1, show_default=True, help="Nominal instants, 1 s apart.")
def load(system: str, dsn: str, jobs: int, t0: float, seconds: int) -> None:
    """Register the work; prints the occurrences registered."""
    click.echo(asyncio.run(SYSTEMS[system][1](dsn, jobs, t0, seconds)))


@cli.command()
@click.argument("system", type=click.Choice(sorted(SYSTEMS)))
@click.option("--dsn", envvar="SCHEDULER_DSN", required=True)
@click.option("--records", type=click.Path(path_type=Path), required=True)
@click.option("--deadline", type=float, required=True, help="Stop at this instant (epoch s).")
@click.option(
    "--batch",
    type=int,
    default=PGQUEUER_BATCH,
    show_default=True,
    help="pgqueuer dequeue batch; procrastinate worker concurrency.",
)
def worker(system: str, dsn: str, records: Path, deadline: float, batch: int) -> None:
    """Run SYSTEM until SIGTERM or DEADLINE, then write RECORDS."""
    if system == "pgqueuer":
        asyncio.run(pgqueuer_worker(dsn, records, deadline, batch))
    elif system == "procrastinate":
        asyncio.run(procrastinate_worker(dsn, records, deadline, batch))
    else:
        asyncio.run(apscheduler_worker(dsn, records, deadline))
    # Library threads (executors, pools) must not keep a measured-out worker alive.
    sys.stdout.flush()
    os._exit(0)


def env_for(system: str) -> dict[str, str]:
    """The child's environment: pgqueuer finds its schema through PGQUEUER_SCHEMA."""
    env = dict(os.environ)
    if system == "pgqueuer":
        env["PGQUEUER_SCHEMA"] = PGQUEUER_SCHEMA
    return env


def run_step(system: str, args: list[str], log_path: Path, timeout_s: float) -> str:
    """Run ``python -m bench.peers <step> SYSTEM args`` to completion; return its stdout.

    Raises ``RuntimeError`` with the tail of its log when it fails or overruns.
    """
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.peers", *args],
                env=env_for(system),
                stdout=subprocess.PIPE,
                stderr=log,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{' '.join(args[:2])} took over {timeout_s:.0f}s") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {log_tail(log_path)}")
    return proc.stdout.decode()


def log_tail(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


class PeerWorker:
    """A ``python -m bench.peers worker SYSTEM`` child process and its records file."""

    def __init__(
        self, system: str, dsn: str, records: Path, deadline: float, log_path: Path, batch: int = PGQUEUER_BATCH
    ) -> None:
        self.records = records
        self.log_path = log_path
        for path in (records, records.with_suffix(".count"), records.with_suffix(".ready")):
            path.unlink(missing_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.peers",
                "worker",
                system,
                "--dsn",
                dsn,
                "--records",
                str(records),
                "--deadline",
                f"{deadline:.3f}",
                "--batch",
                str(batch),
            ],
            env=env_for(system),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited ({self.proc.returncode}): {log_tail(self.log_path)}")
        return self.records.with_suffix(".ready").exists()

    def count(self) -> int:
        try:
            return int(self.records.with_suffix(".count").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def stop(self, timeout_s: float = 30.0) -> list[tuple[str, float, float]]:
        """SIGTERM, wait (SIGKILL after ``timeout_s``); return the records it wrote."""
        stop_child(self.proc, self._log, timeout_s)
        if not self.records.exists():
            raise RuntimeError(f"worker wrote no records: {log_tail(self.log_path)}")
        out = []
        for line in self.records.read_text().splitlines():
            key, nominal, fired = line.split("\t")
            out.append((key, float(nominal), float(fired)))
        return out


if __name__ == "__main__":
    cli()
