"""Fairness and pacing of the firing loop on a real store (docs/design.md §5).

The allocator's properties are tested in tests/unit/test_fairness.py; here:
the node serves tenants by weight within a tick, a big tenant cannot delay a
small one, rate caps hold, and the loop paces ticks one interval apart when
the budget is spent (driven by a manual clock: no sleeping).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import timedelta

import psycopg
from helpers import OneNode, json_log_records, stamp_schedule_keys

from scheduler import jobs, store
from scheduler.clock import ManualClock
from scheduler.coordination import SqlCoordinator
from scheduler.firing import Firer, FiringLimits
from scheduler.firing.state import TickResult
from scheduler.partition import partition_of


def _node(dsn: str, clock=None, **overrides) -> tuple[Firer, SqlCoordinator]:
    """The firer and coordinator of a :class:`OneNode` "fair" (close both)."""
    node = OneNode(dsn, node_id="fair", clock=clock, **overrides)
    return node.firer, node.coord


def _tick_once(dsn: str, **overrides) -> TickResult:
    """One tick of a fresh :func:`_node` (closed after it); its result."""
    firer, coord = _node(dsn, **overrides)
    try:
        return firer.tick()
    finally:
        firer.close()
        coord.close()


def _load_due(conn, tenant: str, count: int, due_ago_s: int) -> None:
    """``count`` hourly interval jobs of ``tenant``, each with one slot ``due_ago_s`` old."""
    now = conn.execute("SELECT date_trunc('second', now()) AS n").fetchone()["n"]
    slot = now - timedelta(seconds=due_ago_s)
    jobs.add_tenant(conn, tenant)
    rows = []
    for _ in range(count):
        job_id = uuid.uuid4()
        rows.append((partition_of(job_id), job_id, tenant, slot - timedelta(hours=1), slot, now))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO jobs (partition_id, job_id, tenant, kind, interval_s, anchor_at, next_nominal_at,"
            " next_due_at, created_at, changed_at)"
            " VALUES (%s, %s, %s, 'interval', 3600, %s, %s, %s, %s, %s)",
            [(p, j, t, a, s, s, c - timedelta(hours=2), c - timedelta(hours=2)) for p, j, t, a, s, c in rows],
        )
    stamp_schedule_keys(conn)


def _runs_by_tenant(conn) -> Counter:
    return Counter(
        {r["tenant"]: r["n"] for r in conn.execute("SELECT tenant, count(*) AS n FROM runs GROUP BY tenant").fetchall()}
    )


def test_big_tenant_does_not_delay_small_ones(pg_dsn, conn) -> None:
    """2,000 due jobs of one tenant (older!) and 50 of five others; budget 500 per tick."""
    _load_due(conn, "big", 2_000, due_ago_s=30)  # older: a due-time order would serve only them
    for i in range(5):
        _load_due(conn, f"small{i}", 10, due_ago_s=5)
    firer, coord = _node(pg_dsn, max_rate_per_s=500.0)
    try:
        first = firer.tick()
        after_first = _runs_by_tenant(conn)
        second = firer.tick()
        after_second = _runs_by_tenant(conn)
    finally:
        firer.close()
        coord.close()
    # Tick 1: every small tenant fully served (10 each); the big tenant gets
    # the rest of the budget (500 - 50 = 450), not more.
    assert after_first == Counter({"big": 450, **{f"small{i}": 10 for i in range(5)}})
    assert (first.fired, first.budget_exhausted) == (500, True)
    assert after_second["big"] == 950
    assert second.fired == 500


def test_surplus_is_read_only_after_the_fair_shares_committed(pg_dsn, conn, monkeypatch) -> None:
    """Budget 200, six tenants: the first pass (a share of 33 each: the five
    small tenants' 10 runs and 33 of the big one's) goes out in chunks of 20;
    the big tenant's surplus (117) is read only once all of them committed."""
    _load_due(conn, "big", 300, due_ago_s=30)
    for i in range(5):
        _load_due(conn, f"small{i}", 10, due_ago_s=5)
    # Chunks of 20; one lane: at SERIALIZABLE (CI's second pass) two lanes'
    # chunks on these few pages can fail with 40001 (page-grained predicate
    # locks) and take the retry path, which ends the tick after the first pass.
    limits = FiringLimits(chunk_jobs=20, write_lanes=1)
    passes = []
    real_stream = Firer._stream

    def stream(self, tick, quotas, after):
        sent = tick.pipeline.sent
        passes.append(
            ({t for t, q in quotas.items() if q > 0}, len(sent), sum(item.outcome is not None for item in sent))
        )
        return real_stream(self, tick, quotas, after)

    monkeypatch.setattr(Firer, "_stream", stream)
    result = _tick_once(pg_dsn, limits=limits, max_rate_per_s=200.0)
    first, second = passes
    assert first == ({"big", *(f"small{i}" for i in range(5))}, 0, 0)
    assert second == ({"big"}, 5, 5)  # 83 rows in 5 chunks, each answered
    assert _runs_by_tenant(conn) == Counter({"big": 150, **{f"small{i}": 10 for i in range(5)}})
    assert result.fired == 200


def test_a_ticks_first_chunks_are_small_and_double_up_to_chunk_jobs(pg_dsn, conn, monkeypatch) -> None:
    """Slow start: a run is claimable when its chunk commits, so the tick's first
    chunk is small (``first_chunk_jobs``) and each next one twice the last, up to
    ``chunk_jobs``; the surplus pass carries on from where the first pass was."""
    _load_due(conn, "big", 120, due_ago_s=30)
    _load_due(conn, "small", 3, due_ago_s=5)
    sizes = []
    real_send = Firer._send_batch

    def send(self, tick, batch):
        sizes.append(len(batch.pids))
        return real_send(self, tick, batch)

    monkeypatch.setattr(Firer, "_send_batch", send)
    limits = FiringLimits(first_chunk_jobs=5, chunk_jobs=30, write_lanes=1)
    result = _tick_once(pg_dsn, limits=limits, max_rate_per_s=100.0)
    # First pass: shares of 50 (small's 3 + big's 50 = 53 rows): 5, 10, 20, 18;
    # surplus pass (big's next 47): chunks of 30 and the rest.
    assert sizes == [5, 10, 20, 18, 30, 17]
    assert result.fired == 100
    assert _runs_by_tenant(conn) == Counter({"big": 97, "small": 3})


def test_a_tick_cut_short_by_a_retried_conflict_reports_due_work_left(pg_dsn, conn, monkeypatch) -> None:
    """Budget 200: the first pass fires the small tenant's 10 runs and the big
    tenant's share of 100; then a 40001 ends the tick before the surplus pass
    (its chunks are collected, none lost). 190 timers are still due, so the
    tick must report its budget spent: the loop then ticks again one interval
    later instead of idling until the next second (Firer.run)."""
    _load_due(conn, "big", 300, due_ago_s=30)
    _load_due(conn, "small", 10, due_ago_s=5)
    conflicts = []

    def wait(self):  # the surplus pass waits for the first pass's chunks: one of them conflicted
        conflicts.append(len(self.sent))
        raise psycopg.errors.SerializationFailure("could not serialize access (injected)")

    monkeypatch.setattr(store.Pipeline, "wait", wait)
    result = _tick_once(pg_dsn, max_rate_per_s=200.0)
    assert len(conflicts) == 1
    assert _runs_by_tenant(conn) == Counter({"big": 100, "small": 10})
    assert (result.fired, result.due_read) == (110, 110)
    assert result.budget_exhausted


def test_weights_split_a_saturated_tick(pg_dsn, conn) -> None:
    _load_due(conn, "heavy", 1_000, due_ago_s=10)
    _load_due(conn, "light", 1_000, due_ago_s=10)
    jobs.set_tenant(conn, "heavy", weight=3)
    _tick_once(pg_dsn, max_rate_per_s=400.0)
    assert _runs_by_tenant(conn) == Counter({"heavy": 300, "light": 100})


def test_rate_cap_is_the_nodes_share_per_tick(pg_dsn, conn) -> None:
    """A fleet-wide cap of 20 runs/s on a node owning every partition: 20 per 1 s tick."""
    _load_due(conn, "capped", 100, due_ago_s=10)
    _load_due(conn, "free", 100, due_ago_s=10)
    jobs.set_tenant(conn, "capped", max_rate=20.0)
    _tick_once(pg_dsn, max_rate_per_s=10_000.0)
    assert _runs_by_tenant(conn) == Counter({"capped": 20, "free": 100})


def test_loop_paces_ticks_one_interval_apart_when_the_budget_is_spent(pg_dsn, conn) -> None:
    """Budget 50 per 1 s tick, 120 due jobs: ticks fire 50, 50, 20, at 1 s spacing."""
    _load_due(conn, "paced", 120, due_ago_s=10)
    clock = ManualClock()
    firer, coord = _node(pg_dsn, clock=clock, max_rate_per_s=50.0)
    starts, fired = [], []
    stop = threading.Event()
    real_tick = firer.tick

    def counting_tick():
        starts.append(clock.monotonic())
        result = real_tick()
        fired.append(result.fired)
        if len(fired) == 3:
            stop.set()
        return result

    firer.tick = counting_tick
    try:
        thread = threading.Thread(target=firer.run, args=(stop,))
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        firer.close()
        coord.close()
    assert fired == [50, 50, 20]
    # The manual clock only moves when the loop waits: exactly one interval
    # between the starts of ticks that spent their budget.
    assert [round(b - a, 6) for a, b in zip(starts, starts[1:], strict=False)] == [1.0, 1.0]


def _load_many_due(conn, tenant: str, count: int, due_ago_s: int) -> None:
    """``count`` hourly interval jobs of ``tenant`` (one INSERT), each with one slot ``due_ago_s`` old."""
    jobs.add_tenant(conn, tenant)
    conn.execute(
        "INSERT INTO jobs (partition_id, job_id, tenant, kind, interval_s, anchor_at, next_nominal_at,"
        " next_due_at, created_at, changed_at)"
        " SELECT 0, gen_random_uuid(), %(tenant)s, 'interval', 3600, s - interval '1 hour', s, s,"
        "        n - interval '2 hours', n - interval '2 hours'"
        " FROM (SELECT date_trunc('second', now()) AS n,"
        "              date_trunc('second', now()) - %(ago)s * interval '1 second' AS s) AS t,"
        "      generate_series(1, %(count)s)",
        {"tenant": tenant, "ago": due_ago_s, "count": count},
    )
    conn.execute("UPDATE jobs SET partition_id = mod(abs(hashtext(job_id::text)), 1024) WHERE tenant = %s", [tenant])
    stamp_schedule_keys(conn)


def test_a_per_timer_pass_longer_than_the_statement_timeout_is_read_in_pages(pg_dsn, conn, monkeypatch) -> None:
    """An overloaded node (steady 12,000 runs/s on a machine too slow for it) had
    ticks of 100,000 due timers: the due scan, one streaming statement, stayed
    open while the tick planned and queued its chunks, until statement_timeout
    cancelled it (``tick_failed``) and the rest of the tick's work was redone
    by the next, itself cut again. The scan reads pages of at most
    ``stream_page_jobs`` timers, each its own short statement, resuming after
    the last timer read: here a 6 s pass under a 2 s statement timeout (each
    chunk's send held 0.5 s, as a busy store's socket holds it) fires every
    timer in one tick, each once."""
    _load_many_due(conn, "big", 40_000, due_ago_s=30)  # ~10 MB of rows: more than the socket buffers hold
    _load_many_due(conn, "small", 20, due_ago_s=5)
    small = {r["job_id"] for r in conn.execute("SELECT job_id::text FROM jobs WHERE tenant = 'small'")}
    real_send = Firer._send_batch
    chunks = []

    def slow_send(self, tick, batch):
        chunks.append(set(batch.jids))
        time.sleep(0.5)
        return real_send(self, tick, batch)

    monkeypatch.setattr(Firer, "_send_batch", slow_send)
    limits = FiringLimits(  # no herds: every timer goes through the per-timer due scan
        first_chunk_jobs=5_000, chunk_jobs=5_000, write_lanes=1, stream_page_jobs=5_000, herd_min_jobs=10**9
    )
    result = _tick_once(pg_dsn, limits=limits, statement_timeout_s=2.0, max_rate_per_s=100_000.0)
    assert _runs_by_tenant(conn) == Counter({"big": 40_000, "small": 20})
    assert result.fired == 40_020 and not result.budget_exhausted
    assert [len(chunk) for chunk in chunks] == [5_000] * 8 + [20]
    assert small <= set().union(*chunks) and len(set().union(*chunks)) == 40_020  # each timer in one chunk


def _failed_tick_record(records: list[dict]) -> dict:
    failed = [r for r in records if r["event"] == "tick_failed"]
    assert len(failed) == 1, records
    return failed[0]


def test_a_tick_failed_in_its_due_scan_says_so_and_what_it_had_committed(pg_dsn, conn, monkeypatch) -> None:
    """``tick_failed`` names the step (statement) that failed and what the
    tick had committed before it: here the due scan's second page waits for
    a lock on ``jobs`` another session asks for once the first page's chunk
    has committed (granted once the first page's scan has ended), until the
    statement timeout cancels it."""
    _load_many_due(conn, "big", 10_000, due_ago_s=30)
    real_send = Firer._send_batch
    released = threading.Event()
    lockers: list[threading.Thread] = []

    def hold_jobs() -> None:
        with psycopg.connect(pg_dsn) as other:
            other.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")  # once the first page's scan ends
            released.wait(10)

    def send_then_lock(self, tick, batch):
        sent = real_send(self, tick, batch)
        if not lockers:
            tick.pipeline.wait()  # the first chunk committed
            lockers.append(threading.Thread(target=hold_jobs))
            lockers[0].start()
            while not conn.execute(  # held, or queued behind the page's scan: the next page waits
                "SELECT 1 FROM pg_locks WHERE relation = 'jobs'::regclass AND mode = 'AccessExclusiveLock'"
            ).fetchone():
                time.sleep(0.01)
        return sent

    monkeypatch.setattr(Firer, "_send_batch", send_then_lock)
    limits = FiringLimits(
        first_chunk_jobs=5_000, chunk_jobs=5_000, write_lanes=1, stream_page_jobs=5_000, herd_min_jobs=10**9
    )
    try:
        with json_log_records() as records:
            result = _tick_once(pg_dsn, limits=limits, statement_timeout_s=1.0, max_rate_per_s=100_000.0)
    finally:
        released.set()
        for locker in lockers:
            locker.join()
    record = _failed_tick_record(records)
    assert sum(_runs_by_tenant(conn).values()) == 5_000 == result.fired
    assert record["step"] == "select_due_jobs"
    assert (record["runs_committed"], record["chunks_committed"], record["chunks_failed"]) == (5_000, 1, 0)
    assert "statement timeout" in record["error"]


def test_a_tick_failed_in_a_chunk_names_it_and_counts_the_chunks(pg_dsn, conn) -> None:
    """A chunk cancelled by the statement timeout (it waits for a job row
    another transaction holds): ``tick_failed`` says ``fire_runs`` failed,
    how many chunks had committed (the three before it, 15 runs) and how many
    did not (that one)."""
    _load_due(conn, "t", 20, due_ago_s=5)
    last = conn.execute(
        "SELECT job_id FROM jobs WHERE tenant = 't' ORDER BY next_due_at DESC, partition_id DESC, job_id DESC LIMIT 1"
    ).fetchone()["job_id"]
    limits = FiringLimits(first_chunk_jobs=5, chunk_jobs=5, write_lanes=1, herd_min_jobs=10**9)
    with psycopg.connect(pg_dsn, autocommit=False) as holder:
        holder.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [last])
        with json_log_records() as records:
            result = _tick_once(pg_dsn, limits=limits, statement_timeout_s=1.0, max_rate_per_s=100_000.0)
        holder.rollback()
    record = _failed_tick_record(records)
    assert sum(_runs_by_tenant(conn).values()) == 15 == result.fired
    assert record["step"] == "fire_runs"
    assert (record["runs_committed"], record["chunks_committed"], record["chunks_failed"]) == (15, 3, 1)
    assert "statement timeout" in record["error"]


def test_a_tick_failed_while_resending_counts_the_resent_chunks(pg_dsn, conn) -> None:
    """Four chunks of 5 on one lane: the first fails with 40001 (a trigger,
    once), so all four are re-sent one by one; the first two commit, the third
    fails for good (a trigger that always raises). ``tick_failed`` counts what
    the resends committed: 2 chunks (10 runs) committed, 2 not."""
    _load_due(conn, "t", 20, due_ago_s=5)
    ordered = [
        r["job_id"]
        for r in conn.execute("SELECT job_id FROM jobs WHERE tenant = 't' ORDER BY next_due_at, partition_id, job_id")
    ]
    conn.execute("CREATE SEQUENCE injected_conflicts")
    conn.execute(
        """
        CREATE FUNCTION inject_failures() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.job_id = %(conflict)s::uuid AND nextval('injected_conflicts') = 1 THEN
                RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001';
            END IF;
            IF NEW.job_id = %(broken)s::uuid THEN
                RAISE EXCEPTION 'injected failure';
            END IF;
            RETURN NEW;
        END $$
        """.replace("%(conflict)s", f"'{ordered[0]}'").replace("%(broken)s", f"'{ordered[10]}'")
    )
    conn.execute("CREATE TRIGGER inject_failures BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION inject_failures()")
    limits = FiringLimits(first_chunk_jobs=5, chunk_jobs=5, write_lanes=1, herd_min_jobs=10**9)
    with json_log_records() as records:
        result = _tick_once(pg_dsn, limits=limits, max_rate_per_s=100_000.0)
    record = _failed_tick_record(records)
    assert sum(_runs_by_tenant(conn).values()) == 10 == result.fired
    assert record["step"] == "fire_runs"
    assert (record["runs_committed"], record["chunks_committed"], record["chunks_failed"]) == (10, 2, 2)
    assert "injected failure" in record["error"]


def test_the_firing_sessions_are_named_apart_in_the_store(pg_dsn, conn) -> None:
    """The due scan and each write lane have their own application name, so
    pg_stat_activity and pg_stat_statements users can tell a lane's statement
    from the scan's (all grouped as ``store: fire`` by bench/cpu.py)."""
    _load_due(conn, "t", 3, due_ago_s=5)
    firer, coord = _node(pg_dsn)
    try:
        assert firer.tick().fired == 3
        names = {
            r["application_name"]
            for r in conn.execute(
                "SELECT application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'scheduler-fire%%'"
            )
        }
    finally:
        firer.close()
        coord.close()
    assert names == {"scheduler-fire-read:fair", "scheduler-fire-write0:fair", "scheduler-fire-write1:fair"}
