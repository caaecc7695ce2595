"""The store-call watchdog (scheduler/watchdog.py) with an injected clock.

The watchdog's thread is not started: each test calls ``check()`` itself
after moving a manual clock, with recording stand-ins for the cancel request
and the socket shutdown. One test breaks a real socket pair to show that
:func:`shutdown_socket` unblocks a thread waiting on it without closing its
descriptor.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Generator

import pytest

from scheduler.settings import Settings
from scheduler.watchdog import (
    SYNC_REP_CANCELLED,
    CallBounds,
    Watchdog,
    WatchedConnection,
    reporting_reads,
    shutdown_socket,
)


class FakeConn:
    """What the watchdog reads of a psycopg connection: ``pgconn.socket``."""

    def __init__(self, fd: int) -> None:
        self.pgconn = type("PgConn", (), {"socket": fd})()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float, watchdog: Watchdog) -> None:
        """Move time forward in check-sized steps, checking at each (as the thread does)."""
        for _ in range(round(seconds / STEP_S)):
            self.now += STEP_S
            watchdog.check()


STEP_S = 0.125
"""The rig's check interval: a binary fraction, so sums of steps are exact."""


@pytest.fixture
def rig():
    clock = Clock()
    actions: list[tuple] = []
    watchdog = Watchdog(
        clock,
        check_interval_s=STEP_S,
        cancel=lambda conn: actions.append(("cancel", conn.pgconn.socket, clock.now)),
        shutdown=lambda fd: actions.append(("shutdown", fd, clock.now)),
        on_stuck=lambda call: actions.append(("stuck", call.fd, clock.now)),
    )
    watchdog.check()  # first look: sets the reference time
    return clock, watchdog, actions


BOUNDS = CallBounds(cancel_after_s=5.0, break_after_s=7.0, exit_after_s=9.0)


def test_a_call_past_its_bounds_is_cancelled_then_broken_then_reported_stuck(rig):
    clock, watchdog, actions = rig
    token = watchdog.begin(FakeConn(41), BOUNDS, "scheduler-fire:n1")
    clock.advance(4.875, watchdog)
    assert actions == []
    clock.advance(0.125, watchdog)
    assert actions == [("cancel", 41, pytest.approx(105.0))]
    clock.advance(2.0, watchdog)
    assert actions[1:] == [("shutdown", 41, pytest.approx(107.0))]
    clock.advance(2.0, watchdog)
    assert actions[2:] == [("stuck", 41, pytest.approx(109.0))]
    clock.advance(10.0, watchdog)
    assert len(actions) == 3  # each step once
    watchdog.end(token)
    assert watchdog.in_flight() == []


def test_calls_that_return_in_time_are_left_alone_and_progress_is_recorded(rig):
    clock, watchdog, actions = rig
    thread = threading.get_ident()
    for _ in range(20):
        token = watchdog.begin(FakeConn(7), BOUNDS)
        assert watchdog.thread_state(thread) == (pytest.approx(clock.now), None if _ == 0 else pytest.approx(clock.now))
        clock.advance(4.0, watchdog)
        watchdog.end(token)
    assert actions == []
    assert watchdog.thread_state(thread) == (None, pytest.approx(180.0))


def test_only_the_late_call_is_acted_on(rig):
    clock, watchdog, actions = rig
    watchdog.begin(FakeConn(10), BOUNDS)
    clock.advance(3.0, watchdog)
    young = watchdog.begin(FakeConn(11), BOUNDS)
    clock.advance(4.0, watchdog)
    assert [(kind, fd) for kind, fd, _ in actions] == [("cancel", 10), ("shutdown", 10)]
    watchdog.end(young)
    clock.advance(10.0, watchdog)
    assert [(kind, fd) for kind, fd, _ in actions] == [("cancel", 10), ("shutdown", 10), ("stuck", 10)]


def test_time_the_process_was_suspended_does_not_count(rig):
    clock, watchdog, actions = rig
    watchdog.begin(FakeConn(5), BOUNDS)
    clock.advance(2.0, watchdog)
    clock.now += 60.0  # SIGSTOP for a minute: no check ran meanwhile
    watchdog.check()  # counts as one check interval, not 60 s
    assert actions == []
    clock.advance(2.75, watchdog)  # 2 + 0.125 + 2.75 s of the call's life seen
    assert actions == []
    clock.advance(0.125, watchdog)
    assert [kind for kind, _, _ in actions] == ["cancel"]


def test_a_call_the_store_keeps_answering_is_judged_on_its_silence_not_its_length(rig, monkeypatch):
    """A wait on a deep pipeline: each chunk's results reset the bound; silence is still bounded."""
    clock, watchdog, actions = rig
    events: list[tuple[str, dict]] = []
    thread = threading.get_ident()
    token = watchdog.begin(FakeConn(12), BOUNDS, "scheduler-fire:n1")
    for _ in range(6):  # six chunks committing 4.5 s apart: 27 s in all, never 5 s of silence
        clock.advance(4.5, watchdog)
        watchdog.progress(token)
        assert watchdog.thread_state(thread)[0] == pytest.approx(clock.now)
    assert actions == []
    monkeypatch.setattr("scheduler.watchdog.log.event", lambda name, level=0, **fields: events.append((name, fields)))
    clock.advance(5.0, watchdog)  # then the store goes silent
    assert actions == [("cancel", 12, pytest.approx(132.0))]
    assert events == [("store_call_cancelled", {"session": "scheduler-fire:n1", "seconds": 5.0, "call_s": 32.0})]
    watchdog.progress(token)  # the answer to a cancel is not progress: the break still comes on time
    clock.advance(2.0, watchdog)
    assert actions[1:] == [("shutdown", 12, pytest.approx(134.0))]
    assert events[1:] == [("store_call_broken", {"session": "scheduler-fire:n1", "seconds": 7.0, "call_s": 34.0})]
    watchdog.end(token)
    watchdog.progress(token)  # a call no longer in flight: nothing to move
    assert watchdog.in_flight() == [] and watchdog.thread_state(thread) == (None, pytest.approx(134.0))


def test_a_pipelines_silence_counts_across_its_calls_until_the_store_answers(rig):
    """Chunks queued in one call, waited for in a later one: the wait is judged from when the
    store last sent the connection something while it owed results, unless an answer is
    already waiting (``owed=False`` at begin), and a pause of the process does not count."""
    clock, watchdog, actions = rig
    conn = FakeConn(21)
    send = watchdog.begin(conn, BOUNDS)  # t = 100: chunks sent
    clock.advance(0.5, watchdog)
    watchdog.progress(send)  # t = 100.5: the store answered the first
    clock.advance(0.5, watchdog)
    watchdog.end(send, owed=True)  # t = 101: more results owed
    clock.advance(1.5, watchdog)  # the tick plans its next pass
    wait = watchdog.begin(conn, BOUNDS)  # t = 102.5, silent since 100.5
    assert watchdog.thread_state(threading.get_ident())[0] == pytest.approx(100.5)
    clock.advance(2.875, watchdog)
    assert actions == []
    clock.advance(0.125, watchdog)
    assert actions == [("cancel", 21, pytest.approx(105.5))]  # 5 s of silence, 3 s of waiting
    watchdog.end(wait)  # nothing owed any more: the next call counts from its own start
    other = watchdog.begin(conn, BOUNDS)
    clock.advance(4.875, watchdog)
    watchdog.progress(other)  # t = 110.375
    assert len(actions) == 1
    watchdog.end(other, owed=True)
    clock.now += 60.0  # the process suspended between two calls
    watchdog.check()
    late = watchdog.begin(conn, BOUNDS)  # silent since 110.375, less the pause: 0.125 s
    clock.advance(4.75, watchdog)
    assert len(actions) == 1
    clock.advance(0.125, watchdog)
    assert actions[1:] == [("cancel", 21, pytest.approx(175.25))]
    watchdog.end(late, owed=True)
    answered = watchdog.begin(conn, BOUNDS, owed=False)  # an answer waiting: counts from now
    clock.advance(4.875, watchdog)
    assert len(actions) == 2
    watchdog.end(answered)


def test_only_reads_count_as_progress_and_the_generator_is_driven_unchanged():
    """:func:`reporting_reads` passes psycopg's readiness bits through and returns the result."""
    seen: list[int] = []

    def io() -> Generator[int, int, str]:
        for want in (3, 1, 2, 3):  # WAIT_RW, WAIT_R, WAIT_W, WAIT_RW
            seen.append((yield want))
        return "results"

    reads: list[int] = []
    wrapped = reporting_reads(io(), lambda: reads.append(len(seen)))
    states = [next(wrapped)]
    with pytest.raises(StopIteration) as done:
        for ready in (2, 1, 0, 3):  # writable, readable, an interval with neither, both
            states.append(wrapped.send(ready))
    assert (states, seen, done.value.value) == ([3, 1, 2, 3], [2, 1, 0, 3], "results")
    assert reads == [1, 3]  # called before the readable and the both-ready sends reached ``io``


def test_bounds_follow_the_statement_timeout_and_the_margin():
    assert CallBounds.after_statement_timeout(4.0, 2.0) == CallBounds(6.0, 8.0, 12.0)
    assert CallBounds.after_statement_timeout(0.8, 0.5) == CallBounds(1.3, 1.8, 3.8)
    with pytest.raises(ValueError):
        CallBounds(2.0, 1.0, 3.0)


def test_settings_derive_the_client_side_bounds_from_the_ttl():
    s = Settings(dsn="postgresql://h/db", lease_ttl_s=10.0).validated()
    assert (s.effective_statement_timeout_s, s.effective_store_call_margin_s) == (4.0, 2.0)
    assert (s.keepalive_idle_s, s.keepalive_interval_s, s.keepalive_count) == (2, 1, 3)
    assert s.effective_tcp_user_timeout_s == 5.0
    assert (s.effective_loop_stall_s, s.stop_timeout_s) == (10.0, 10.0)
    small = Settings(dsn="postgresql://h/db", lease_ttl_s=2.0, renew_interval_s=0.5).validated()
    assert (small.effective_store_call_margin_s, small.keepalive_idle_s, small.effective_tcp_user_timeout_s) == (
        0.5,
        1,
        1.0,
    )


@pytest.mark.parametrize(
    "ttl_s, renew_s, cancel_s, break_s",
    [(2.0, 0.5, 1.3, 1.8), (4.0, 1.0, 2.4, 3.2), (10.0, 3.0, 6.0, 8.0), (60.0, 3.0, 36.0, 48.0)],
)
def test_the_default_bound_on_a_store_call_is_below_the_lease_ttl(ttl_s, renew_s, cancel_s, break_s):
    """A call stalled past every server-side timeout (a COMMIT waiting on synchronous replication)
    is cancelled at statement timeout + margin: 60 % of the TTL (the margin at least 0.5 s), so a
    stalled owner's call ends before its leases can be taken; its connection is broken at 80 %."""
    s = Settings(dsn="postgresql://h/db", lease_ttl_s=ttl_s, renew_interval_s=renew_s).validated()
    bounds = CallBounds.after_statement_timeout(s.effective_statement_timeout_s, s.effective_store_call_margin_s)
    assert (bounds.cancel_after_s, bounds.break_after_s) == (pytest.approx(cancel_s), pytest.approx(break_s))
    assert bounds.cancel_after_s < ttl_s


class Diag:
    """What :meth:`WatchedConnection.on_notice` reads of a notice (psycopg's ``Diagnostic``)."""

    def __init__(self, message: str, severity: str = "WARNING", sqlstate: str = "01000") -> None:
        self.message_primary, self.severity_nonlocalized, self.sqlstate = message, severity, sqlstate


def test_a_commit_wait_the_cancel_ended_is_reported_with_the_reason_and_the_bound(rig, monkeypatch):
    """The WARNING of a COMMIT whose wait on synchronous replication was cancelled: by its
    message, or (another ``lc_messages``) as a plain WARNING on a call the watchdog cancelled."""
    clock, watchdog, actions = rig
    events: list[tuple[str, dict]] = []
    monkeypatch.setattr("scheduler.watchdog.log.event", lambda name, level=0, **fields: events.append((name, fields)))
    conn = FakeConn(43)  # on_notice reads only the connection's watch and its call in flight
    conn.watch = (watchdog, BOUNDS, "scheduler-fire:n1")
    conn._call = watchdog.begin(conn, BOUNDS, "scheduler-fire:n1")

    def notice(diag: Diag) -> None:
        WatchedConnection.on_notice(conn, diag)  # type: ignore[arg-type]

    notice(Diag("annulation de l'attente de la réplication synchrone"))  # not cancelled yet: not ours
    notice(Diag("some notice", severity="NOTICE", sqlstate="00000"))
    assert watchdog.commit_waits_cancelled == 0
    clock.advance(5.0, watchdog)
    assert actions == [("cancel", 43, pytest.approx(105.0))]
    notice(Diag("annulation de l'attente de la réplication synchrone"))
    notice(Diag(f"{SYNC_REP_CANCELLED} due to user request"))
    assert watchdog.commit_waits_cancelled == 2
    cancelled = [fields for name, fields in events if name == "store_commit_wait_cancelled"]
    assert [(f["session"], f["bound_s"]) for f in cancelled] == [("scheduler-fire:n1", 5.0)] * 2
    assert "waited on synchronous replication" in cancelled[0]["reason"]
    assert "committed locally" in cancelled[0]["reason"]
    watchdog.end(conn._call)
    conn._call = None
    notice(Diag("annulation de l'attente de la réplication synchrone"))  # no call in flight
    assert watchdog.commit_waits_cancelled == 2


def test_shutdown_socket_unblocks_a_reader_and_keeps_its_descriptor():
    left, right = socket.socketpair()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(left.recv(10)))
    reader.start()
    shutdown_socket(left.fileno())
    reader.join(5)
    assert not reader.is_alive() and got == [b""]
    os.fstat(left.fileno())  # still open: only its owner closes it
    left.close()
    right.close()
