"""scheduler/coordination/rewind.py: the renewal watermarks and the epoch watch, pure (no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduler.coordination.rewind import RenewalWatermarks, RewindWatch
from scheduler.metrics import Metrics

T = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


def counted(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("scheduler_store_rewind_detected_total")


def row(pid: int, epoch: int, prior: datetime | None, written: datetime) -> dict:
    return {"partition_id": pid, "owner_epoch": epoch, "prior_renewed_at": prior, "renewed_at": written}


def test_a_renewal_finding_an_earlier_value_than_the_last_one_written_is_a_rewind() -> None:
    metrics = Metrics()
    marks = RenewalWatermarks("n1", metrics)
    marks.claimed([{"partition_id": pid, "owner_epoch": 1, "renewed_at": T} for pid in range(4)])
    marks.check([row(pid, 1, T, T + 3 * S) for pid in range(4)])  # healthy: what the claim wrote
    assert counted(metrics) == 0
    marks.check(
        [
            row(0, 1, T + 3 * S, T + 6 * S),  # healthy
            row(1, 1, T, T + 6 * S),  # the renewal at T + 3 s was lost: rewound
            row(2, 1, T + 4 * S, T + 6 * S),  # later: a renewal whose commit went unanswered
            row(3, 2, None, T + 6 * S),  # another epoch (claimed afresh): not compared
        ]
    )
    assert counted(metrics) == 1
    marks.check([row(pid, 1, T + 6 * S, T + 9 * S) for pid in range(2)])  # 2, 3 forgotten: not renewed now
    assert counted(metrics) == 1
    marks.check([row(2, 1, T, T + 12 * S)])  # nothing remembered for 2 any more
    assert counted(metrics) == 1


def test_the_epoch_watch_counts_each_rewound_partition_once() -> None:
    metrics = Metrics()
    watch = RewindWatch("n1", metrics)
    watch.check_claimed([(0, 3), (1, 3), (2, 3)])
    watch.granted([(0, 3)])
    assert watch.known() == [0, 1, 2] and counted(metrics) == 0
    watch.check_fences({0: ("n1", 3), 1: ("n2", 4), 2: ("n2", 3), 7: (None, 0)})  # 2: same epoch, other node
    assert counted(metrics) == 1 and watch.known() == [0, 1]
    watch.check_fences({2: ("n2", 3)})
    assert counted(metrics) == 1
    watch.check_claimed([(0, 2), (2, 4)])  # 0: a claim not above the 3 held
    assert counted(metrics) == 2
    watch.check_claimed([(0, 3)])  # remembered at 2 since: healthy
    assert counted(metrics) == 2
