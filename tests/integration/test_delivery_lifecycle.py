"""The run lifecycle against a real store (scheduler/delivery/lifecycle.py, docs/delivery.md).

Runs are fired by the real firing path where the firing matters (a run is
born with its delivery state), else written as pending rows of a real job.
Every step passes a pinned store time (``now``), so leases, backoffs and
expiries have exact values.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from helpers import OneNode, pending_run, run_row

from scheduler import jobs, store
from scheduler.clock import ManualClock
from scheduler.delivery import lifecycle
from scheduler.delivery import loop as loop_module
from scheduler.delivery.lifecycle import Nack, RunKey
from scheduler.delivery.loop import SettleLoop
from scheduler.delivery.targets import DeliverySpec
from scheduler.errors import StoreError, ValidationError
from scheduler.metrics import Metrics
from scheduler.spec import JobSpec
from scheduler.store import retry as store_retry

T0 = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
S = timedelta(seconds=1)


@pytest.fixture
def node(pg_dsn: str):
    n = OneNode(pg_dsn)
    yield n
    n.close()


def add_job(conn: psycopg.Connection, tenant: str = "acme", name: str | None = None) -> uuid.UUID:
    return jobs.add_job(conn, JobSpec.build(tenant=tenant, name=name, interval_s=3600)).job_id


def test_a_fired_run_is_born_pending_in_its_jobs_queue(conn, node) -> None:
    job_id = add_job(conn)
    conn.execute(
        "UPDATE jobs SET next_nominal_at = anchor_at - interval '1 hour', next_due_at = anchor_at - interval '1 hour'"
        " WHERE job_id = %s",
        (job_id,),
    )
    node.firer.tick()
    runs = conn.execute("SELECT * FROM runs WHERE job_id = %s ORDER BY nominal_time", (job_id,)).fetchall()
    assert len(runs) == 2  # the slots an hour before the anchor and at it
    for run in runs:
        assert (run["state"], run["queue"], run["origin"], run["attempt"]) == ("pending", "default", "schedule", 0)
        assert run["available_at"] == run["fired_at"]
        assert run["lease_token"] is None and run["leased_until"] is None


def test_next_due_is_the_seconds_until_the_next_timer_of_the_tenants_queue(conn, monkeypatch) -> None:
    """acme: due at T0 + 3 s and T0 + 10 s; beta: T0 + 1 s; gamma: T0 + 0.5 s but in queue
    reports; delta: T0 + 0.2 s, pushed (no queue); epsilon: overdue by 5 s (past the 2 s a
    worker waits for); zeta: overdue by 1 s; eta: two timers of reports before one of default."""

    def due(tenant: str, at: datetime, queue: str | None = "default") -> None:
        conn.execute(
            "UPDATE jobs SET next_nominal_at = %s, next_due_at = %s, queue = %s WHERE job_id = %s",
            (at, at, queue, add_job(conn, tenant)),
        )

    due("acme", T0 + 10 * S)
    due("acme", T0 + 3 * S)
    due("beta", T0 + S)
    due("gamma", T0 + S / 2, "reports")
    due("delta", T0 + S / 5, None)
    due("epsilon", T0 - 5 * S)
    due("zeta", T0 - S)
    due("eta", T0 + S, "reports")
    due("eta", T0 + 2 * S, "reports")
    due("eta", T0 + 3 * S)
    jobs.add_tenant(conn, "idle")

    def next_due(*tenants: str, queue: str = "default") -> float | None:
        return lifecycle.next_due(conn, tenants=list(tenants), queue=queue, now=T0)

    assert next_due("acme") == 3.0
    assert next_due("acme", "beta") == 1.0
    assert (next_due("gamma"), next_due("gamma", queue="reports")) == (None, 0.5)
    assert next_due("delta") is None
    assert (next_due("epsilon"), next_due("zeta"), next_due("epsilon", "acme")) == (None, -1.0, 3.0)
    assert (next_due("idle"), next_due("nobody"), next_due()) == (None, None, None)
    assert next_due("eta") == 3.0
    monkeypatch.setattr(lifecycle, "NEXT_DUE_SCAN", 2)  # its first two due timers are of reports
    assert next_due("eta") is None
    with pytest.raises(ValidationError, match="tenants"):
        next_due(*[f"t{i}" for i in range(lifecycle.MAX_TENANTS_PROBED + 1)])


def test_next_due_gives_up_past_its_budget_while_a_tenant_imports_timers(conn, pg_dsn, monkeypatch) -> None:
    """Timers inserted by a transaction not committed yet sit in the due index ahead of the
    tenant's committed ones, and the probe's walk visits each in the heap to skip it: in the
    herd bench, 300,000 timers being imported made every idle worker's probe take 0.2-0.4 s,
    once a second. Past ``NEXT_DUE_BUDGET_S`` the probe is canceled (QueryCanceled, nothing
    else changes on the connection); once the import commits it answers with its timers."""
    job_id = add_job(conn, "acme")
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %s, next_due_at = %s WHERE job_id = %s", (T0 + 30 * S,) * 2 + (job_id,)
    )
    columns = [
        row["column_name"]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' ORDER BY ordinal_position"
        )
    ]
    copied = {
        "job_id": "gen_random_uuid()",
        "next_due_at": "%(t0)s + g * interval '1 millisecond'",
        "next_nominal_at": "%(t0)s + g * interval '1 millisecond'",
    }
    importer = store.connect(pg_dsn, application_name="importer")
    try:
        importer.execute("BEGIN")
        importer.execute(
            f"INSERT INTO jobs ({', '.join(columns)})"
            f" SELECT {', '.join(copied.get(c, c) for c in columns)}"
            " FROM jobs, generate_series(1000, 20999) AS g WHERE job_id = %(job)s",
            {"t0": T0, "job": job_id},
        )
        monkeypatch.setattr(lifecycle, "NEXT_DUE_BUDGET_S", 0.001)
        with pytest.raises(psycopg.errors.QueryCanceled):
            lifecycle.next_due(conn, tenants=["acme"], queue="default", now=T0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "0"
        monkeypatch.undo()
        importer.execute("COMMIT")
    finally:
        importer.close()
    assert lifecycle.next_due(conn, tenants=["acme"], queue="default", now=T0) == 1.0


def test_tenants_with_runs_names_those_with_a_pending_run_available_in_the_queue(conn) -> None:
    """acme: available; beta: only leased; gamma: not available yet; delta: another queue;
    epsilon: nothing; zeta: pushed (no queue)."""
    acme, beta, gamma = add_job(conn, "acme"), add_job(conn, "beta"), add_job(conn, "gamma")
    delta = add_job(conn, "delta")
    zeta = add_job(conn, "zeta")
    jobs.add_tenant(conn, "epsilon")
    pending_run(conn, acme, T0)
    pending_run(conn, beta, T0)
    lifecycle.claim(conn, tenant="beta", queue="default", worker="w", limit=10, now=T0)
    pending_run(conn, gamma, T0 + 10 * S)
    pending_run(conn, delta, T0, queue="reports")
    pending_run(conn, zeta, T0, queue=None)
    everyone = ["acme", "beta", "gamma", "delta", "epsilon", "zeta"]
    assert lifecycle.tenants_with_runs(conn, tenants=everyone, queue="default", now=T0 + S) == {"acme"}
    assert lifecycle.tenants_with_runs(conn, tenants=everyone, queue="default", now=T0 + 10 * S) == {"acme", "gamma"}
    assert lifecycle.tenants_with_runs(conn, tenants=everyone, queue="reports", now=T0) == {"delta"}
    assert lifecycle.tenants_with_runs(conn, tenants=["beta"], queue="default", now=T0) == set()
    with pytest.raises(ValidationError, match="^tenants: at most 1000 per call"):
        lifecycle.tenants_with_runs(conn, tenants=[f"t{i}" for i in range(1001)], queue="default")


def test_claim_leases_each_run_once_and_ack_needs_its_token(conn) -> None:
    job_id = add_job(conn)
    first = pending_run(conn, job_id, T0)
    second = pending_run(conn, job_id, T0 + S)
    pending_run(conn, job_id, T0 + 10 * S)  # not available yet at T0 + 1 s
    claimed = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=10, lease_s=30, now=T0 + S)
    assert [c.key for c in claimed] == [first, second]
    assert [c.attempt for c in claimed] == [1, 1]
    assert all(c.leased_until == T0 + 31 * S for c in claimed)
    assert lifecycle.claim(conn, tenant="acme", queue="default", worker="w2", limit=10, now=T0 + S) == []
    assert lifecycle.claim(conn, tenant="other", queue="default", worker="w2", limit=10, now=T0 + 20 * S) == []
    stranger = uuid.uuid4()
    answers = lifecycle.ack(conn, [(first.run_id, claimed[0].token), (second.run_id, stranger)], now=T0 + 2 * S)
    assert answers == {first.run_id: "succeeded", second.run_id: "lost"}
    row = run_row(conn, first)
    assert (row["state"], row["finished_at"], row["worker"]) == ("succeeded", T0 + 2 * S, "w1")
    assert run_row(conn, second)["state"] == "leased"
    # An ack re-sent with the token that succeeded answers the same, and changes nothing.
    assert lifecycle.ack(conn, [(first.run_id, claimed[0].token)], now=T0 + 3 * S) == {first.run_id: "succeeded"}
    assert run_row(conn, first)["finished_at"] == T0 + 2 * S


def test_a_stale_token_is_refused_after_the_lease_expired_and_another_worker_claimed(conn, node) -> None:
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    (first,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, lease_s=5, now=T0)
    epochs = {key.partition_id: node.epoch(key.partition_id)}
    assert lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 4 * S).runs == ()  # lease still valid
    result = lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 5 * S)
    assert (result.expired, result.retried, result.dead) == (1, 1, 0)
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["last_error"]) == ("pending", 1, "lease expired")
    # Backoff after attempt 1: uniform in [0, 1 s].
    assert T0 + 5 * S <= row["available_at"] <= T0 + 6 * S
    (second,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w2", limit=1, now=T0 + 7 * S)
    assert second.attempt == 2 and second.token != first.token
    assert lifecycle.heartbeat(conn, [(key.run_id, first.token)], now=T0 + 7 * S) == {key.run_id: "lost"}
    assert lifecycle.ack(conn, [(key.run_id, first.token)], now=T0 + 8 * S) == {key.run_id: "lost"}
    assert lifecycle.nack(conn, [Nack(key.run_id, first.token, "late")], now=T0 + 8 * S) == {key.run_id: "lost"}
    assert run_row(conn, key)["state"] == "leased"
    assert lifecycle.ack(conn, [(key.run_id, second.token)], now=T0 + 9 * S) == {key.run_id: "succeeded"}
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["worker"], row["first_claimed_at"]) == ("succeeded", 2, "w2", T0)


def test_heartbeat_extends_the_lease_so_settle_leaves_it(conn, node) -> None:
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, lease_s=5, now=T0)
    assert lifecycle.heartbeat(conn, [(key, claimed.token)], lease_s=5, now=T0 + 4 * S) == {key.run_id: "leased"}
    assert run_row(conn, key)["leased_until"] == T0 + 9 * S
    epochs = {key.partition_id: node.epoch(key.partition_id)}
    assert lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 8 * S).runs == ()
    conn.execute(
        "UPDATE runs SET state = 'canceled' WHERE job_id = %s AND nominal_time = %s", (job_id, key.nominal_time)
    )
    assert lifecycle.heartbeat(conn, [(key, claimed.token)], now=T0 + 8 * S) == {key.run_id: "canceled"}
    assert lifecycle.ack(conn, [(key, claimed.token)], now=T0 + 8 * S) == {key.run_id: "canceled"}
    assert run_row(conn, key)["state"] == "canceled"


def test_a_nack_error_the_store_cannot_keep_as_is_is_kept_with_replacement_characters(conn) -> None:
    """A handler's exception message may carry NUL or an unpaired surrogate (bytes decoded
    with surrogateescape, a fuzzed API body): the nack is recorded, those characters
    replaced by U+FFFD, never refused by the store (which failed the whole batch)."""
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    other = pending_run(conn, job_id, T0 + S)
    first, second = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=2, now=T0 + S)
    answer = lifecycle.nack(
        conn,
        [Nack(key.run_id, first.token, "bad\x00byte \udce9 end"), Nack(other.run_id, second.token, "plain")],
        now=T0 + 2 * S,
    )
    assert answer == {key.run_id: "failed", other.run_id: "failed"}
    assert run_row(conn, key)["last_error"] == "bad\ufffdbyte \ufffd end"
    assert run_row(conn, other)["last_error"] == "plain"


def test_nack_then_settle_retries_with_backoff_until_max_attempts_then_dead(conn, node) -> None:
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    epochs = {key.partition_id: node.epoch(key.partition_id)}
    now = T0
    for attempt in range(1, lifecycle.DEFAULT_MAX_ATTEMPTS + 1):
        (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, now=now)
        assert claimed.attempt == attempt
        answer = lifecycle.nack(conn, [Nack(key.run_id, claimed.token, f"boom {attempt}")], now=now + S)
        assert answer == {key.run_id: "failed"}
        assert run_row(conn, key)["state"] == "failed"
        result = lifecycle.settle(conn, node_id="t1", epochs=epochs, now=now + S)
        row = run_row(conn, key)
        assert row["last_error"] == f"boom {attempt}"
        if attempt < lifecycle.DEFAULT_MAX_ATTEMPTS:
            assert (result.retried, result.dead, row["state"]) == (1, 0, "pending")
            bound = min(lifecycle.DEFAULT_BACKOFF_CAP_S, lifecycle.DEFAULT_BACKOFF_BASE_S * 2 ** (attempt - 1))
            assert now + S <= row["available_at"] <= now + S + timedelta(seconds=bound)
            now = row["available_at"]
        else:
            assert (result.retried, result.dead, row["state"]) == (0, 1, "dead")
            assert row["finished_at"] == now + S
            assert [d.why for d in result.dead_runs] == ["max attempts"]
    assert lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, now=now + 3600 * S) == []


def test_a_not_retryable_failure_is_dead_at_once_and_retry_after_is_honoured(conn, node) -> None:
    job_id = add_job(conn)
    fatal = pending_run(conn, job_id, T0)
    later = pending_run(conn, job_id, T0 + S)
    epochs = {fatal.partition_id: node.epoch(fatal.partition_id)}
    a, b = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=2, now=T0 + S)
    lifecycle.nack(
        conn,
        [Nack(fatal.run_id, a.token, "404", retryable=False), Nack(later.run_id, b.token, "429", retry_after_s=120)],
        now=T0 + 2 * S,
    )
    result = lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 2 * S)
    assert (run_row(conn, fatal)["state"], run_row(conn, fatal)["attempt"], run_row(conn, fatal)["last_error"]) == (
        "dead", 1, "404",
    )  # fmt: skip
    assert [(d.key, d.why) for d in result.dead_runs] == [(fatal, "not retryable")]
    row = run_row(conn, later)
    assert row["state"] == "pending"
    assert row["available_at"] == T0 + 122 * S  # the wish (Retry-After) outweighs a backoff of at most 1 s


def with_max_age(conn: psycopg.Connection, key: RunKey, max_age_s: int) -> None:
    """Give ``key``'s job 100 attempts, a 1 s backoff and ``max_age_s``."""
    conn.execute(
        "INSERT INTO job_delivery (partition_id, job_id, max_attempts, backoff_base_s, backoff_cap_s, max_age_s)"
        " VALUES (%s, %s, 100, 1, 1, %s)",
        (key.partition_id, key.job_id, max_age_s),
    )


def test_max_age_ends_retries_counted_from_the_first_claim(conn, node) -> None:
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    with_max_age(conn, key, 60)
    epochs = {key.partition_id: node.epoch(key.partition_id)}
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, now=T0)
    lifecycle.nack(conn, [Nack(key.run_id, claimed.token, "x")], now=T0 + 30 * S)
    assert lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 30 * S).retried == 1
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, now=T0 + 40 * S)
    lifecycle.nack(conn, [Nack(key.run_id, claimed.token, "x")], now=T0 + 60 * S)
    result = lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 60 * S)
    assert [(d.key, d.why) for d in result.dead_runs] == [(key, "max age")]
    row = run_row(conn, key)
    assert (row["state"], row["attempt"]) == ("dead", 2)
    # The attempt's own error, and what ended the run: neither the attempts (2 of 100) nor the error say it.
    assert row["last_error"] == "x (dead: retrying would pass max_age_s = 60 s)"


def test_max_age_says_why_also_for_a_failure_without_text(conn, node) -> None:
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    with_max_age(conn, key, 5)
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, now=T0)
    lifecycle.nack(conn, [Nack(key.run_id, claimed.token, None)], now=T0 + 10 * S)
    epochs = {key.partition_id: node.epoch(key.partition_id)}
    assert lifecycle.settle(conn, node_id="t1", epochs=epochs, now=T0 + 10 * S).dead == 1
    assert run_row(conn, key)["last_error"] == "(dead: retrying would pass max_age_s = 5 s)"


def test_settle_and_claim_push_are_fenced_by_the_owners_epoch(conn, node) -> None:
    job_id = add_job(conn)
    expired = pending_run(conn, job_id, T0)
    pushed = pending_run(conn, job_id, T0 + S, queue=None)
    lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, lease_s=1, now=T0)
    stale = {expired.partition_id: node.epoch(expired.partition_id) - 1}
    assert lifecycle.settle(conn, node_id="t1", epochs=stale, now=T0 + 60 * S).runs == ()
    assert lifecycle.claim_push(conn, node_id="t1", epochs=stale, limit=10, now=T0 + 60 * S) == []
    assert (
        lifecycle.claim_push(
            conn,
            node_id="t2",
            epochs={expired.partition_id: stale[expired.partition_id] + 1},
            limit=10,
            now=T0 + 60 * S,
        )
        == []
    )
    assert run_row(conn, expired)["state"] == "leased"
    assert run_row(conn, pushed)["state"] == "pending"
    good = {expired.partition_id: node.epoch(expired.partition_id)}
    (push,) = lifecycle.claim_push(conn, node_id="t1", epochs=good, limit=10, now=T0 + 60 * S)
    assert (push.key, push.attempt, push.queue) == (pushed, 1, None)
    assert push.leased_until == T0 + 60 * S + timedelta(
        seconds=lifecycle.DEFAULT_PUSH_TIMEOUT_S + lifecycle.PUSH_LEASE_MARGIN_S
    )
    assert lifecycle.settle(conn, node_id="t1", epochs=good, now=T0 + 60 * S).expired == 1


def test_the_claim_returns_the_jobs_name_and_payload(conn) -> None:
    job_id = add_job(conn, name="nightly")
    key = pending_run(conn, job_id, T0)
    conn.execute(
        "INSERT INTO job_delivery (partition_id, job_id, payload, max_attempts, backoff_base_s, backoff_cap_s)"
        " VALUES (%s, %s, %s, 3, 1, 60)",
        (key.partition_id, job_id, psycopg.types.json.Jsonb({"report": "daily", "n": [1, 2]})),
    )
    (claimed,) = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=5, now=T0)
    assert (claimed.job_name, claimed.payload, claimed.run_id) == (
        "nightly",
        {"report": "daily", "n": [1, 2]},
        key.run_id,
    )
    assert (claimed.tenant, claimed.queue, claimed.origin, claimed.scheduled_at) == ("acme", "default", "schedule", T0)


@pytest.mark.parametrize("queue", ["default", None], ids=["claim_runs", "claim_push"])
def test_a_claims_keys_are_keys_like_any_other_with_exact_run_ids(conn, node, queue) -> None:
    # A claim builds its RunKeys without RunKey.__init__ (lifecycle.frozen_of): equal, hashed and
    # shown as any other, and their run ids exact to the microsecond, before 1970 included.
    job_id = add_job(conn)
    nominals = [
        T0,
        T0 + timedelta(microseconds=1),
        datetime(2031, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC),
        datetime(1901, 6, 1, 0, 0, 0, 3, tzinfo=UTC),
    ]
    keys = [pending_run(conn, job_id, nominal, queue=queue, scheduled=T0) for nominal in nominals]
    if queue is None:
        epochs = {keys[0].partition_id: node.epoch(keys[0].partition_id)}  # one job: one partition
        claimed = lifecycle.claim_push(conn, node_id="t1", epochs=epochs, limit=10, now=T0)
    else:
        claimed = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=10, now=T0)
    got = {c.key: c.run_id for c in claimed}
    assert got == {RunKey(k.partition_id, k.job_id, k.nominal_time): k.run_id for k in keys}
    assert got[keys[3]] == f"{job_id}.-500000"
    assert got[keys[4]] == f"{job_id}.{-2164406400 * 1_000_000 + 3}"
    for c in claimed:  # keys made without RunKey.__init__ (lifecycle.frozen_of) are keys like any other
        fresh = RunKey(*dataclasses.astuple(c.key))
        assert (c.key, hash(c.key), repr(c.key)) == (fresh, hash(fresh), repr(fresh))
    assert len(claimed) == len(keys)


def test_run_ids_round_trip_and_malformed_ones_name_the_field() -> None:
    job_id = uuid.UUID("6c9f0f0e-8d3b-4f7e-9a43-1f0b0c1d2e3f")
    key = RunKey.of(job_id, datetime(2026, 1, 1, tzinfo=UTC))
    assert key.run_id == "6c9f0f0e-8d3b-4f7e-9a43-1f0b0c1d2e3f.1767225600000000"
    assert RunKey.parse(key.run_id) == key
    # A run before 1970 (a backfill may make one) has a negative time: its id parses back too.
    early = RunKey.of(job_id, datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC))
    assert early.run_id == f"{job_id}.-500000"
    assert RunKey.parse(early.run_id) == early
    from scheduler.api.runs import LeaseIn

    assert LeaseIn(id=early.run_id, lease_token=uuid.UUID(int=1)).id == early.run_id  # the API takes it too
    for bad in ("", "x.1", f"{job_id}", f"{job_id}.-", f"{job_id}.--5", f"{job_id}.+5", f"{job_id}.1e3",
                f"{job_id}.９", f"{job_id}." + "9" * 30, f"{job_id}.-" + "9" * 30):  # fmt: skip
        with pytest.raises(ValidationError, match=r"^run_id: must be <job id>\.<nominal time"):
            RunKey.parse(bad)
    # Other spellings of the same key are not its id: one run, one id (the idempotency key a
    # receiver sees, the name in logs and the API), so none of them is taken for it.
    upper = str(job_id).upper()
    for alias in (f"{job_id}.01767225600000000", f"{job_id}.-0", f"{upper}.1767225600000000",
                  f"{{{job_id}}}.1767225600000000", f"urn:uuid:{job_id}.1767225600000000",
                  f"{job_id.hex}.1767225600000000"):  # fmt: skip
        with pytest.raises(ValidationError, match=r"^run_id: must be <job id>\.<nominal time"):
            RunKey.parse(alias)
    assert RunKey.parse(f"{job_id}.0").run_id == f"{job_id}.0"


def test_batches_and_leases_out_of_bounds_are_refused(conn) -> None:
    for kwargs, field in (
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"lease_s": 0}, "lease_s"),
        ({"lease_s": 0.5}, "lease_s"),  # below MIN_LEASE_S: expires before a heartbeat could extend it
        ({"lease_s": True}, "lease_s"),
        ({"lease_s": float("nan")}, "lease_s"),
        ({"limit": True}, "limit"),
    ):
        args = {"tenant": "acme", "queue": "default", "worker": "w", "limit": 1, **kwargs}
        with pytest.raises(ValidationError, match=f"^{field}: "):
            lifecycle.claim(conn, **args)
    with pytest.raises(ValidationError, match="^token: "):
        lifecycle.ack(conn, [(RunKey.of(uuid.uuid4(), T0).run_id, "not-a-token")])


def test_the_nodes_settle_loop_redelivers_an_expired_lease_and_counts_it(conn, pg_dsn) -> None:
    job_id = add_job(conn)
    key = pending_run(conn, job_id, T0)
    lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=1, lease_s=5, now=T0)
    owner = OneNode(pg_dsn, clock=ManualClock(store_at=T0 + 6 * S))
    try:
        loop = SettleLoop(owner.settings, owner.table, owner.clock, owner.metrics)
        assert loop.run_once() == 1
        loop.close()
    finally:
        owner.close()
    row = run_row(conn, key)
    assert (row["state"], row["attempt"], row["last_error"]) == ("pending", 1, "lease expired")
    settled = {"to": "pending", "cause": "expired"}
    assert owner.metrics.value("scheduler_delivery_settled_total", settled) == 1


def settle_pass(pg_dsn: str, store_at: datetime) -> tuple[int, Metrics]:
    """One pass of the owner's settle loop (node ``t1``, store time pinned at ``store_at``):
    the runs it settled and the node's metrics."""
    owner = OneNode(pg_dsn, clock=ManualClock(store_at=store_at))
    try:
        loop = SettleLoop(owner.settings, owner.table, owner.clock, owner.metrics)
        settled = loop.run_once()
        loop.close()
    finally:
        owner.close()
    return settled, owner.metrics


def _events(caplog, *names: str) -> list[tuple[str, int, dict]]:
    return [(r.event, r.levelno, r.fields) for r in caplog.records if getattr(r, "event", None) in names]


def test_the_settle_loop_logs_each_run_it_sends_to_dead_and_not_the_ones_it_retries(conn, pg_dsn, caplog) -> None:
    """Runs of failing receivers (500, timeout, refused) went dead with nothing in the node's log:
    the owner's settle step logs one ``run_dead`` per run it marks dead (run, job, tenant,
    attempts, cause, why, last error; never the payload), nothing for a run it retries."""
    spec = JobSpec.build(
        tenant="acme", name="report", interval_s=3600,
        delivery=DeliverySpec.build(queue="default", max_attempts=2, payload='{"card": "4111-PAYLOAD"}'),
    )  # fmt: skip
    job_id = jobs.add_job(conn, spec).job_id
    last, fatal, retried, expired = (pending_run(conn, job_id, T0 + i * S) for i in range(4))
    conn.execute("UPDATE runs SET attempt = 1 WHERE job_id = %s AND nominal_time IN (%s, %s)", (job_id, T0, T0 + 3 * S))
    a, b, c, d = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=4, lease_s=5, now=T0 + 5 * S)
    assert [x.attempt for x in (a, b, c, d)] == [2, 1, 1, 2]
    lifecycle.nack(
        conn,
        [
            Nack(last.run_id, a.token, "HTTP 500 from the receiver\nsecond line"),
            Nack(fatal.run_id, b.token, "HTTP 404", retryable=False),
            Nack(retried.run_id, c.token, "timeout after 5s"),
        ],
        now=T0 + 6 * S,
    )
    caplog.set_level(logging.DEBUG, logger="scheduler")
    assert settle_pass(pg_dsn, T0 + 11 * S)[0] == 4  # d's lease (to T0 + 10 s) has expired
    assert run_row(conn, retried)["state"] == "pending"
    dead = sorted(_events(caplog, "run_dead"), key=lambda e: e[2]["run_id"])
    expected = [
        (last, 2, "failed", "max attempts", "HTTP 500 from the receiver\\nsecond line"),
        (fatal, 1, "failed", "not retryable", "HTTP 404"),
        (expired, 2, "expired", "max attempts", "lease expired"),
    ]
    assert dead == sorted(
        [
            (
                "run_dead",
                logging.WARNING,
                {
                    "node": "t1",
                    "run_id": key.run_id,
                    "job_id": str(job_id),
                    "tenant": "acme",
                    "attempts": attempts,
                    "cause": cause,
                    "why": why,
                    "error": error,
                },
            )
            for key, attempts, cause, why, error in expected
        ],
        key=lambda e: e[2]["run_id"],
    )
    assert "PAYLOAD" not in caplog.text
    assert _events(caplog, "runs_dead_unlogged") == []


def test_the_settle_loop_logs_at_most_its_quota_of_dead_runs_per_pass_and_counts_the_rest(
    conn, pg_dsn, caplog, monkeypatch
) -> None:
    """Thousands of runs going dead at once (a receiver down) are not thousands of lines a pass."""
    monkeypatch.setattr(loop_module, "DEAD_RUNS_LOGGED_PER_PASS", 2)
    job_id = add_job(conn)
    keys = [pending_run(conn, job_id, T0 + i * S) for i in range(5)]
    claimed = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=5, now=T0 + 5 * S)
    lifecycle.nack(conn, [Nack(c.key.run_id, c.token, "HTTP 410", retryable=False) for c in claimed], now=T0 + 6 * S)
    caplog.set_level(logging.INFO, logger="scheduler")
    settled, metrics = settle_pass(pg_dsn, T0 + 6 * S)
    assert settled == 5
    dead = _events(caplog, "run_dead")
    assert len(dead) == 2 and {e[2]["run_id"] for e in dead} < {k.run_id for k in keys}
    assert _events(caplog, "runs_dead_unlogged") == [
        ("runs_dead_unlogged", logging.WARNING, {"node": "t1", "count": 3, "logged": 2})
    ]
    assert metrics.value("scheduler_delivery_settled_total", {"to": "dead", "cause": "failed"}) == 5


def test_on_a_probe_session_each_claim_probe_and_batch_is_one_statement_with_no_transaction(pg_dsn) -> None:
    # A worker's lanes are probe sessions (store.make_probe_session): the join
    # settings are the session's, and each claim, probe, heartbeat, ack and
    # nack is sent alone in autocommit (one round trip), never in BEGIN … COMMIT.
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        store.make_probe_session(conn)
        assert store.is_probe_session(conn)
        settings = conn.execute(
            "SELECT current_setting('enable_hashjoin') AS h, current_setting('enable_mergejoin') AS m,"
            " current_setting('enable_seqscan') AS s"
        ).fetchone()
        assert settings == {"h": "off", "m": "off", "s": "off"}
        job_id = add_job(conn)
        keys = [pending_run(conn, job_id, T0 + i * S) for i in range(4)]

        def no_transaction() -> None:
            raise AssertionError("a probe session's statement was wrapped in a transaction")

        conn.transaction = no_transaction  # type: ignore[method-assign]
        assert lifecycle.tenants_with_runs(conn, tenants=["acme", "other"], queue="default", now=T0 + 9 * S) == {"acme"}
        claimed = lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=3, now=T0 + 9 * S)
        assert [c.key for c in claimed] == keys[:3]
        leases = [(c.key, c.token) for c in claimed]
        assert lifecycle.heartbeat(conn, leases[:1], lease_s=60, now=T0 + 10 * S) == {keys[0].run_id: "leased"}
        assert lifecycle.ack(conn, leases[:2], now=T0 + 11 * S) == {
            keys[0].run_id: "succeeded",
            keys[1].run_id: "succeeded",
        }
        fail = Nack(run_id=keys[2].run_id, token=claimed[2].token, retryable=True, error="boom")
        assert lifecycle.nack(conn, [fail], now=T0 + 11 * S) == {keys[2].run_id: "failed"}
        del conn.transaction
        states = [run_row(conn, k)["state"] for k in keys]
        assert states == ["succeeded", "succeeded", "failed", "pending"]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        conn.close()


def test_a_probe_session_retries_a_statement_the_store_asked_to_retry(pg_dsn, monkeypatch) -> None:
    conn = store.connect(pg_dsn, application_name="scheduler-test")
    try:
        store.make_probe_session(conn)
        monkeypatch.setattr(store_retry.time, "sleep", lambda s: None)
        calls = []

        def body(c: psycopg.Connection) -> int:
            calls.append(1)
            if len(calls) == 1:
                c.execute("SELECT 1")
                raise psycopg.errors.SerializationFailure("restart transaction")
            return c.execute("SELECT 7 AS n").fetchone()["n"]

        assert store.run_statement(conn, body) == 7
        assert len(calls) == 2

        def never(c: psycopg.Connection) -> None:
            raise psycopg.errors.SerializationFailure("restart transaction")

        with pytest.raises(StoreError, match="statement failed after"):
            store.run_statement(conn, never, max_attempts=3)
    finally:
        conn.close()


def test_only_an_autocommit_connection_can_be_a_probe_session(pg_dsn) -> None:
    conn = psycopg.connect(pg_dsn)
    try:
        with pytest.raises(ValueError, match="autocommit"):
            store.make_probe_session(conn)
        assert not store.is_probe_session(conn)
    finally:
        conn.close()
