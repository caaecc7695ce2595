"""Push to HTTP targets against a real store and a real receiver (scheduler/delivery/push.py).

The receiver is a threaded ``http.server`` on 127.0.0.1 answering from a
script; the node's push loop is driven by :meth:`PushLoop.run_once` (one
claim, every attempt to its end, outcomes recorded) with the store clock
pinned, and the owner's settle step is called directly at pinned instants,
so every time in the store is exact. Runs are written as the firing
statement writes them (pending, no queue) for a job with a ``job_delivery``
row written directly.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from click.testing import CliRunner
from helpers import OneNode, Receiver, pending_run, record_named_queries, run_row, wait_for

import scheduler
from scheduler import jobs
from scheduler.cli import cli as main_cli
from scheduler.clock import ManualClock
from scheduler.delivery import lifecycle, signing, tenant_secrets
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.push import PushLoop
from scheduler.errors import NotFoundError, ValidationError
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.settings import Settings
from scheduler.spec import JobSpec

T0 = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
S = timedelta(seconds=1)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def epochs(pg_dsn: str):
    """``{partition: epoch}`` of node ``t1``, which holds every partition's lease."""
    owner = OneNode(pg_dsn)
    yield {pid: owner.epoch(pid) for pid in range(1024)}
    owner.close()


def make_loop(
    pg_dsn: str, epochs: dict[int, int], clock: ManualClock, resolve=None, metrics=None, **overrides
) -> PushLoop:
    """The node's push loop acting for ``epochs``; ``push_allow`` 127.0.0.1/32 unless overridden;
    ``resolve`` pins host names to addresses (``{"name": ["127.0.0.1"]}``), as DNS would answer."""
    settings = Settings(dsn=pg_dsn, node_id="t1", **{"push_allow": "127.0.0.1/32", **overrides}).validated()
    return PushLoop(settings, lambda: epochs, clock, metrics, resolve=resolve)


def http_job(
    conn: psycopg.Connection,
    url: str,
    *,
    name: str | None = "nightly",
    payload: object = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    timeout_s: float | None = None,
    max_attempts: int = 5,
    backoff_base_s: float = 1.0,
    backoff_cap_s: float = 300.0,
    tenant: str = "acme",
) -> uuid.UUID:
    """A job with an HTTP target (``job_delivery`` written directly, bypassing the save-time URL check)."""
    job_id = jobs.add_job(conn, JobSpec.build(tenant=tenant, name=name, interval_s=3600)).job_id
    conn.execute("UPDATE jobs SET queue = NULL WHERE job_id = %s", (job_id,))
    conn.execute(
        """
        INSERT INTO job_delivery (partition_id, job_id, url, method, headers, timeout_s, payload,
                                  max_attempts, backoff_base_s, backoff_cap_s)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            RunKey.of(job_id, T0).partition_id,
            job_id,
            url,
            method,
            None if headers is None else json.dumps(headers),
            timeout_s,
            None if payload is None else json.dumps(payload),
            max_attempts,
            backoff_base_s,
            backoff_cap_s,
        ),
    )
    return job_id


def pending_push_run(conn: psycopg.Connection, job_id: uuid.UUID, nominal: datetime) -> RunKey:
    """A pushed run of ``job_id`` as the firing statement writes it: no queue, scheduled 2 s after ``nominal``."""
    return pending_run(conn, job_id, nominal, queue=None, scheduled=nominal + 2 * S)


def settle(conn: psycopg.Connection, epochs: dict[int, int], clock: ManualClock) -> lifecycle.SettleResult:
    return lifecycle.settle(conn, node_id="t1", epochs=epochs, now=clock.store_now_or_none())


def test_a_2xx_is_acked_with_the_headers_and_a_signature_verify_accepts(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(
        conn, receiver.url(), payload={"k": 1, "name": "été"}, headers={"X-Token": "abc", "Idempotency-Key": "x"}
    )
    _, secret, _, _ = tenant_secrets.rotate(conn, "acme", 0, now=T0 - 10 * S)
    key = pending_push_run(conn, job_id, T0)
    clock = ManualClock(store_at=T0 + 3 * S)
    metrics = Metrics()
    loop = make_loop(pg_dsn, epochs, clock, metrics=metrics)
    try:
        (outcome,) = loop.run_once()
    finally:
        loop.close()
    assert (outcome.outcome, outcome.status) == ("succeeded", 200)
    (request,) = receiver.requests
    assert (request["method"], request["path"]) == ("POST", "/hook")
    assert request["body"] == '{"k":1,"name":"été"}'.encode()
    headers = request["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == key.run_id  # ours win over the job's own
    assert headers["x-token"] == "abc"
    assert headers["scheduler-job-id"] == str(job_id)
    assert headers["scheduler-job-name"] == "nightly"
    assert headers["scheduler-nominal-time"] == "2031-03-04T05:06:07Z"
    assert headers["scheduler-scheduled-time"] == "2031-03-04T05:06:09Z"
    assert headers["scheduler-attempt"] == "1"
    assert headers["user-agent"] == f"trigger-engine/{scheduler.__version__}"
    t = signing.verify(headers["scheduler-signature"], request["body"], [secret], now=clock.wall())
    assert t == int(clock.wall())
    assert headers["scheduler-signature"].count("v1=") == 1
    with pytest.raises(signing.SignatureError):
        signing.verify(headers["scheduler-signature"], request["body"] + b" ", [secret], now=clock.wall())
    with pytest.raises(signing.SignatureError):  # a replay 301 s later
        signing.verify(headers["scheduler-signature"], request["body"], [secret], now=clock.wall() + 301)
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["worker"], row["finished_at"]) == ("succeeded", 1, "t1", T0 + 3 * S)
    assert metrics.value("scheduler_push_attempts_total", {"outcome": "succeeded"}) == 1
    assert metrics.value("scheduler_push_latency_seconds_count", {"outcome": "succeeded"}) == 1


def test_no_payload_is_a_json_null_body_and_put_is_the_jobs_method(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url("/p?x=1"), name=None, method="PUT")
    key = pending_push_run(conn, job_id, T0)
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 3 * S))
    try:
        loop.run_once()
    finally:
        loop.close()
    (request,) = receiver.requests
    assert (request["method"], request["path"], request["body"]) == ("PUT", "/p?x=1", b"null")
    assert "scheduler-job-name" not in request["headers"]
    assert run_row(conn, key)["state"] == "succeeded"


def test_a_500_is_retried_with_backoff_then_dead_after_max_attempts(pg_dsn, conn, receiver, epochs, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="scheduler")
    job_id = http_job(conn, receiver.url(), max_attempts=3, backoff_base_s=1.0, backoff_cap_s=1.5)
    key = pending_push_run(conn, job_id, T0)
    receiver.script = [(500, {}, 0.0)] * 3
    clock = ManualClock(store_at=T0 + 3 * S)
    loop = make_loop(pg_dsn, epochs, clock)
    try:
        for attempt, cap in ((1, 1.0), (2, 1.5)):
            (outcome,) = loop.run_once()
            assert (outcome.outcome, outcome.status) == ("retry", 500)
            row = run_row(conn, key)
            assert (row["state"], row["attempt"], row["last_error"]) == (
                "failed",
                attempt,
                "HTTP 500 Internal Server Error",
            )
            now = clock.store_now_or_none()
            assert settle(conn, epochs, clock).retried == 1
            row = run_row(conn, key)
            assert row["state"] == "pending"
            assert now <= row["available_at"] <= now + timedelta(seconds=cap)  # min(cap, base * 2^(attempt - 1))
            if row["available_at"] > now:  # not before its backoff
                assert loop.run_once() == []
            clock.advance((row["available_at"] - now).total_seconds())
        (outcome,) = loop.run_once()
        assert outcome.outcome == "retry"
        assert settle(conn, epochs, clock).dead == 1
    finally:
        loop.close()
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["last_error"]) == ("dead", 3, "HTTP 500 Internal Server Error")
    assert row["finished_at"] == clock.store_now_or_none()
    assert [r["headers"]["scheduler-attempt"] for r in receiver.requests] == ["1", "2", "3"]
    assert {r["headers"]["idempotency-key"] for r in receiver.requests} == {key.run_id}
    # Each failed attempt that may be retried: one DEBUG record (the run going dead is the
    # settle step's WARNING run_dead, tests/integration/test_delivery_lifecycle.py).
    logged = [(r.event, r.levelno, r.fields) for r in caplog.records if getattr(r, "event", "").startswith("push_")]
    assert logged == [
        (
            "push_retry",
            logging.DEBUG,
            {"node": "t1", "run_id": key.run_id, "attempt": n, "error": "HTTP 500 Internal Server Error"},
        )
        for n in (1, 2, 3)
    ]


def test_a_429_with_retry_after_is_not_retried_before_it(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url(), backoff_base_s=1.0, backoff_cap_s=1.0)
    key = pending_push_run(conn, job_id, T0)
    receiver.script = [(429, {"Retry-After": "7"}, 0.0)]
    clock = ManualClock(store_at=T0 + 3 * S)
    loop = make_loop(pg_dsn, epochs, clock)
    try:
        (outcome,) = loop.run_once()
        assert (outcome.outcome, outcome.retry_after_s) == ("retry", 7.0)
        assert run_row(conn, key)["available_at"] == T0 + 10 * S
        assert settle(conn, epochs, clock).retried == 1
        row = run_row(conn, key)
        # The backoff (at most 1 s) is shorter: the receiver's wish decides.
        assert (row["state"], row["available_at"]) == ("pending", T0 + 10 * S)
        clock.advance(6.999)
        assert loop.run_once() == []
        clock.advance(0.001)
        (outcome,) = loop.run_once()
        assert outcome.outcome == "succeeded"
    finally:
        loop.close()
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["finished_at"]) == ("succeeded", 2, T0 + 10 * S)
    assert len(receiver.requests) == 2


def test_an_http_date_retry_after_counts_from_the_clock(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url(), backoff_base_s=1.0, backoff_cap_s=1.0)
    key = pending_push_run(conn, job_id, T0)
    clock = ManualClock(wall_s=1_900_000_000.0, store_at=T0 + 3 * S)
    receiver.script = [(503, {"Retry-After": email.utils.formatdate(1_900_000_020, usegmt=True)}, 0.0)]
    loop = make_loop(pg_dsn, epochs, clock)
    try:
        (outcome,) = loop.run_once()
    finally:
        loop.close()
    assert (outcome.outcome, outcome.retry_after_s) == ("retry", 20.0)
    assert run_row(conn, key)["available_at"] == T0 + 23 * S


def test_a_404_is_dead_after_one_attempt(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url())
    key = pending_push_run(conn, job_id, T0)
    receiver.script = [(404, {"Retry-After": "5"}, 0.0)]
    clock = ManualClock(store_at=T0 + 3 * S)
    metrics = Metrics()
    loop = make_loop(pg_dsn, epochs, clock, metrics=metrics)
    try:
        (outcome,) = loop.run_once()
        assert (outcome.outcome, outcome.retry_after_s) == ("failed", None)
        assert settle(conn, epochs, clock).dead == 1
        clock.advance(3600)
        assert loop.run_once() == []
    finally:
        loop.close()
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["last_error"]) == ("dead", 1, "HTTP 404 Not Found")
    assert row["finished_at"] == T0 + 3 * S
    assert len(receiver.requests) == 1
    assert metrics.value("scheduler_push_attempts_total", {"outcome": "failed"}) == 1
    assert metrics.value("scheduler_push_attempts_total", {"outcome": "retry"}) == 0


def test_a_redirect_is_not_followed(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url())
    key = pending_push_run(conn, job_id, T0)
    receiver.script = [(302, {"Location": receiver.url("/elsewhere")}, 0.0)]
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 3 * S))
    try:
        (outcome,) = loop.run_once()
    finally:
        loop.close()
    assert (outcome.outcome, outcome.status) == ("failed", 302)
    assert [r["path"] for r in receiver.requests] == ["/hook"]
    assert run_row(conn, key)["retryable"] is False


def test_a_timeout_is_retried(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url(), timeout_s=0.5)
    key = pending_push_run(conn, job_id, T0)
    receiver.script = [(200, {}, 3.0)]  # answers long after the attempt's deadline
    clock = ManualClock(store_at=T0 + 3 * S)
    loop = make_loop(pg_dsn, epochs, clock)
    try:
        (first,) = loop.run_once()
        assert (first.outcome, first.error) == ("retry", "timeout after 0.5s")
        row = run_row(conn, key)
        # The attempt's lease covered the deadline plus the margin.
        assert (row["state"], row["attempt"], row["last_error"]) == ("failed", 1, "timeout after 0.5s")
        assert settle(conn, epochs, clock).retried == 1
        clock.advance(1)  # past the first backoff (at most 1 s)
        (second,) = loop.run_once()
        assert second.outcome == "succeeded"
    finally:
        loop.close()
    assert run_row(conn, key)["attempt"] == 2
    assert [r["headers"]["idempotency-key"] for r in receiver.requests] == [key.run_id] * 2


def test_a_refused_connection_is_retried(pg_dsn, conn, epochs) -> None:
    from helpers import closed_port

    job_id = http_job(conn, f"http://127.0.0.1:{closed_port()}/hook")
    key = pending_push_run(conn, job_id, T0)
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 3 * S))
    try:
        (outcome,) = loop.run_once()
    finally:
        loop.close()
    assert outcome.outcome == "retry" and outcome.error.startswith("connection error: ")
    row = run_row(conn, key)
    assert (row["state"], row["retryable"]) == ("failed", True)


def test_a_failed_secrets_read_retries_the_claimed_runs_and_sends_nothing_unsigned(
    pg_dsn, conn, receiver, epochs, monkeypatch
) -> None:
    """The secrets are read right after the claim, in the same hop to the store thread: when
    that read fails the claimed run is not sent (never unsigned) but nacked for a retry, and
    the claim itself stands (attempt 1 used)."""
    job_id = http_job(conn, receiver.url())
    key = pending_push_run(conn, job_id, T0)

    def broken(*args, **kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(tenant_secrets, "signing_secrets", broken)
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 3 * S))
    try:
        (outcome,) = loop.run_once()
    finally:
        loop.close()
    assert (outcome.run.key, outcome.outcome, outcome.error) == (key, "retry", "signing secrets unavailable")
    assert receiver.requests == []
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["retryable"], row["last_error"]) == (
        "failed",
        1,
        True,
        "signing secrets unavailable",
    )


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "169.254.169.254", "[::1]", "metadata.test", "localhost.test"],
)
def test_an_ssrf_attempt_without_an_allowlist_is_refused_at_connect(pg_dsn, conn, receiver, epochs, host) -> None:
    # Saved directly into the store: the save-time check never saw it (or DNS changed since).
    job_id = http_job(conn, receiver.url(host=host))
    key = pending_push_run(conn, job_id, T0)
    resolve = {"metadata.test": ["169.254.169.254"], "localhost.test": ["127.0.0.1", "::1"]}
    clock = ManualClock(store_at=T0 + 3 * S)
    loop = make_loop(pg_dsn, epochs, clock, resolve=resolve, push_allow="")
    try:
        (outcome,) = loop.run_once()
        assert settle(conn, epochs, clock).dead == 1
    finally:
        loop.close()
    assert outcome.outcome == "failed" and outcome.error.startswith("ssrf refused: ")
    assert receiver.requests == []
    row = run_row(conn, key)
    assert (row["state"], row["attempt"]) == ("dead", 1)
    assert row["last_error"].startswith(f"ssrf refused: {host.strip('[]')} ")


def test_the_resolver_keeps_only_the_allowed_addresses_of_a_name(pg_dsn, conn, receiver, epochs) -> None:
    # A second endpoint on 127.0.0.2 (same port), outside push_allow 127.0.0.1/32, answered first by DNS.
    trap = Receiver("127.0.0.2", receiver.port)
    job_id = http_job(conn, receiver.url(host="mixed.test"))
    key = pending_push_run(conn, job_id, T0)
    resolve = {"mixed.test": ["127.0.0.2", "127.0.0.1"]}
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 3 * S), resolve=resolve)
    try:
        (outcome,) = loop.run_once()
    finally:
        loop.close()
        trap.close()
    assert outcome.outcome == "succeeded"
    assert trap.requests == []
    assert len(receiver.requests) == 1 and run_row(conn, key)["state"] == "succeeded"


def test_a_cookie_one_tenants_endpoint_sets_is_never_sent_to_another(pg_dsn, conn, receiver, epochs) -> None:
    # Two tenants pushing to one host name (a shared webhook service): the first answer sets a
    # cookie. One client session serves every tenant, so a cookie jar would hand acme's cookie
    # to globex's request (and to every later one of acme's): a push carries only its own headers.
    url = receiver.url(host="hooks.test")
    acme = http_job(conn, url, tenant="acme")
    globex = http_job(conn, url, tenant="globex")
    pending_push_run(conn, acme, T0)
    pending_push_run(conn, globex, T0 + S)  # claimed, and so sent (one turn per host), after acme's
    receiver.script = [(200, {"Set-Cookie": "session=acme-secret; Path=/"}, 0.0)]
    resolve = {"hooks.test": ["127.0.0.1"]}
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S), resolve=resolve, push_per_host=1)
    try:
        assert [o.outcome for o in loop.run_once()] == ["succeeded", "succeeded"]
    finally:
        loop.close()
    assert [r["headers"]["scheduler-job-id"] for r in receiver.requests] == [str(acme), str(globex)]
    assert [r["headers"].get("cookie") for r in receiver.requests] == [None, None]


def test_a_rotation_signs_with_both_secrets_until_the_grace_ends(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url())
    first = pending_push_run(conn, job_id, T0)
    second = pending_push_run(conn, job_id, T0 + 100 * S)
    third = pending_push_run(conn, job_id, T0 + 200 * S)
    old_id, old, _, _ = tenant_secrets.rotate(conn, "acme", 0, now=T0 - 100 * S)
    new_id, new, created, limited = tenant_secrets.rotate(conn, "acme", 60, now=T0 + 50 * S)
    assert (old_id, new_id, created, limited) == (1, 2, T0 + 50 * S, 1)
    assert old.startswith("whsec_") and new.startswith("whsec_") and old != new
    listed = tenant_secrets.list_secrets(conn, "acme", now=T0 + 50 * S)
    assert listed == [
        {"secret_id": 2, "created_at": T0 + 50 * S, "expires_at": None, "valid": True},
        {"secret_id": 1, "created_at": T0 - 100 * S, "expires_at": T0 + 110 * S, "valid": True},
    ]
    clock = ManualClock(store_at=T0 + 103 * S)  # first and second due; the old secret still valid
    loop = make_loop(pg_dsn, epochs, clock)
    try:
        assert [o.outcome for o in loop.run_once()] == ["succeeded", "succeeded"]
        clock.advance(100)  # third due; the grace ended at T0 + 110 s
        assert [o.run.key for o in loop.run_once()] == [third]
    finally:
        loop.close()
    # The first two were sent at once (in either order), the third alone.
    expected = {first.run_id: [new, old], second.run_id: [new, old], third.run_id: [new]}
    assert sorted(r["headers"]["idempotency-key"] for r in receiver.requests) == sorted(expected)
    assert receiver.requests[2]["headers"]["idempotency-key"] == third.run_id
    for request in receiver.requests:
        secrets = expected[request["headers"]["idempotency-key"]]
        header = request["headers"]["scheduler-signature"]
        t, found = signing.parse(header)
        assert found == [signing.signature(s, t, request["body"]) for s in secrets]  # newest first
        for secret in (old, new):
            if secret in secrets:
                assert signing.verify(header, request["body"], [secret], now=t) == t
            else:
                with pytest.raises(signing.SignatureError):
                    signing.verify(header, request["body"], [secret], now=t)
    assert [r["valid"] for r in tenant_secrets.list_secrets(conn, "acme", now=T0 + 110 * S)] == [True, False]


def test_a_tenant_without_a_secret_gets_one_at_its_first_push(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url(), tenant="newco")
    pending_push_run(conn, job_id, T0)
    assert tenant_secrets.list_secrets(conn, "newco") == []
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 3 * S))
    try:
        loop.run_once()
    finally:
        loop.close()
    (listed,) = tenant_secrets.list_secrets(conn, "newco", now=T0 + 3 * S)
    assert listed == {"secret_id": 1, "created_at": T0 + 3 * S, "expires_at": None, "valid": True}
    assert receiver.requests[0]["headers"]["scheduler-signature"].count("v1=") == 1


def test_rotation_input_is_checked_and_nothing_is_written(conn) -> None:
    jobs.add_tenant(conn, "acme", 1, None)
    with pytest.raises(NotFoundError, match="tenant: no tenant"):
        tenant_secrets.rotate(conn, "nobody", 10)
    with pytest.raises(ValidationError, match="grace: must be from 0 to 30d"):
        tenant_secrets.rotate(conn, "acme", 31 * 86_400)
    with pytest.raises(ValidationError, match="grace"):
        tenant_secrets.rotate(conn, "acme", -1)
    assert conn.execute("SELECT count(*) AS n FROM tenant_secrets").fetchone()["n"] == 0


def test_attempts_to_one_host_are_bounded_by_push_per_host(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url())
    keys = [pending_push_run(conn, job_id, T0 + i * S) for i in range(6)]
    receiver.script = [(200, {}, 0.4)] * 6
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S), push_per_host=2)
    try:
        assert [o.outcome for o in loop.run_once()] == ["succeeded"] * 6
    finally:
        loop.close()
    assert receiver.peak == 2
    assert len({r["peer"] for r in receiver.requests}) == 2  # two keep-alive connections, each used 3 times
    assert [run_row(conn, k)["state"] for k in keys] == ["succeeded"] * 6


def test_the_claim_never_takes_more_than_push_concurrency(pg_dsn, conn, receiver, epochs) -> None:
    job_id = http_job(conn, receiver.url())
    keys = [pending_push_run(conn, job_id, T0 + i * S) for i in range(5)]
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S), push_concurrency=3)
    try:
        assert len(loop.run_once()) == 3
        assert len(loop.run_once()) == 2
    finally:
        loop.close()
    assert [run_row(conn, k)["state"] for k in keys] == ["succeeded"] * 5


def cli(args: list[str], dsn: str):
    """Invoke the CLI in process with ``dsn``; no SCHEDULER_* variable leaks in from the environment."""
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    return CliRunner().invoke(main_cli, args, env={**env, "SCHEDULER_DSN": dsn}, catch_exceptions=False)


def test_secret_rotate_prints_the_secret_once_to_stdout_and_list_never_shows_it(pg_dsn, conn, caplog) -> None:
    jobs.add_tenant(conn, "acme", 1, None)
    caplog.set_level(logging.DEBUG)
    first = cli(["tenants", "secret", "rotate", "acme"], pg_dsn)
    second = cli(["tenants", "secret", "rotate", "acme", "--grace", "1h", "--json"], pg_dsn)
    listed = cli(["tenants", "secret", "list", "acme", "--json"], pg_dsn)
    table = cli(["tenants", "secret", "list", "acme"], pg_dsn)
    assert (first.exit_code, second.exit_code, listed.exit_code, table.exit_code) == (0, 0, 0, 0)
    (old,) = first.stdout.splitlines()
    new = json.loads(second.stdout)["secret"]
    assert old.startswith("whsec_") and len(old) == len("whsec_") + 43 and new != old
    assert "not shown again" in first.stderr
    rows = json.loads(listed.stdout)
    assert [(r["secret_id"], r["valid"]) for r in rows] == [(2, True), (1, True)]
    assert rows[0]["expires_at"] is None and rows[1]["expires_at"] is not None
    assert set(rows[0]) == {"secret_id", "created_at", "expires_at", "valid"}
    stored = {r["secret"] for r in conn.execute("SELECT secret FROM tenant_secrets").fetchall()}
    assert stored == {old, new}
    for text in (listed.stdout, table.stdout, table.stderr, caplog.text, second.stderr):
        assert old not in text and new not in text


def test_secret_rotate_with_grace_0_says_the_previous_secrets_end_now(pg_dsn, conn) -> None:
    jobs.add_tenant(conn, "acme", 1, None)
    first = cli(["tenants", "secret", "rotate", "acme", "--grace", "0"], pg_dsn)
    second = cli(["tenants", "secret", "rotate", "acme", "--grace", "0s"], pg_dsn)
    timed = cli(["tenants", "secret", "rotate", "acme", "--grace", "90m"], pg_dsn)
    assert (first.exit_code, second.exit_code, timed.exit_code) == (0, 0, 0)
    assert second.stderr == (
        "secret 2 of tenant acme created; previous secrets stop being valid now. Store it now: it is not shown again.\n"
    )
    assert timed.stderr == (
        "secret 3 of tenant acme created; previous secrets valid for 90m more. Store it now: it is not shown again.\n"
    )
    valid = conn.execute("SELECT secret_id FROM tenant_secrets WHERE expires_at IS NULL OR expires_at > now()")
    assert [r["secret_id"] for r in valid.fetchall()] == [2, 3]


GRACE_RULE = "must be a duration >= 0 such as 24h, 30m, 0 or seconds, at most 30d"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tenants", "secret", "rotate", "acme", "--grace", "-1s"], f"error: grace: {GRACE_RULE} (got '-1s')\n"),
        (["tenants", "secret", "rotate", "acme", "--grace", "-1"], f"error: grace: {GRACE_RULE} (got '-1')\n"),
        (
            ["tenants", "secret", "rotate", "acme", "--grace", "31d"],
            "error: grace: must be from 0 to 30d (got '31d')\n",
        ),
        (["tenants", "secret", "rotate", "acme", "--grace", "soon"], "error: grace: must be a duration"),
        (["tenants", "secret", "rotate", "nobody"], "error: tenant: no tenant 'nobody'"),
        (["tenants", "secret", "list", "nobody"], "error: tenant: no tenant 'nobody'"),
    ],
)
def test_secret_commands_refuse_bad_input_with_one_line(pg_dsn, conn, args, message) -> None:
    jobs.add_tenant(conn, "acme", 1, None)
    result = cli(args, pg_dsn)
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1
    assert conn.execute("SELECT count(*) AS n FROM tenant_secrets").fetchone()["n"] == 0


def test_a_node_pushes_the_runs_it_fires(pg_dsn, conn, receiver) -> None:
    added = cli(
        ["jobs", "add", "--tenant", "acme", "--interval", "3600", "--url", receiver.url(), "--push-allow",
         "127.0.0.1/32", "--payload", '{"hello": "world"}', "--header", "X-Token: abc"],
        pg_dsn,
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    job_id = uuid.UUID(added.stdout.strip())
    conn.execute(
        "UPDATE jobs SET next_nominal_at = anchor_at - interval '1 hour', next_due_at = anchor_at - interval '1 hour'"
        " WHERE job_id = %s",
        (job_id,),
    )
    node = Node(Settings(dsn=pg_dsn, node_id="n1", push_allow="127.0.0.1/32"))
    node.start()
    try:
        wait_for(
            "both runs pushed and acked",
            lambda: conn.execute(
                "SELECT count(*) AS n FROM runs WHERE job_id = %s AND state = 'succeeded'", (job_id,)
            ).fetchone()["n"],
            lambda n: n == 2,
            timeout_s=30,
        )
    finally:
        node.stop()
        node.join(30)
    keys = sorted(
        RunKey(r["partition_id"], r["job_id"], r["nominal_time"]).run_id
        for r in conn.execute("SELECT * FROM runs WHERE job_id = %s", (job_id,)).fetchall()
    )
    assert sorted(r["headers"]["idempotency-key"] for r in receiver.requests) == keys
    assert {r["body"] for r in receiver.requests} == {b'{"hello":"world"}'}
    assert {r["headers"]["x-token"] for r in receiver.requests} == {"abc"}
    # The tenant had no secret: its first push created one, which signs every request.
    (secret,) = [r["secret"] for r in conn.execute("SELECT secret FROM tenant_secrets WHERE tenant = 'acme'")]
    for request in receiver.requests:
        signing.verify(request["headers"]["scheduler-signature"], request["body"], [secret])
    assert node.metrics.value("scheduler_push_attempts_total", {"outcome": "succeeded"}) == 2


def test_attempts_waiting_for_their_host_keep_their_lease_and_a_canceled_one_is_not_sent(
    pg_dsn, conn, receiver, epochs, monkeypatch
) -> None:
    sent = record_named_queries(monkeypatch)
    job_id = http_job(conn, receiver.url(), timeout_s=4)
    keys = [pending_push_run(conn, job_id, T0 + i * S) for i in range(4)]
    receiver.delay_s = 2.0  # one at a time (push_per_host 1): the 3rd and 4th wait 4 s and more
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S), push_per_host=1)

    def cancel_the_third() -> None:
        wait_for("the first request", lambda: receiver.requests)
        conn.execute(
            "UPDATE runs SET state = 'canceled' WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
            (keys[2].partition_id, keys[2].job_id, keys[2].nominal_time),
        )

    canceler = threading.Thread(target=cancel_the_third)
    canceler.start()
    try:
        outcomes = loop.run_once()
    finally:
        loop.close()
        canceler.join()
    assert [o.run.key for o in outcomes] == [keys[0], keys[1], keys[3]]
    assert [r["headers"]["idempotency-key"] for r in receiver.requests] == [
        keys[0].run_id,
        keys[1].run_id,
        keys[3].run_id,
    ]
    # An attempt waits for its host with less than its deadline + 2 s of lease left only past 3 s:
    # the first never waited; the third and the fourth did, and were asked about.
    beaten = {run_id for name, params in sent if name == "heartbeat_runs" for run_id in _run_ids(params)}
    assert {keys[2].run_id, keys[3].run_id} <= beaten and keys[0].run_id not in beaten
    assert [run_row(conn, k)["state"] for k in keys] == ["succeeded", "succeeded", "canceled", "succeeded"]


def _run_ids(params: dict) -> list[str]:
    return [RunKey(p, j, n).run_id for p, j, n in zip(params["pids"], params["jids"], params["nominals"], strict=True)]


def stop_at_first_request(loop: PushLoop, receiver: Receiver, join_s: float) -> None:
    """Run ``loop`` on a thread until the receiver has a request, then stop it;
    it must end within ``join_s`` seconds. Closes the loop."""
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    try:
        wait_for("the first request", lambda: receiver.requests)
        stop.set()
        thread.join(join_s)
        assert not thread.is_alive()
    finally:
        stop.set()
        thread.join(15)
        loop.close()


def test_at_stop_the_attempt_in_flight_finishes_and_the_waiting_one_is_given_back(
    pg_dsn, conn, receiver, epochs
) -> None:
    job_id = http_job(conn, receiver.url(), timeout_s=4)
    first, second = (pending_push_run(conn, job_id, T0 + i * S) for i in range(2))
    receiver.delay_s = 1.5
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S), push_per_host=1)
    stop_at_first_request(loop, receiver, join_s=15)
    assert [r["headers"]["idempotency-key"] for r in receiver.requests] == [first.run_id]
    assert run_row(conn, first)["state"] == "succeeded"
    row = run_row(conn, second)
    assert (row["state"], row["retryable"], row["last_error"], row["attempt"]) == (
        "failed",
        True,
        "node stopping before the attempt was sent",
        1,
    )


def test_at_stop_an_attempt_past_half_the_stop_timeout_is_abandoned_as_retryable(
    pg_dsn, conn, receiver, epochs
) -> None:
    job_id = http_job(conn, receiver.url(), timeout_s=20)
    key = pending_push_run(conn, job_id, T0)
    receiver.delay_s = 10.0
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S), stop_timeout_s=2.0)
    stop_at_first_request(loop, receiver, join_s=8)  # half the stop timeout (1 s), then the outcome recorded
    row = run_row(conn, key)
    assert (row["state"], row["retryable"], row["last_error"]) == ("failed", True, "node stopping during the attempt")


def test_the_claim_fences_only_the_partitions_with_runs_due(pg_dsn, conn, receiver, epochs, monkeypatch) -> None:
    sent = record_named_queries(monkeypatch)
    loop = make_loop(pg_dsn, epochs, ManualClock(store_at=T0 + 30 * S))
    try:
        assert loop.run_once() == []  # idle: one index read, no partitions row locked
        assert [name for name, _ in sent] == ["due_push_partitions"]
        keys = [pending_push_run(conn, http_job(conn, receiver.url(), name=f"j{i}"), T0) for i in range(2)]
        keys.append(pending_push_run(conn, http_job(conn, receiver.url(), name="later"), T0 + 60 * S))  # not due
        sent.clear()
        assert len(loop.run_once()) == 2
    finally:
        loop.close()
    (claim,) = [params for name, params in sent if name == "claim_push"]
    assert claim["pids"] == sorted({k.partition_id for k in keys[:2]})
    assert run_row(conn, keys[2])["state"] == "pending"


def test_the_first_secret_rotate_says_nothing_about_previous_secrets(pg_dsn, conn) -> None:
    jobs.add_tenant(conn, "acme", 1, None)
    first = cli(["tenants", "secret", "rotate", "acme"], pg_dsn)
    second = cli(["tenants", "secret", "rotate", "acme"], pg_dsn)
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert first.stderr == "secret 1 of tenant acme created. Store it now: it is not shown again.\n"
    assert second.stderr == (
        "secret 2 of tenant acme created; previous secrets valid for 24h more. Store it now: it is not shown again.\n"
    )
