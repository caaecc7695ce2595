"""The report math of ``bench deliver`` (bench.deliver.summarize): exact figures of a few runs;
which worker processes it starts (bench.consumers.worker_plan)."""

from __future__ import annotations

import pytest

from bench.consumers import check_impl, worker_plan
from bench.deliver import summarize
from bench.report import percentile

T = 1_000.0  # the herd instant (epoch s)


def row(tenant: str, state: str | None, attempt: int, dispatch: float | None, ack: float | None) -> dict:
    return {
        "tenant": tenant,
        "state": state,
        "attempt": attempt,
        "dispatch_s": dispatch,
        "ack_s": ack,
        "finished_s": None if ack is None else T + ack,
    }


ROWS = [
    row("big", "succeeded", 1, 0.5, 0.75),
    row("big", "succeeded", 1, 1.5, 2.0),
    row("big", "succeeded", 2, 1.0, 4.0),
    row("small-000", "succeeded", 1, 0.25, 0.5),
    row("small-001", "succeeded", 1, 0.75, 1.0),
    row("small-001", "dead", 5, 0.5, 9.0),  # finished, never acked: its ack lag is infinite
    row("small-000", "pending", 0, None, None),  # never claimed
]


def test_herd_figures() -> None:
    out = summarize(ROWS, instant_s=T)
    assert out["runs"] == 7
    assert out["states"] == {"dead": 1, "pending": 1, "succeeded": 5}
    assert (out["succeeded"], out["lost"], out["pending"], out["without_delivery_state"]) == (5, 2, 1, 0)
    assert out["attempts"] == {"0": 1, "1": 4, "2": 1, "5": 1}
    assert out["redelivered"] == 2
    # dispatch lags sorted: 0.25 0.5 0.5 0.75 1.0 1.5 inf
    assert out["dispatch_p50_s"] == 0.75
    assert out["dispatch_p99_s"] is None  # falls between 1.5 and the unclaimed run
    assert out["dispatch_max_s"] is None
    # ack lags sorted: 0.5 0.75 1.0 2.0 4.0 inf inf
    assert out["ack_p50_s"] == 2.0
    assert out["ack_max_s"] is None
    # small tenants' dispatch lags: 0.25 0.5 0.75 inf
    assert out["small_tenants_dispatch_p50_s"] == pytest.approx(0.625)
    assert out["small_tenants_dispatch_p99_s"] is None
    assert out["last_ack_s"] == 4.0  # the dead run's finish is not an ack
    assert out["throughput_runs_per_s"] == 5 / 4.0


def test_all_delivered() -> None:
    done = [r for r in ROWS if r["state"] == "succeeded"]
    out = summarize(done, instant_s=T)
    assert (out["runs"], out["succeeded"], out["lost"]) == (5, 5, 0)
    assert out["dispatch_p50_s"] == 0.75
    assert out["dispatch_p99_s"] == pytest.approx(percentile([0.25, 0.5, 0.75, 1.0, 1.5], 0.99))
    assert out["dispatch_p99_s"] == pytest.approx(1.0 + 0.5 * 0.96)
    assert out["dispatch_max_s"] == 1.5
    assert (out["ack_p50_s"], out["ack_max_s"]) == (1.0, 4.0)
    assert out["small_tenants_dispatch_p99_s"] == pytest.approx(0.25 + 0.5 * 0.99)


def test_steady_figures_and_runs_fired_before_delivery() -> None:
    rows = [row("tenant-00", "succeeded", 1, 0.1, 0.2), row("tenant-01", None, 0, None, None)]
    out = summarize(rows, window_s=2.0)
    assert out["states"] == {"none": 1, "succeeded": 1}
    assert (out["without_delivery_state"], out["lost"]) == (1, 1)
    assert out["throughput_runs_per_s"] == 0.5
    assert (out["small_tenants_dispatch_p99_s"], out["last_ack_s"]) == (None, None)


def test_no_runs() -> None:
    out = summarize([], window_s=2.0)
    assert (out["runs"], out["succeeded"], out["lost"], out["attempts"]) == (0, 0, 0, {})
    assert (out["dispatch_p50_s"], out["ack_max_s"], out["throughput_runs_per_s"]) == (None, None, 0.0)


def test_worker_plans() -> None:
    herd = ["big", "small-000", "small-001"]
    assert worker_plan(herd, 2, "bench") == [("bench-worker-0", herd), ("bench-worker-1", herd)]
    assert worker_plan(herd, 2, "scheduler") == [("worker-0", herd), ("worker-1", herd)]
    steady = ["tenant-00", "tenant-01", "tenant-02"]
    assert [w for w, _ in worker_plan(steady, 4, "scheduler")] == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert worker_plan(steady, 0, "scheduler") == worker_plan(herd, 0, "bench") == []


def test_worker_impl_names() -> None:
    assert check_impl("bench") == "bench"
    assert check_impl("scheduler") == "scheduler"
    with pytest.raises(ValueError, match="worker impl 'thread': choose from scheduler, bench"):
        check_impl("thread")
