"""scheduler/coordination/rewind.py: the renewal watermarks and the epoch watch, pure (no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduler.coordination.rewind import SEEN_TWICE_S, RenewalWatermarks, RewindWatch, RunMarks
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


J = ["00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"]


def marked(pids: list[int], jids: list[str], nominals: list[datetime], epochs: list[int]) -> dict:
    """A firing statement's answer: its rewind marks (and nothing else the marks read)."""
    return {"mark_pids": pids, "mark_jobs": jids, "mark_nominals": nominals, "mark_epochs": epochs}


def present(pid: int, jid: str, nominal: datetime, node: str | None, epoch: int | None, slot: datetime | None) -> dict:
    """A ``select_runs_present`` row (``slot``: the job's next_nominal_at; no job when ``...``)."""
    return {
        "partition_id": pid,
        "job_id": jid,
        "nominal_time": nominal,
        "run_node": node,
        "run_epoch": epoch,
        "job_exists": slot is not ...,
        "next_nominal_at": None if slot is ... else slot,
    }


def test_run_marks_keep_the_last_committed_run_of_each_partition() -> None:
    marks = RunMarks("n1", Metrics())
    marks.committed(marked([3, 7], J, [T, T + S], [1, 2]))
    marks.committed({"fenced": [3], "mark_pids": [], "mark_jobs": [], "mark_nominals": [], "mark_epochs": []})
    marks.committed(marked([3], [J[1]], [T + 2 * S], [1]))  # a later commit replaces partition 3's
    assert marks.remembered() == {3: (J[1], T + 2 * S, 1), 7: (J[1], T + S, 2)}
    assert marks.params() == {"pids": [3, 7], "jids": [J[1], J[1]], "nominals": [T + 2 * S, T + S]}


def test_the_runs_check_maps_the_store_answer_to_rewound_partitions() -> None:
    metrics = Metrics()
    marks = RunMarks("n1", metrics)
    marks.committed(marked([0, 1, 2, 3, 4, 5], [J[0]] * 6, [T] * 6, [4] * 6))
    rewound = marks.check(
        [
            present(0, J[0], T, "n1", 4, T + S),  # there, ours: healthy
            present(1, J[0], T, None, None, T),  # gone, its job back at its slot: rewound
            present(2, J[0], T, None, None, T + S),  # gone, its job past it (pruned): not a rewind
            present(3, J[0], T, None, None, ...),  # gone with its job (pruned, or created in the lost window)
            present(4, J[0], T, "n2", 5, T + S),  # fired again by another node: rewound
            present(5, J[0], T, "n1", 5, T + S),  # ours under another epoch: fired again, rewound
        ]
    )
    assert rewound == [1, 4, 5]
    assert counted(metrics) == 3
    assert sorted(marks.remembered()) == [0, 2, 3]  # the rewound ones forgotten
    assert marks.check([present(1, J[0], T, None, None, T)]) == []  # forgotten: not counted twice
    assert counted(metrics) == 3


def test_one_rewind_seen_by_the_lease_watches_and_the_runs_watch_counts_once() -> None:
    metrics = Metrics()
    assert metrics.count_rewound([1, 2], "runs", 100.0, SEEN_TWICE_S) == [1, 2]
    assert metrics.count_rewound([0, 1, 2, 3], "lease", 101.0, SEEN_TWICE_S) == [0, 3]
    assert metrics.count_rewound([0], "lease", 102.0, SEEN_TWICE_S) == [0]  # the same watch: its own rule
    assert metrics.count_rewound([1], "runs", 100.0 + SEEN_TWICE_S + 1, SEEN_TWICE_S) == [1]  # a later rewind
    assert counted(metrics) == 6
