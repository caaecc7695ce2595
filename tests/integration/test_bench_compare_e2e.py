"""``bench compare``'s end-to-end rows at small scale: ours with worker processes
(``ours-e2e``, first claim of each run) and procrastinate (its handler's start) each hand
every occurrence to a worker exactly once; the ratios are taken against ours-e2e."""

from __future__ import annotations

from pathlib import Path

from bench.compare import Config, Work, add_ratios, run_one

STEADY = Work("steady", 40, seconds=2)


def config(pg_dsn: str, tmp_path: Path) -> Config:
    # The bench's workers: compare's 51 tenants would take 52 `scheduler worker` processes
    # (one per tenant); test_bench_deliver.py runs those.
    cfg = Config(pg_dsn, tmp_path, bound_s=20.0, lead_s=1.0, worker_impl="bench", echo=lambda line: None)
    cfg.log_dir.mkdir(parents=True)
    return cfg


def test_ours_e2e_hands_every_occurrence_to_a_worker_once(pg_dsn: str, tmp_path: Path) -> None:
    row = run_one(config(pg_dsn, tmp_path), "ours-e2e", STEADY, 2)
    assert (row["stage"], row["processes"], row["note"]) == ("handed", 2, None)
    assert (row["occurrences"], row["fired"], row["lost"], row["duplicates"]) == (80, 80, 0, 0)
    assert row["lag_p99_s"] is not None


def test_procrastinate_hands_every_occurrence_to_a_worker_once(pg_dsn: str, tmp_path: Path) -> None:
    row = run_one(config(pg_dsn, tmp_path), "procrastinate", STEADY, 1)
    assert (row["stage"], row["note"]) == ("handed", None)
    assert (row["occurrences"], row["fired"], row["lost"], row["duplicates"]) == (80, 80, 0, 0)


def test_end_to_end_ratios_are_against_ours_e2e() -> None:
    def row(system: str, throughput: float, p99: float) -> dict:
        stage = "fired" if system in ("ours", "naive") else "handed"
        return {
            "system": system,
            "workload": "herd",
            "processes": 1,
            "stage": stage,
            "throughput_runs_per_s": throughput,
            "lag_p99_s": p99,
        }

    rows = [row("naive", 100.0, 4.0), row("ours", 400.0, 1.0), row("ours-e2e", 200.0, 2.0), row("pgqueuer", 50.0, 8.0)]
    add_ratios(rows)
    assert [(r["ratio_vs_naive"], r["lag_p99_vs_naive"]) for r in rows] == [
        (1.0, 1.0),
        (4.0, 0.25),
        (2.0, 0.5),
        (0.5, 2.0),
    ]
    assert [(r.get("ratio_vs_ours_e2e"), r.get("lag_p99_vs_ours_e2e")) for r in rows] == [
        (None, None),
        (None, None),
        (1.0, 1.0),
        (0.25, 4.0),
    ]
