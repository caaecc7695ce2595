"""Overlap policies, run now and backfill (docs/delivery.md; scheduler/delivery/manual.py).

The policy is enforced in the fenced firing statement (fire_runs here; the
herd path's fire_group in test_herd_firing.py), the release of a buffered
run and run-now requests by the partition owner, fenced by its epoch. Every
step pins the store clock, so runs and skips have exact values.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from click.testing import CliRunner
from helpers import OneNode, wait_for

from scheduler import jobs
from scheduler.audit import verify, verify_delivery
from scheduler.cli import cli as main_cli
from scheduler.clock import ManualClock
from scheduler.coordination import LeaseTable
from scheduler.delivery import lifecycle, manual, owner
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.loop import SettleLoop
from scheduler.errors import NotFoundError, ValidationError
from scheduler.firing import Firer
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.spec import JobSpec

T0 = datetime(2025, 3, 4, 5, 6, 0, tzinfo=UTC)
"""The first slot: in the past, so verify may audit it (the store clock is pinned around it)."""
M = timedelta(seconds=60)
S = timedelta(seconds=1)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(store_at=T0)


@pytest.fixture
def node(pg_dsn: str, clock: ManualClock):
    n = OneNode(pg_dsn, clock=clock)
    yield n
    n.close()


class Owner:
    """A second owner of one partition, at the epoch a takeover gave it (its own
    lease table and firer, node id ``node_id``): what a failover leaves."""

    def __init__(self, dsn: str, node_id: str, clock: ManualClock, partition_id: int, epoch: int) -> None:
        self.settings = Settings(dsn=dsn, node_id=node_id).validated()
        self.table = LeaseTable(clock, self.settings.safety_margin_s)
        self.table.grant([(partition_id, epoch)], clock.monotonic(), self.settings.lease_ttl_s)
        self.firer = Firer(self.settings, self.table, clock, Metrics())
        self.epochs = {partition_id: epoch}

    def close(self) -> None:
        self.firer.close()


def overlap_job(conn: psycopg.Connection, overlap: str) -> uuid.UUID:
    """An every-minute job of tenant acme, created an hour before T0, whose next
    slot is T0, with ``overlap``."""
    job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
    conn.execute(
        "UPDATE jobs SET anchor_at = %s, next_nominal_at = %s, next_due_at = %s, overlap = %s,"
        " created_at = %s, changed_at = %s WHERE job_id = %s",
        (T0 - M, T0, T0, overlap, T0 - 60 * M, T0 - 60 * M, job_id),
    )
    return job_id


def at(clock: ManualClock, instant: datetime) -> datetime:
    clock.pin_store(instant)
    return instant


def runs(conn: psycopg.Connection, job_id: uuid.UUID) -> list[tuple]:
    """(nominal, state, origin, overlap, available_at) of the job's runs."""
    rows = conn.execute(
        "SELECT nominal_time, state, origin, overlap, available_at FROM runs WHERE job_id = %s ORDER BY nominal_time",
        (job_id,),
    ).fetchall()
    return [(r["nominal_time"], r["state"], r["origin"], r["overlap"], r["available_at"]) for r in rows]


def skips(conn: psycopg.Connection, job_id: uuid.UUID) -> list[tuple]:
    """(first, until, slots, reason, node) of the job's skips."""
    rows = conn.execute(
        "SELECT first_nominal, until_nominal, slots, reason, node_id FROM skips WHERE job_id = %s"
        " ORDER BY first_nominal",
        (job_id,),
    ).fetchall()
    return [(r["first_nominal"], r["until_nominal"], r["slots"], r["reason"], r["node_id"]) for r in rows]


def claim(conn: psycopg.Connection, now: datetime) -> list[lifecycle.Claimed]:
    return lifecycle.claim(conn, tenant="acme", queue="default", worker="w1", limit=10, now=now)


def audit_ok(conn: psycopg.Connection, until: datetime) -> dict:
    """verify and verify --delivery of [T0 - 30 s, until) pass; returns verify's report."""
    report = verify(conn, since=T0 - 30 * S, until=until)
    assert report.ok, report.findings
    delivery = verify_delivery(conn, T0 - 30 * S, until, lease_ttl_s=30.0, now=until)
    assert (delivery.ok, delivery.lost, delivery.predelivery) == (True, 0, 0), delivery.findings
    return report


def test_forbid_skips_slots_while_a_run_is_unfinished_and_fires_again_after_the_ack(conn, node, clock) -> None:
    job_id = overlap_job(conn, "forbid")
    node.firer.tick()
    (first,) = claim(conn, at(clock, T0 + S))
    at(clock, T0 + M)
    node.firer.tick()
    at(clock, T0 + 2 * M)
    result = node.firer.tick()
    assert (result.fired, result.skipped_ranges) == (0, 1)
    assert lifecycle.ack(conn, [(first.run_id, first.token)], now=T0 + 2 * M + S) == {first.run_id: "succeeded"}
    at(clock, T0 + 3 * M)
    assert node.firer.tick().fired == 1

    assert runs(conn, job_id) == [
        (T0, "succeeded", "schedule", "forbid", T0),
        (T0 + 3 * M, "pending", "schedule", "forbid", T0 + 3 * M),
    ]
    assert skips(conn, job_id) == [
        (T0 + M, T0 + 2 * M, 1, "overlap", "t1"),
        (T0 + 2 * M, T0 + 3 * M, 1, "overlap", "t1"),
    ]
    assert jobs.get_job(conn, job_id)["next_nominal_at"] == T0 + 4 * M
    report = audit_ok(conn, T0 + 3 * M + S)
    assert (report.expected, report.runs, report.skipped, report.missing) == (4, 2, 2, 0)


def test_forbid_catching_up_fires_the_first_slot_and_skips_the_rest(conn, node, clock) -> None:
    job_id = overlap_job(conn, "forbid")
    at(clock, T0 + 2 * M)  # three slots due at once (misfire policy all: caught up)
    result = node.firer.tick()
    assert (result.fired, result.skipped_ranges) == (1, 1)
    assert runs(conn, job_id) == [(T0, "pending", "schedule", "forbid", T0 + 2 * M)]
    assert skips(conn, job_id) == [(T0 + M, T0 + 3 * M, 2, "overlap", "t1")]
    audit_ok(conn, T0 + 2 * M + S)


def test_buffer_one_keeps_one_waiting_run_unclaimable_until_the_first_is_acked(conn, node, clock) -> None:
    job_id = overlap_job(conn, "buffer_one")
    node.firer.tick()
    (first,) = claim(conn, at(clock, T0 + S))
    at(clock, T0 + M)
    node.firer.tick()
    assert claim(conn, T0 + M + S) == []  # waiting: available_at NULL
    epochs = {first.key.partition_id: node.epoch(first.key.partition_id)}
    assert owner.release_buffered(conn, "t1", epochs, T0 + M + S) == 0  # the first is still leased
    at(clock, T0 + 2 * M)
    assert node.firer.tick().skipped_ranges == 1  # one waits already: skipped
    assert lifecycle.ack(conn, [(first.run_id, first.token)], now=T0 + 2 * M + S) == {first.run_id: "succeeded"}
    # The node's delivery thread releases it (its SettleLoop step, as scheduler/node.py registers it).
    loop = SettleLoop(node.settings, node.table, clock, node.metrics, steps=[owner.release_buffered])
    try:
        at(clock, T0 + 2 * M + 2 * S)
        assert loop.run_once() == 1
        at(clock, T0 + 2 * M + 3 * S)
        assert loop.run_once() == 0
    finally:
        loop.close()
    (second,) = claim(conn, T0 + 2 * M + 3 * S)
    assert second.nominal_time == T0 + M
    at(clock, T0 + 3 * M)
    node.firer.tick()  # the second is leased: this one waits behind it

    assert runs(conn, job_id) == [
        (T0, "succeeded", "schedule", "buffer_one", T0),
        (T0 + M, "leased", "schedule", "buffer_one", T0 + 2 * M + 2 * S),
        (T0 + 3 * M, "pending", "schedule", "buffer_one", None),
    ]
    assert skips(conn, job_id) == [(T0 + 2 * M, T0 + 3 * M, 1, "overlap", "t1")]
    audit_ok(conn, T0 + 3 * M + S)


def test_replace_cancels_the_in_flight_run_and_delivers_the_new_one(conn, node, clock) -> None:
    job_id = overlap_job(conn, "replace")
    node.firer.tick()
    (first,) = claim(conn, at(clock, T0 + S))
    at(clock, T0 + M)
    node.firer.tick()
    new_id = RunKey.of(job_id, T0 + M).run_id
    assert lifecycle.heartbeat(conn, [(first.run_id, first.token)], now=T0 + M + S) == {first.run_id: "canceled"}
    assert lifecycle.ack(conn, [(first.run_id, first.token)], now=T0 + M + S) == {first.run_id: "canceled"}
    row = conn.execute(
        "SELECT state, finished_at, last_error FROM runs WHERE job_id = %s AND nominal_time = %s", (job_id, T0)
    ).fetchone()
    assert dict(row) == {"state": "canceled", "finished_at": T0 + M, "last_error": f"replaced by run {new_id}"}
    (second,) = claim(conn, T0 + M + S)
    assert second.run_id == new_id
    assert runs(conn, job_id) == [
        (T0, "canceled", "schedule", "replace", T0),
        (T0 + M, "leased", "schedule", "replace", T0 + M),
    ]
    assert skips(conn, job_id) == []
    audit_ok(conn, T0 + M + S)


def test_allow_runs_overlap_and_carry_no_policy(conn, node, clock) -> None:
    job_id = overlap_job(conn, "allow")
    node.firer.tick()
    claim(conn, at(clock, T0 + S))
    at(clock, T0 + M)
    node.firer.tick()
    assert runs(conn, job_id) == [
        (T0, "leased", "schedule", None, T0),
        (T0 + M, "pending", "schedule", None, T0 + M),
    ]


def takeover(conn: psycopg.Connection, partition_id: int, node_id: str) -> int:
    return conn.execute(
        "UPDATE partitions SET owner_node = %s, owner_epoch = owner_epoch + 1 WHERE partition_id = %s"
        " RETURNING owner_epoch",
        (node_id, partition_id),
    ).fetchone()["owner_epoch"]


def test_forbid_holds_across_a_failover_and_the_stale_owner_commits_nothing(pg_dsn, conn, node, clock) -> None:
    job_id = overlap_job(conn, "forbid")
    node.firer.tick()
    (first,) = claim(conn, at(clock, T0 + S))
    pid = first.key.partition_id
    new = Owner(pg_dsn, "t2", clock, pid, takeover(conn, pid, "t2"))
    try:
        at(clock, T0 + M)
        assert node.firer.tick().fence_rejected == [pid]  # the old owner: nothing
        assert new.firer.tick().skipped_ranges == 1  # the new owner sees the unfinished run
        lifecycle.ack(conn, [(first.run_id, first.token)], now=T0 + M + S)
        at(clock, T0 + 2 * M)
        assert new.firer.tick().fired == 1
    finally:
        new.close()
    assert runs(conn, job_id) == [
        (T0, "succeeded", "schedule", "forbid", T0),
        (T0 + 2 * M, "pending", "schedule", "forbid", T0 + 2 * M),
    ]
    assert skips(conn, job_id) == [(T0 + M, T0 + 2 * M, 1, "overlap", "t2")]
    audit_ok(conn, T0 + 2 * M + S)


def test_buffer_one_holds_across_a_failover_and_only_the_new_owner_releases(pg_dsn, conn, node, clock) -> None:
    job_id = overlap_job(conn, "buffer_one")
    node.firer.tick()
    (first,) = claim(conn, at(clock, T0 + S))
    pid = first.key.partition_id
    old_epochs = {pid: node.epoch(pid)}
    at(clock, T0 + M)
    node.firer.tick()  # waits behind the first
    new = Owner(pg_dsn, "t2", clock, pid, takeover(conn, pid, "t2"))
    try:
        at(clock, T0 + 2 * M)
        assert new.firer.tick().skipped_ranges == 1  # one waits: skipped by the new owner
        lifecycle.ack(conn, [(first.run_id, first.token)], now=T0 + 2 * M + S)
        assert owner.release_buffered(conn, "t1", old_epochs, T0 + 2 * M + 2 * S) == 0  # stale: fenced
        assert owner.release_buffered(conn, "t2", new.epochs, T0 + 2 * M + 2 * S) == 1
    finally:
        new.close()
    assert runs(conn, job_id) == [
        (T0, "succeeded", "schedule", "buffer_one", T0),
        (T0 + M, "pending", "schedule", "buffer_one", T0 + 2 * M + 2 * S),
    ]
    assert skips(conn, job_id) == [(T0 + 2 * M, T0 + 3 * M, 1, "overlap", "t2")]


# ------------------------------------------------------------------ run now


def test_trigger_with_the_same_request_id_twice_makes_one_run(conn, node, clock) -> None:
    job_id = overlap_job(conn, "allow")
    first = manual.request_run(conn, job_id, "deploy-42")
    again = manual.request_run(conn, job_id, "deploy-42", force=True)
    assert (first.created, first.outcome, again.created, again.force) == (True, None, False, False)
    assert manual.wait_request(conn, first, wait_s=0).outcome is None  # no owner yet: queued
    at(clock, T0 + 30 * S)
    assert node.firer.tick().requests == 1
    assert node.firer.tick().requests == 0
    done = manual.wait_request(conn, manual.request_run(conn, job_id, "deploy-42"), wait_s=0)
    assert (done.created, done.outcome, done.nominal_time) == (False, "fired", T0 + 30 * S)
    assert done.run_id == RunKey.of(job_id, T0 + 30 * S).run_id
    assert runs(conn, job_id) == [
        (T0, "pending", "schedule", None, T0 + 30 * S),
        (T0 + 30 * S, "pending", "manual", None, T0 + 30 * S),
    ]
    audit_ok(conn, T0 + M)  # a manual run is no slot's: not unexpected


def test_trigger_honours_forbid_unless_forced(conn, node, clock) -> None:
    job_id = overlap_job(conn, "forbid")
    node.firer.tick()  # the slot T0: unfinished
    manual.request_run(conn, job_id, "a")
    at(clock, T0 + 10 * S)
    node.firer.tick()
    manual.request_run(conn, job_id, "b", force=True)
    at(clock, T0 + 20 * S)
    node.firer.tick()
    outcomes = [(r.outcome, r.nominal_time) for r in (manual.get_request(conn, job_id, x) for x in "ab")]
    assert outcomes == [("skipped", None), ("fired", T0 + 20 * S)]
    assert runs(conn, job_id) == [
        (T0, "pending", "schedule", "forbid", T0),
        (T0 + 20 * S, "pending", "manual", "forbid", T0 + 20 * S),
    ]
    at(clock, T0 + M)
    node.firer.tick()  # the forced manual run is unfinished too: the slot is skipped
    assert skips(conn, job_id) == [(T0 + M, T0 + 2 * M, 1, "overlap", "t1")]
    audit_ok(conn, T0 + M + S)


def test_trigger_of_a_paused_job_runs_and_of_a_deleted_one_is_not_found(conn, node, clock) -> None:
    paused = overlap_job(conn, "allow")
    jobs.set_paused(conn, paused, True)
    request = manual.request_run(conn, paused, "p")
    gone = overlap_job(conn, "allow")
    late = manual.request_run(conn, gone, "g")
    jobs.delete_job(conn, gone)
    with pytest.raises(NotFoundError, match="job_id"):
        manual.request_run(conn, gone, "h")
    with pytest.raises(ValidationError, match="request_id"):
        manual.request_run(conn, paused, "x" * 201)
    at(clock, T0 + 30 * S)
    node.firer.tick()
    assert manual.get_request(conn, paused, request.request_id).outcome == "fired"
    assert manual.get_request(conn, gone, late.request_id).outcome == "deleted"
    assert runs(conn, gone) == []


def test_a_stale_owner_carries_out_no_request(pg_dsn, conn, node, clock) -> None:
    job_id = overlap_job(conn, "allow")
    conn.execute("UPDATE jobs SET next_due_at = NULL, next_nominal_at = NULL WHERE job_id = %s", (job_id,))
    request = manual.request_run(conn, job_id, "r")
    pid = RunKey.of(job_id, T0).partition_id
    new = Owner(pg_dsn, "t2", clock, pid, takeover(conn, pid, "t2"))
    try:
        at(clock, T0 + 10 * S)
        assert node.firer.tick().requests == 0
        assert manual.get_request(conn, job_id, "r").outcome is None
        at(clock, T0 + 20 * S)
        assert new.firer.tick().requests == 1
    finally:
        new.close()
    assert manual.get_request(conn, job_id, request.request_id).nominal_time == T0 + 20 * S
    rows = conn.execute("SELECT node_id FROM runs WHERE job_id = %s", (job_id,)).fetchall()
    assert [r["node_id"] for r in rows] == ["t2"]


# ------------------------------------------------------------------ backfill


def test_backfill_twice_writes_the_same_runs_and_fills_skipped_slots(conn, node, clock) -> None:
    job_id = overlap_job(conn, "forbid")
    node.firer.tick()  # T0 fired
    at(clock, T0 + M)
    node.firer.tick()  # T0 + 1 min skipped (overlap)
    conn.execute("UPDATE jobs SET next_due_at = NULL, next_nominal_at = NULL WHERE job_id = %s", (job_id,))
    now = T0 + 10 * M
    dry = manual.backfill(conn, job_id, T0, T0 + 4 * M, dry_run=True, now=now)
    assert dry.slots == (T0, T0 + M, T0 + 2 * M, T0 + 3 * M)
    assert dry.created == (T0 + M, T0 + 2 * M, T0 + 3 * M)
    assert len(runs(conn, job_id)) == 1  # a dry run writes nothing
    done = manual.backfill(conn, job_id, T0, T0 + 4 * M, now=now)
    assert done.created == (T0 + M, T0 + 2 * M, T0 + 3 * M)
    again = manual.backfill(conn, job_id, T0, T0 + 4 * M, now=now + M)
    assert again.created == ()
    assert runs(conn, job_id) == [
        (T0, "pending", "schedule", "forbid", T0),
        (T0 + M, "pending", "backfill", None, now),
        (T0 + 2 * M, "pending", "backfill", None, now),
        (T0 + 3 * M, "pending", "backfill", None, now),
    ]
    report = audit_ok(conn, T0 + 4 * M)
    assert (report.missing, report.unexpected, report.duplicates) == (0, 0, 0)


@pytest.mark.parametrize("overlap", ["allow", "forbid"])
def test_a_run_carries_its_jobs_name_from_when_it_was_created(conn, node, clock, overlap) -> None:
    """Fired (each overlap path), manual and backfill runs record the job's name ('' for none);
    a claim hands that name over (the job renamed since does not change it, and the
    claim reads nothing of jobs for it), and a run recorded without one (NULL: written
    before revision 0035) gets the job's current name."""
    named, unnamed = overlap_job(conn, overlap), overlap_job(conn, overlap)
    conn.execute("UPDATE jobs SET name = 'nightly' WHERE job_id = %s", (named,))
    node.firer.tick()  # T0, fired
    manual.request_run(conn, named, "r1", force=True)
    at(clock, T0 + 30 * S)
    assert node.firer.tick().requests == 1  # T0 + 30 s, manual
    assert manual.backfill(conn, named, T0 + M, T0 + 2 * M, now=T0 + 10 * M).created == (T0 + M,)
    stored = conn.execute(
        "SELECT job_id, nominal_time, origin, job_name FROM runs ORDER BY job_id = %s, nominal_time", (named,)
    ).fetchall()
    assert [(r["job_id"], r["nominal_time"], r["origin"], r["job_name"]) for r in stored] == [
        (unnamed, T0, "schedule", ""),
        (named, T0, "schedule", "nightly"),
        (named, T0 + 30 * S, "manual", "nightly"),
        (named, T0 + M, "backfill", "nightly"),
    ]
    conn.execute("UPDATE jobs SET name = 'renamed' WHERE job_id = %s", (named,))
    conn.execute("UPDATE runs SET job_name = NULL WHERE job_id = %s AND origin = 'backfill'", (named,))
    claimed = {(c.job_id, c.nominal_time): c.job_name for c in claim(conn, T0 + 11 * M)}
    assert claimed == {
        (unnamed, T0): None,
        (named, T0): "nightly",
        (named, T0 + 30 * S): "nightly",
        (named, T0 + M): "renamed",
    }


def test_backfill_over_its_bound_or_into_the_future_writes_nothing(conn, node, clock) -> None:
    job_id = overlap_job(conn, "allow")
    with pytest.raises(ValidationError, match="^max_runs: the range holds more than 3 slots"):
        manual.backfill(conn, job_id, T0, T0 + 4 * M, max_runs=3, now=T0 + 10 * M)
    with pytest.raises(ValidationError, match="^until: must not be later than the store's now"):
        manual.backfill(conn, job_id, T0, T0 + 4 * M, now=T0 + M)
    with pytest.raises(ValidationError, match="^until: must be later than --since"):
        manual.backfill(conn, job_id, T0, T0, now=T0 + M)
    with pytest.raises(ValidationError, match="^max_runs: must be a whole number"):
        manual.backfill(conn, job_id, T0, T0 + M, max_runs=0, now=T0 + M)
    assert runs(conn, job_id) == []
    assert manual.backfill(conn, job_id, T0, T0 + 3 * M, max_runs=3, now=T0 + 10 * M).created == (
        T0,
        T0 + M,
        T0 + 2 * M,
    )


# ------------------------------------------------------------------ CLI


def cli(args: list[str], dsn: str):
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": dsn}
    return CliRunner().invoke(main_cli, args, env=env, catch_exceptions=False)


def test_cli_trigger_is_queued_without_an_owner_then_reports_the_run(pg_dsn, conn, node, clock) -> None:
    job_id = overlap_job(conn, "allow")
    queued = cli(["jobs", "trigger", str(job_id), "--request-id", "r1", "--wait-s", "0"], pg_dsn)
    assert queued.exit_code == 0, queued.stderr
    assert queued.stdout.startswith("queued: no node carried it out within 0s")
    at(clock, T0 + 30 * S)
    node.firer.tick()
    again = cli(["jobs", "trigger", str(job_id), "--request-id", "r1", "--wait-s", "0"], pg_dsn)
    run_id = RunKey.of(job_id, T0 + 30 * S).run_id
    assert again.stdout == f"request r1 was made before: its outcome\nfired run {run_id}\n"
    fresh = cli(["jobs", "trigger", str(uuid.uuid4())], pg_dsn)
    assert (fresh.exit_code, fresh.stderr.startswith("error: job_id: no job")) == (2, True), fresh.stderr


def test_cli_trigger_skipped_says_a_forced_run_needs_a_new_request_id(pg_dsn, conn, node, clock) -> None:
    """A request's outcome stands, --force included (docs/delivery.md): the hint must not send
    the user back with the same id and --force, which changes nothing (a trial)."""
    job_id = overlap_job(conn, "forbid")
    node.firer.tick()  # the T0 run, unfinished: forbid skips a manual run
    at(clock, T0 + 10 * S)
    assert cli(["jobs", "trigger", str(job_id), "--request-id", "r1", "--wait-s", "0"], pg_dsn).exit_code == 0
    node.firer.tick()
    hint = "skipped: the job's overlap policy forbids another run now (a new --request-id with --force runs it anyway)"
    forced = cli(["jobs", "trigger", str(job_id), "--request-id", "r1", "--force", "--wait-s", "0"], pg_dsn)
    assert forced.stdout == f"request r1 was made before: its outcome\n{hint}\n"
    assert [r[2] for r in runs(conn, job_id)] == ["schedule"]  # nothing fired


def test_cli_shows_a_buffered_run_as_held_not_as_an_ordinary_pending_one(pg_dsn, conn, node, clock) -> None:
    """A buffer_one run waiting behind an unfinished one is pending with no available_at:
    `runs list` and `jobs describe` say it is held (it read as any pending run; a trial)."""
    job_id = overlap_job(conn, "buffer_one")
    node.firer.tick()
    claim(conn, at(clock, T0 + S))
    at(clock, T0 + M)
    node.firer.tick()
    held, leased = RunKey.of(job_id, T0 + M).run_id, RunKey.of(job_id, T0).run_id
    listed = cli(["runs", "list", "--job", str(job_id)], pg_dsn).stdout.splitlines()
    state_of = {line.split()[0]: line for line in listed[1:]}
    assert " pending (held: buffer_one) " in state_of[held]
    assert " leased " in state_of[leased]
    described = cli(["jobs", "describe", str(job_id)], pg_dsn).stdout
    assert f"{held}  " in described and "pending (held: buffer_one)" in described
    as_json = json.loads(cli(["runs", "list", "--job", str(job_id), "--json"], pg_dsn).stdout)
    assert [(r["state"], r["available_at"]) for r in as_json][0] == ("pending", None)  # JSON as stored


def test_cli_backfill_lists_refuses_over_its_bound_and_creates(pg_dsn, conn) -> None:
    job_id = overlap_job(conn, "allow")
    base = ["jobs", "backfill", str(job_id), "--since", "2025-03-04T05:06:00Z", "--until", "2025-03-04T05:09:00Z"]
    refused = cli([*base, "--max-runs", "2"], pg_dsn)
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        "error: max_runs: the range holds more than 2 slots: narrow --since/--until or raise --max-runs (got 2)"
    ]
    dry = cli([*base, "--dry-run"], pg_dsn)
    ids = [RunKey.of(job_id, T0 + k * M).run_id for k in range(3)]
    assert dry.stdout.splitlines() == [f"2025-03-04T05:0{6 + k}:00Z  {run_id}" for k, run_id in enumerate(ids)]
    assert runs(conn, job_id) == []
    assert cli(base, pg_dsn).stderr == "3 slots in the range; created 3 runs\n"
    assert cli(base, pg_dsn).stderr == "3 slots in the range; created 0 runs\n"
    assert [r[0] for r in runs(conn, job_id)] == [T0, T0 + M, T0 + 2 * M]


def test_cli_trigger_waits_for_the_owner_and_prints_the_run(pg_dsn, conn, node, clock) -> None:
    job_id = overlap_job(conn, "allow")
    at(clock, T0 + 30 * S)
    ticks = []

    def owner() -> None:  # the owner's tick comes while the CLI waits (generous margin: 10 s)
        wait_for(
            "the trigger's request", lambda: conn.execute("SELECT count(*) AS n FROM run_requests").fetchone()["n"]
        )
        ticks.append(node.firer.tick().requests)

    thread = threading.Thread(target=owner)
    thread.start()
    try:
        result = cli(["jobs", "trigger", str(job_id), "--request-id", "w", "--wait-s", "10"], pg_dsn)
    finally:
        thread.join(15)
    assert ticks == [1]
    assert result.stdout == f"fired run {RunKey.of(job_id, T0 + 30 * S).run_id}\n"


@pytest.mark.parametrize("wait_s", ["-1", "86401", "1e9"])
def test_cli_trigger_with_a_bad_wait_writes_no_request(pg_dsn, conn, wait_s) -> None:
    job_id = overlap_job(conn, "allow")
    result = cli(["jobs", "trigger", str(job_id), "--wait-s", wait_s], pg_dsn)
    assert (result.exit_code, result.stdout) == (2, "")
    rule = "must be a number of seconds from 0 to 86400 in ASCII digits"
    assert result.stderr == f"error: wait_s: {rule} (got '{wait_s}')\n"
    assert conn.execute("SELECT count(*) AS n FROM run_requests").fetchone()["n"] == 0


@pytest.mark.parametrize(
    ("request_id", "shown"),
    [("a\nb", "'a\\nb'"), ("deploy\x1b[2J", "'deploy\\x1b[2J'"), ("", "''"), ("x" * 201, None)],
)
def test_cli_trigger_with_a_bad_request_id_writes_no_request(pg_dsn, conn, request_id, shown) -> None:
    """A request id is printable text, as a job's name (a trial: a line break was taken, and is
    echoed in every log line and listing that names the request)."""
    job_id = overlap_job(conn, "allow")
    result = cli(["jobs", "trigger", str(job_id), "--request-id", request_id], pg_dsn)
    assert (result.exit_code, result.stdout) == (2, "")
    [line] = result.stderr.splitlines()
    assert line.startswith("error: request_id: must be 1 to 200 printable characters (got "), line
    if shown is not None:
        assert line == f"error: request_id: must be 1 to 200 printable characters (got {shown})"
    assert conn.execute("SELECT count(*) AS n FROM run_requests").fetchone()["n"] == 0
    assert runs(conn, job_id) == []


def test_cli_backfill_at_the_edge_of_the_supported_range_is_one_line_or_works(pg_dsn, conn) -> None:
    job_id = overlap_job(conn, "allow")
    until = ["--until", "2025-03-04T05:09:00Z"]
    early = cli(["jobs", "backfill", str(job_id), "--since", "0001-01-01T00:00:00+05:00", *until], pg_dsn)
    assert (early.exit_code, early.stderr.splitlines()) == (
        2,
        ["error: since: must lie in years 2 to 9997 (the supported range) (got '0001-01-01T00:00:00+05:00')"],
    )
    # From the first instant of the range: the job's slots since its creation, listed (no traceback).
    first = cli(["jobs", "backfill", str(job_id), "--since", "0002-01-01T00:00:00Z", *until, "--dry-run"], pg_dsn)
    exact = cli(["jobs", "backfill", str(job_id), "--since", "2025-01-01T00:00:00Z", *until, "--dry-run"], pg_dsn)
    assert (first.exit_code, first.stdout, first.stderr) == (0, exact.stdout, exact.stderr)
    assert first.stdout.count("\n") >= 3
    assert runs(conn, job_id) == []
