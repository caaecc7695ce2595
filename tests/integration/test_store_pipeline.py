"""The write pipeline (scheduler/store/pipeline.py) under the node's watchdog, on a real store.

A firing lane queues many chunks and waits for them all at once. The
watchdog must judge that wait by how long the store has been silent, not by
how long it lasts: a lane whose chunks keep committing is never cancelled,
however many it waits for; a lane whose store went silent (a
:class:`relay.FreezingRelay` frozen in front of it) is unblocked within the
bounds of one statement, and with every lane silent the tick does not wait
out the bound once per lane.

Timings are scaled down: statement timeout 1 s, margin 0.5 s (cancel after
1.5 s of silence, break after 2 s); the watchdog checks every 50 ms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from scheduler import store
from scheduler import watchdog as watchdog_module
from scheduler.store.queries import QUERIES
from scheduler.watchdog import CallBounds, Watchdog

STATEMENT_TIMEOUT_S = 1.0
BOUNDS = CallBounds.after_statement_timeout(STATEMENT_TIMEOUT_S, 0.5)
"""Cancel after 1.5 s of silence, break after 2 s."""

SLEEP = "select pg_sleep(%(seconds)s)::text as slept"
"""A chunk's statement: sleeps, then returns one row (as the firing statements do)."""


class Watch:
    """A started :class:`Watchdog` whose cancels and socket shutdowns are real and recorded."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, float]] = []
        self.watchdog = Watchdog(check_interval_s=0.05, cancel=self._cancel, shutdown=self._shutdown)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.watchdog.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def _cancel(self, conn: psycopg.Connection) -> None:
        self.actions.append(("cancel", time.monotonic()))
        watchdog_module._cancel_async(conn)

    def _shutdown(self, fd: int) -> None:
        self.actions.append(("shutdown", time.monotonic()))
        watchdog_module.shutdown_socket(fd)

    def lane(self, dsn: str) -> psycopg.Connection:
        """A node session (statement timeout and watchdog bounds as above) on ``dsn``."""
        return store.connect(
            dsn,
            application_name="scheduler-test-lane",
            statement_timeout_s=STATEMENT_TIMEOUT_S,
            watch=BOUNDS,
            watchdog=self.watchdog,
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Watch]:
    monkeypatch.setitem(QUERIES, "test_sleep", SLEEP)
    rig = Watch()
    try:
        yield rig
    finally:
        rig.stop()


@pytest.mark.parametrize("pad", [0, 4_000_000], ids=["small", "sends-wait"])
def test_a_lane_whose_chunks_keep_committing_is_not_cancelled_however_long_it_waits(pg_dsn, watch, monkeypatch, pad):
    """Five chunks of 0.4 s on one lane, collected after leaving the pipeline: one wait of
    ~2 s, past the 1.5 s bound, but the store answers every 0.4 s. With a 4 MB parameter
    per chunk, sending a chunk itself waits (the socket's buffers full) until the store has
    run the chunks before it: those sends hear each chunk commit too."""
    monkeypatch.setitem(QUERIES, "test_sleep", SLEEP.replace(" as slept", " as slept, length(%(pad)s) * 0 as n"))
    lane = watch.lane(pg_dsn)
    try:
        started = time.monotonic()
        with store.Pipeline([lane]) as pipeline:
            for chunk in range(5):
                pipeline.send("test_sleep", {"seconds": 0.4, "pad": "x" * pad}, {chunk})
        committed, failed = pipeline.collect()
        elapsed = time.monotonic() - started
        assert failed == []
        assert [(item.partitions, row) for item, row in committed] == [({c}, {"slept": "", "n": 0}) for c in range(5)]
        assert watch.actions == []
        assert elapsed >= 2.0 > BOUNDS.cancel_after_s  # the wait was longer than one statement's bound
        assert lane.execute("select 1 as one").fetchone() == {"one": 1}  # the lane is still usable
    finally:
        lane.close()


def test_a_silent_lane_is_unblocked_within_one_statements_bounds_of_the_silence(pg_dsn, relay, watch):
    """The store goes silent while the tick is still busy elsewhere (1 s: planning, other
    lanes) before it waits on the lane: the bounds count from the silence (the chunks owed
    since), not from the wait's start (which gave 1 s + 1.5 s, then 1 s + 2 s)."""
    lane = watch.lane(relay.dsn(pg_dsn))
    try:
        with pytest.raises(psycopg.OperationalError):
            with store.Pipeline([lane]) as pipeline:
                sent = time.monotonic()
                for chunk in range(3):
                    pipeline.send("test_sleep", {"seconds": 0.1}, {chunk})
                frozen = time.monotonic()
                relay.freeze()
                time.sleep(1.0)
        unblocked = time.monotonic()
        committed, failed = pipeline.collect()
        assert committed == [] and [item.partitions for item in failed] == [{0}, {1}, {2}]
        assert [kind for kind, _ in watch.actions] == ["cancel", "shutdown"]
        (_, cancelled), (_, broken) = watch.actions
        # Silent since the store last answered: between the first send and the freeze.
        assert sent + BOUNDS.cancel_after_s <= cancelled < frozen + BOUNDS.cancel_after_s + 0.4
        assert sent + BOUNDS.break_after_s <= broken <= unblocked < frozen + BOUNDS.break_after_s + 0.4
        assert lane.closed
    finally:
        lane.close()


def test_a_lane_read_late_is_not_held_to_the_silence_before_its_answer_arrived(pg_dsn, watch, monkeypatch):
    """A chunk answered while the tick was busy elsewhere for longer than the bound: its
    results wait in the socket (the chunk's flush request went out with it), so the next
    call on the lane counts from its own start, however late it comes."""
    lane = watch.lane(pg_dsn)
    owed: list[bool] = []
    begin = watch.watchdog.begin

    def recording(conn, bounds, label="", **kwargs):
        owed.append(kwargs.get("owed", True))
        return begin(conn, bounds, label, **kwargs)

    monkeypatch.setattr(watch.watchdog, "begin", recording)
    try:
        with store.Pipeline([lane]) as pipeline:
            pipeline.send("test_sleep", {"seconds": 0.3}, {0})
            assert not lane._answer_waiting()  # the store is still on it
            time.sleep(BOUNDS.break_after_s + 0.5)  # the node busy elsewhere, the answer long here
            assert lane._answer_waiting()
            owed.clear()
            pipeline.send("test_sleep", {"seconds": 0.1}, {1})
            assert owed[0] is False  # the send's first call found the answer waiting
        committed, failed = pipeline.collect()
        assert failed == [] and [item.partitions for item, _ in committed] == [{0}, {1}]
        assert watch.actions == []
    finally:
        lane.close()


def test_with_every_lane_silent_the_pipeline_is_left_within_one_bound_not_one_per_lane(pg_dsn, relay, watch):
    """Two lanes frozen with chunks in flight: the first lane's wait is broken after 2 s of
    silence; the second, never waited on, is closed (its chunks' outcomes unknown). Waiting on
    each in turn took 2 × 2 s."""
    lanes = [watch.lane(relay.dsn(pg_dsn)) for _ in range(2)]
    try:
        with pytest.raises(psycopg.OperationalError):
            with store.Pipeline(lanes) as pipeline:
                sent = time.monotonic()
                for chunk in range(6):
                    pipeline.send("test_sleep", {"seconds": 0.1}, {chunk})
                frozen = time.monotonic()
                relay.freeze()
        unblocked = time.monotonic()
        committed, failed = pipeline.collect()
        assert committed == [] and len(failed) == 6
        assert [kind for kind, _ in watch.actions] == ["cancel", "shutdown"]  # one lane waited on
        # Silent since the store last answered (between the first send and the freeze).
        assert sent + BOUNDS.break_after_s <= unblocked < frozen + BOUNDS.break_after_s + 1.0
        assert all(lane.closed for lane in lanes)
    finally:
        for lane in lanes:
            lane.close()


def test_a_lane_the_store_dropped_ends_the_pipeline_without_waiting_on_the_others(pg_dsn, conn, watch):
    """A lane's backend terminated while a healthy lane still has chunks running: the
    healthy lane is closed, not waited on; the error is the dropped lane's."""
    lanes = [watch.lane(pg_dsn), watch.lane(pg_dsn)]
    try:
        pid = lanes[0].info.backend_pid
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="terminat"):
            with store.Pipeline(lanes) as pipeline:
                pipeline.send("test_sleep", {"seconds": 0.2}, {0})
                pipeline.send("test_sleep", {"seconds": 0.9}, {1})
                conn.execute("select pg_terminate_backend(%s)", [pid])
        assert time.monotonic() - started < 0.9  # the second lane's chunk was not waited for
        committed, failed = pipeline.collect()
        assert committed == [] and [item.partitions for item in failed] == [{0}, {1}]
        assert watch.actions == []
        assert all(lane.closed for lane in lanes)
    finally:
        for lane in lanes:
            lane.close()
