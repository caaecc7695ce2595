"""``/healthz``'s liveness rule (Node.liveness) with an injected watchdog clock.

No store is needed: a Node opens no connection until it starts, and the
test plays the loops' part (their thread ids, iterations, store calls).
"""

from __future__ import annotations

import threading

from scheduler.node import Node
from scheduler.settings import Settings
from scheduler.watchdog import CallBounds, Watchdog

BOUNDS = CallBounds(6.0, 8.0, 12.0)


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class FakeConn:
    pgconn = type("PgConn", (), {"socket": -1})()


def node_and_clock() -> tuple[Node, Clock, Watchdog]:
    clock = Clock()
    watchdog = Watchdog(clock, cancel=lambda conn: None, shutdown=lambda fd: None)
    node = Node(Settings(dsn="postgresql://nowhere.invalid/db", node_id="n1"), watchdog=watchdog)
    # the loops' threads as Node._run_loop records them: lease is this thread, firing another id
    node._loop_threads = {"lease": threading.get_ident(), "firing": threading.get_ident() + 1}
    node._loop_beats = {"lease": clock.now, "firing": clock.now}
    return node, clock, watchdog


def test_loops_that_iterate_are_alive():
    node, clock, _ = node_and_clock()
    for _ in range(30):
        clock.now += 1.0
        node._loop_beats = {"lease": clock.now, "firing": clock.now}
        assert node.liveness() == (True, [])


def test_a_loop_inside_a_store_call_older_than_the_statement_timeout_is_stalled():
    node, clock, watchdog = node_and_clock()
    token = watchdog.begin(FakeConn(), BOUNDS, "scheduler-lease:n1")
    clock.now += 4.0  # statement_timeout (40 % of the 10 s TTL): not yet
    node._loop_beats["firing"] = clock.now
    assert node.liveness() == (True, [])
    clock.now += 0.5
    node._loop_beats["firing"] = clock.now
    assert node.liveness() == (
        False,
        ["lease loop: stalled in a store call, nothing from the store for 4.5s (statement_timeout 4s)"],
    )
    watchdog.end(token)  # the watchdog broke it: the call returned (with an error)
    assert node.liveness() == (True, [])


def test_a_loop_with_neither_iterations_nor_store_calls_for_loop_stall_s_is_stalled():
    node, clock, watchdog = node_and_clock()
    for _ in range(12):  # a long tick that keeps committing chunks: progress
        clock.now += 1.0
        watchdog.end(watchdog.begin(FakeConn(), BOUNDS))
        node._loop_beats["firing"] = clock.now
    assert node.liveness() == (True, [])
    clock.now += 10.5  # lease loop: last store call 10.5 s ago, no iteration since 22.5 s
    node._loop_beats["firing"] = clock.now
    assert node.liveness() == (False, ["lease loop: no iteration completed for 10.5s (loop_stall_s 10s)"])


def test_a_stopping_node_and_loops_not_started_count_as_alive():
    node, clock, _ = node_and_clock()
    node._loop_threads = {"lease": threading.get_ident()}
    clock.now += 60.0
    node._loop_beats["lease"] = clock.now
    assert node.liveness() == (True, [])  # firing not started yet
    node._loop_threads["firing"] = threading.get_ident() + 1
    assert node.liveness()[0] is False
    node.stop()
    assert node.liveness() == (True, [])
