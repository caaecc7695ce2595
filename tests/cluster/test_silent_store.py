"""A store connection that goes silent (a hung pooler or proxy, a vanished host).

A :class:`relay.FreezingRelay` on 127.0.0.1 sits between the node and the
store; at one instant it stops forwarding on every open connection (sockets
stay open, bytes are read and dropped, so the node's kernel sees every
segment acknowledged and TCP keepalives cannot help) while new connections
still pass. The node must notice by itself (its store-call watchdog):

* ``/healthz`` is not 200 while a loop is stalled (an orchestrator restarts it);
* it fires again through new connections, and ``verify`` over the whole
  window finds every (job, slot) exactly once;
* SIGTERM during the freeze ends the process within 15 s, even when nothing
  unblocks its threads (the stop deadline, exit status 1).

Timings are the harness's (TTL 2 s, statement timeout 0.8 s); the watchdog's
margin is raised so the stall lasts long enough to be observed on two shared
cores (the store call is broken at statement timeout + 2 × margin).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from harness import MARGIN_S, Cluster, add_interval_jobs
from relay import FreezingRelay

pytestmark = pytest.mark.cluster

JOBS = 100
"""Interval jobs firing every second."""

STALL_MARGIN_S = 2.0
"""``--store-call-margin-s`` of the resuming node: a call stuck in the freeze is
cancelled after 0.8 + 2 s and its connection broken after 0.8 + 4 s."""

RESUME_TIMEOUT_S = 30.0
"""The node fires again through new connections within this (the issue's bound)."""

STOP_BOUND_S = 15.0
"""SIGTERM ends the node within this, whatever its threads are doing."""


def healthz(port: int) -> int | None:
    """``GET /healthz``'s status, or None if the endpoint did not answer within 2 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _start(cluster: Cluster, pg_dsn: str, relay: FreezingRelay, flags: list[str]):
    add_interval_jobs(cluster.conn, JOBS)
    since = cluster.now()
    node = cluster.spawn("n1", ["--metrics-port", "0", *flags], dsn=relay.dsn(pg_dsn))
    port = node.wait_event("metrics_listening", timeout_s=15)["port"]
    cluster.wait_balanced(["n1"])
    cluster.wait_fired("n1", cluster.now())
    assert healthz(port) == 200
    return since, node, port


def test_frozen_connections_stall_is_reported_and_the_node_resumes_through_new_ones(cluster, pg_dsn, relay):
    since, node, port = _start(cluster, pg_dsn, relay, ["--store-call-margin-s", str(STALL_MARGIN_S)])
    accepted = relay.accepted
    assert relay.freeze() >= 3  # lease, firing, probe sessions at least
    frozen_at = cluster.now()

    cluster.wait_for(
        "/healthz to report the stalled loops",
        lambda: healthz(port),
        lambda status: status != 200,
        timeout_s=10 + MARGIN_S,
        interval_s=0.1,
    )
    resumed = cluster.wait_fired("n1", frozen_at + timedelta(seconds=1), timeout_s=RESUME_TIMEOUT_S)
    assert relay.accepted > accepted  # through new connections
    assert resumed
    assert node.events_named("store_call_broken"), node.tail()
    cluster.wait_for(
        "/healthz to be 200 again",
        lambda: healthz(port),
        lambda status: status == 200,
        timeout_s=10 + MARGIN_S,
        interval_s=0.1,
    )
    resumed_at = cluster.now()
    history = cluster.finish(since, covering=resumed_at, timeout_s=20)
    assert (history.report.missing, history.report.duplicates) == (0, 0)
    cluster.stop_all()


def test_sigterm_during_the_freeze_ends_the_node_within_the_stop_deadline(cluster, pg_dsn, relay):
    # A margin far beyond the test: the watchdog does not unblock the threads
    # before the stop deadline (10 s by default) ends the process.
    _, node, port = _start(cluster, pg_dsn, relay, ["--store-call-margin-s", "120"])
    relay.freeze()
    cluster.wait_for(
        "/healthz to report the stalled loops",
        lambda: healthz(port),
        lambda status: status != 200,
        timeout_s=10 + MARGIN_S,
        interval_s=0.1,
    )
    started = time.monotonic()
    status = node.terminate(timeout_s=STOP_BOUND_S)
    assert time.monotonic() - started < STOP_BOUND_S
    assert status == 1, node.tail()
    assert node.events_named("stop_deadline_passed"), node.tail()
