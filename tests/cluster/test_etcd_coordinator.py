"""The etcd coordinator in process, on one PostgreSQL and the session's throwaway etcd.

What every coordinator must do (claim races, increasing epochs, renew and
release keyed on (node, epoch), a restarted node inheriting nothing) is
checked for this one and the SQL one alike in
``test_coordinator_contract.py``; here, what is the etcd coordinator's own:

* epoch regression at claim time: a partition whose stored epoch is already
  ≥ the revision is logged at ERROR (partition, stored epoch, revision), not
  returned, and its key is deleted; the others are claimed;
* epoch regression at start: a node refuses to start (exit status ≠ 0, one
  line saying what to do) when etcd's revision is below the stored epochs;
* claim lists etcd itself past a mirror that shows nothing free at most once
  per TTL of the coordinator's injected clock;
* renew: keys still on our lease are returned; an expired (here: revoked)
  lease returns nothing and the node re-registers under a new lease; keys on
  our lease the loop does not hold are deleted;
* the store clock: its store queries send NULL as ``now`` with the system
  clock, and a pinned clock's instant otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from harness import TIMINGS, etcd_keys, partitions, run_cli
from helpers import PINNABLE_QUERIES, record_named_queries

from scheduler import log
from scheduler.clock import Clock, ManualClock
from scheduler.coordination import Lease
from scheduler.devtools.etcd_server import ThrowawayEtcd
from scheduler.errors import EpochRegressionError
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings

pytestmark = pytest.mark.cluster


@pytest.fixture
def make(pg_dsn: str, etcd_server: ThrowawayEtcd, etcd_prefix: str) -> Iterator:
    """``make(node_id, clock=None) -> EtcdCoordinator`` on this test's database and prefix; all closed after."""
    from scheduler.coordination.etcd import EtcdCoordinator

    made = []

    def factory(node_id: str, clock: Clock | None = None) -> EtcdCoordinator:
        settings = Settings(
            dsn=pg_dsn,
            node_id=node_id,
            lease_ttl_s=TIMINGS.lease_ttl_s,
            renew_interval_s=TIMINGS.renew_interval_s,
            safety_margin_s=TIMINGS.safety_margin_s,
            coordinator="etcd",
            etcd_endpoints=etcd_server.endpoint,
            etcd_prefix=etcd_prefix,
        ).validated()
        coordinator = EtcdCoordinator(settings, Metrics(), clock=clock)
        made.append(coordinator)
        return coordinator

    yield factory
    for coordinator in made:
        coordinator.close()


@pytest.fixture
def events() -> Iterator[list[dict]]:
    """Every ``scheduler`` log event recorded during the test, as ``{"event", **fields, "level"}``."""
    records: list[dict] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append({"event": record.getMessage(), "level": record.levelname, **getattr(record, "fields", {})})

    handler = Capture(logging.DEBUG)
    log.LOGGER.addHandler(handler)
    level = log.LOGGER.level
    log.LOGGER.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.LOGGER.removeHandler(handler)
        log.LOGGER.setLevel(level)


def test_claim_with_stored_epoch_above_revision_is_refused_loudly(
    make, conn: psycopg.Connection, events: list[dict], etcd_server: ThrowawayEtcd, etcd_prefix: str
) -> None:
    coordinator = make("regress")
    coordinator.join()
    regressed = [3, 7, 900]
    conn.execute("UPDATE partitions SET owner_epoch = 1000000000000 WHERE partition_id = ANY(%s)", (regressed,))

    claimed = coordinator.claim(PARTITION_COUNT)
    pids = {pid for pid, _ in claimed}
    assert pids == set(range(PARTITION_COUNT)) - set(regressed)
    errors = [e for e in events if e["event"] == "epoch_regression"]
    assert sorted(e["partition"] for e in errors) == regressed
    assert all(e["level"] == "ERROR" and e["stored_epoch"] == 10**12 and 0 < e["revision"] < 10**12 for e in errors), (
        errors
    )
    keys = etcd_keys(etcd_server.endpoint, etcd_prefix)
    assert not set(regressed) & set(keys.owners), "a regressed partition's key must not be held"
    rows = partitions(conn)
    assert all((rows[pid].owner_node, rows[pid].owner_epoch) == (None, 10**12) for pid in regressed)


def test_node_refuses_to_start_when_etcd_revision_is_below_stored_epochs(
    pg_dsn: str, conn: psycopg.Connection, etcd_server: ThrowawayEtcd, etcd_prefix: str
) -> None:
    conn.execute("UPDATE partitions SET owner_epoch = owner_epoch + 1000000000000")  # e.g. SQL epochs, reset etcd
    result = run_cli(
        "--log-format",
        "json",
        "node",
        "--dsn",
        pg_dsn,
        "--node-id",
        "late",
        "--coordinator",
        "etcd",
        "--etcd-endpoints",
        etcd_server.endpoint,
        "--etcd-prefix",
        etcd_prefix,
        *TIMINGS_FLAGS,
        timeout_s=30,
    )
    assert result.returncode != 0, result.stderr
    lines = result.stderr.strip().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    regression = [r for r in records if r["event"] == "epoch_regression"]
    assert regression and regression[0]["level"] == "error", result.stderr
    assert regression[0]["stored_epoch"] >= 10**12 and regression[0]["revision"] < 10**12
    assert lines[-1].startswith("error: etcd revision") and "docs/operations.md" in lines[-1], lines[-1]
    assert not etcd_keys(etcd_server.endpoint, etcd_prefix).owners  # nothing claimed
    assert all(row.owner_node is None for row in partitions(conn).values())


TIMINGS_FLAGS = [
    "--lease-ttl-s",
    str(TIMINGS.lease_ttl_s),
    "--renew-interval-s",
    str(TIMINGS.renew_interval_s),
    "--safety-margin-s",
    str(TIMINGS.safety_margin_s),
]


def test_renew_keeps_keys_on_lease_drops_expired_lease_and_orphans(
    make, events: list[dict], etcd_server: ThrowawayEtcd, etcd_prefix: str
) -> None:
    coordinator = make("renewer")
    coordinator.join()
    claimed = coordinator.claim(10)
    leases = [Lease(pid, epoch, 0.0) for pid, epoch in claimed]
    assert sorted(coordinator.renew(leases)) == sorted(claimed)

    # The loop holds only 6 of them: the other 4 keys are orphans, deleted by renew.
    assert sorted(coordinator.renew(leases[:6])) == sorted(claimed[:6])
    owners = etcd_keys(etcd_server.endpoint, etcd_prefix).owners
    assert sorted(owners) == sorted(pid for pid, _ in claimed[:6])
    assert [e["partitions"] for e in events if e["event"] == "etcd_orphan_keys"] == [4]

    # The lease expires (revoked behind its back, as a long pause would): nothing is
    # renewed, and the node is a member again under a new lease.
    import aetcd

    async def revoke() -> None:
        async with aetcd.Client(host="127.0.0.1", port=etcd_server.port) as client:
            await client.revoke_lease(coordinator._lease_id)

    old_lease = coordinator._lease_id
    asyncio.run(revoke())
    assert coordinator.renew(leases[:6]) == []
    assert [e["event"] for e in events if e["event"] == "etcd_lease_expired"] == ["etcd_lease_expired"]
    keys = etcd_keys(etcd_server.endpoint, etcd_prefix)
    assert keys.members == {"renewer"} and not keys.owners
    assert coordinator._lease_id not in (None, old_lease)
    assert len(coordinator.claim(3)) == 3  # and claims again


def test_leave_revokes_membership_and_keys(make, etcd_server: ThrowawayEtcd, etcd_prefix: str) -> None:
    stayer, leaver = make("stayer"), make("leaver")
    stayer.join()
    leaver.join()
    woken = threading.Event()
    stayer.set_on_change(woken.set)
    assert leaver.claim(5)
    leaver.leave()
    assert woken.wait(5), "the watch did not report the leave"
    keys = etcd_keys(etcd_server.endpoint, etcd_prefix)
    assert keys.members == {"stayer"} and not keys.owners
    assert stayer.live_nodes() == ["stayer"]


def test_refusal_error_is_epoch_regression_error(make, conn: psycopg.Connection) -> None:
    conn.execute("UPDATE partitions SET owner_epoch = 1000000000000 WHERE partition_id = 5")
    coordinator = make("refused")
    with pytest.raises(EpochRegressionError, match="is below the store's owner_epoch 1000000000000"):
        coordinator.join()


def test_claim_lists_etcd_past_a_stale_mirror_once_per_ttl_of_the_injected_clock(make) -> None:
    clock = ManualClock()
    coordinator = make("lister", clock=clock)
    coordinator.join()
    with coordinator._mirror.lock:  # a stalled watch: the mirror believes every partition is taken
        coordinator._mirror.owners = {pid: 0 for pid in range(PARTITION_COUNT)}

    sent = coordinator.requests
    assert coordinator.claim(4) == []  # listed less than a TTL ago (at construction): not again
    assert coordinator.requests == sent

    clock.advance(TIMINGS.lease_ttl_s + 0.5)  # the coordinator's clock, not the process's
    claimed = coordinator.claim(4)
    assert len(claimed) == 4 and len({epoch for _, epoch in claimed}) == 1
    assert coordinator.requests == sent + 2  # one listing, one claim transaction
    assert coordinator.claim(4) == []  # the mirror still says nothing is free: no listing for a TTL
    assert coordinator.requests == sent + 2


def test_store_queries_send_the_clocks_store_pin(make, conn: psycopg.Connection, monkeypatch) -> None:
    """With the system clock (production) every time-dependent store query the
    coordinator sends carries NULL as ``now`` (the store's clock judges); with a
    pinned clock its claims write lease times at exactly the pinned instant
    (scheduler/clock.py, "The pinned store clock")."""
    sent = record_named_queries(monkeypatch)
    plain = make("plain")
    plain.join()  # the epoch check at start reads partition_status
    assert len(plain.claim(4)) == 4
    pinnable = [(name, params["now"]) for name, params in sent if name in PINNABLE_QUERIES]
    assert {name for name, _ in pinnable} == {"partition_status", "claim_partitions_at_epoch"}
    assert [(name, now) for name, now in pinnable if now is not None] == []

    at = datetime(2031, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    pinned = make("pinned", clock=ManualClock(store_at=at))
    pinned.join()
    claimed = pinned.claim(4)
    rows = conn.execute(
        "SELECT partition_id, owner_node, owner_epoch, acquired_at, renewed_at, lease_expires_at"
        " FROM leases WHERE owner_node = 'pinned'"
    ).fetchall()
    expiry = at + timedelta(seconds=TIMINGS.lease_ttl_s)
    assert sorted((r["partition_id"], r["owner_epoch"]) for r in rows) == sorted(claimed)
    assert {(r["acquired_at"], r["renewed_at"], r["lease_expires_at"]) for r in rows} == {(at, at, expiry)}
