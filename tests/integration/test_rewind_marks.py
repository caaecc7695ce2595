"""The firer's rewind check (scheduler/coordination/rewind.py, RunMarks) against a real store.

The firing statements return, per partition, their highest inserted run;
the firer remembers it, and the first tick after its sessions were closed
checks (``select_runs_present``) that the store still has those runs. A
rewind is simulated here by hand on the rows one failover would lose, so
each case has one exact answer.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import psycopg
import pytest
from helpers import OneNode, stamp_schedule_keys, store_now

from scheduler import jobs, store
from scheduler.firing import FiringLimits
from scheduler.partition import partition_of
from scheduler.spec import JobSpec

COUNTER = "scheduler_store_rewind_detected_total"


@pytest.fixture
def node(pg_dsn: str):
    n = OneNode(pg_dsn)
    yield n
    n.close()


def overdue_jobs(conn: psycopg.Connection, count: int, slots: int = 3) -> list[uuid.UUID]:
    """``count`` interval jobs (60 s) in distinct partitions, each ``slots`` slots overdue."""
    anchor = store_now(conn).replace(microsecond=0) - timedelta(seconds=60 * slots + 30)
    made: dict[int, uuid.UUID] = {}
    while len(made) < count:
        job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
        if partition_of(job_id) in made:
            jobs.delete_job(conn, job_id)
            continue
        made[partition_of(job_id)] = job_id
        conn.execute(
            "UPDATE jobs SET anchor_at = %(a)s, next_nominal_at = %(n)s, next_due_at = %(n)s,"
            " created_at = %(a)s, changed_at = %(a)s WHERE job_id = %(j)s",
            {"a": anchor, "n": anchor + timedelta(seconds=60), "j": job_id},
        )
    return list(made.values())


def last_runs(conn: psycopg.Connection) -> dict[int, tuple]:
    """Per partition, the highest run in the store (nominal time, then job id) and its epoch."""
    rows = conn.execute(
        "SELECT DISTINCT ON (partition_id) partition_id, job_id, nominal_time, epoch FROM runs"
        " ORDER BY partition_id, nominal_time DESC, job_id DESC"
    ).fetchall()
    return {r["partition_id"]: (r["job_id"], r["nominal_time"], r["epoch"]) for r in rows}


def test_the_firer_remembers_the_highest_run_it_committed_per_partition(conn, node) -> None:
    job_ids = overdue_jobs(conn, 3)
    result = node.firer.tick()
    assert result.fired == 9
    remembered = node.firer.marks.remembered()
    assert remembered == last_runs(conn)
    assert sorted(remembered) == sorted(partition_of(j) for j in job_ids)
    assert {pid: entry[2] for pid, entry in remembered.items()} == {pid: node.epoch(pid) for pid in remembered}


def test_after_a_reconnect_the_first_tick_reports_the_lost_runs_then_fires_them_again(conn, node, caplog) -> None:
    lost, refired, pruned = overdue_jobs(conn, 3)
    node.firer.tick()
    remembered = node.firer.marks.remembered()
    before = conn.execute("SELECT job_id, nominal_time FROM runs WHERE job_id = %s ORDER BY 2", (lost,)).fetchall()
    first = before[0]["nominal_time"]
    # The rewind: ``lost``'s runs and slot go back (an async tail); ``refired``'s last run
    # is there again, fired by another node after the loss; ``pruned``'s last run was
    # deleted by retention (its job stays past it: not a rewind).
    conn.execute("DELETE FROM runs WHERE job_id = %s", (lost,))
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(n)s, next_due_at = %(n)s WHERE job_id = %(j)s", {"n": first, "j": lost}
    )
    conn.execute(
        "UPDATE runs SET node_id = 'other', epoch = 7 WHERE job_id = %s AND nominal_time = %s",
        (refired, remembered[partition_of(refired)][1]),
    )
    conn.execute(
        "DELETE FROM runs WHERE job_id = %s AND nominal_time = %s", (pruned, remembered[partition_of(pruned)][1])
    )
    node.table.drop([partition_of(refired)])  # a lease lost since: its run is still this node's concern

    assert node.firer.check_marks() == []  # no reconnect, no check
    node.firer.close()  # as after a store error: the next tick reconnects
    with caplog.at_level(logging.WARNING, logger="scheduler"):
        node.firer.tick()

    rewound = sorted([partition_of(lost), partition_of(refired)])
    assert node.metrics.value(COUNTER) == 2
    records = [r for r in caplog.records if getattr(r, "event", None) == "store_rewound"]
    assert [(r.fields["seen"], r.fields["partitions"]) for r in records] == [("runs", 2)]
    assert [entry["partition"] for entry in records[0].fields["sample"]] == rewound
    assert [entry["store"] for entry in records[0].fields["sample"]] == [
        "missing" if pid == partition_of(lost) else "fired again by other at epoch 7" for pid in rewound
    ]
    # The lost slots fired again, same identity; their partition remembered afresh; the other forgotten.
    after = conn.execute("SELECT job_id, nominal_time FROM runs WHERE job_id = %s ORDER BY 2", (lost,)).fetchall()
    assert after == before
    now_remembered = node.firer.marks.remembered()
    assert now_remembered[partition_of(lost)] == remembered[partition_of(lost)]
    assert partition_of(refired) not in now_remembered
    assert now_remembered[partition_of(pruned)] == remembered[partition_of(pruned)]

    node.firer.close()
    node.firer.tick()
    assert node.metrics.value(COUNTER) == 2  # checked again: nothing new


def test_a_failed_check_never_holds_firing_and_runs_again_on_the_next_tick(conn, node, monkeypatch) -> None:
    (job_id,) = overdue_jobs(conn, 1)
    node.firer.tick()
    conn.execute("DELETE FROM runs WHERE job_id = %s", (job_id,))
    slot = node.firer.marks.remembered()[partition_of(job_id)][1]
    conn.execute(
        "UPDATE jobs SET next_nominal_at = %(n)s, next_due_at = %(n)s WHERE job_id = %(j)s", {"n": slot, "j": job_id}
    )
    node.firer.close()
    real = store.execute

    def failing(conn, name, *args, **kwargs):
        if name == "select_runs_present":
            raise psycopg.OperationalError("connection lost")
        return real(conn, name, *args, **kwargs)

    monkeypatch.setattr(store, "execute", failing)
    assert node.firer.tick().fired == 1  # the slot fires again: the check never holds the tick
    monkeypatch.setattr(store, "execute", real)
    assert node.metrics.value(COUNTER) == 0
    assert node.firer.check_marks() == []  # due again, found the run fired again by this node: nothing


def test_a_herd_chunk_marks_its_highest_job_per_partition(pg_dsn, conn) -> None:
    node = OneNode(pg_dsn, node_id="herd", limits=FiringLimits(herd_min_jobs=20, first_pass_herd_quota=20))
    try:
        due = store_now(conn).replace(microsecond=0) - timedelta(seconds=120)
        job_ids = jobs.add_jobs(conn, [JobSpec.build(tenant="big", interval_s=3600) for _ in range(40)])
        conn.execute(  # all due at one instant, 2 minutes ago: one herd
            "UPDATE jobs SET anchor_at = %(a)s, created_at = %(a)s, changed_at = %(a)s,"
            " next_nominal_at = %(d)s, next_due_at = %(d)s WHERE job_id = ANY(%(j)s)",
            {"a": due - timedelta(hours=1), "d": due, "j": job_ids},
        )
        stamp_schedule_keys(conn)
        result = node.firer.tick()
        assert result.herd_fired == 40
        assert node.firer.marks.remembered() == last_runs(conn)
        assert len(node.firer.marks) == len({partition_of(j) for j in job_ids})
    finally:
        node.close()
