"""bench/record_cost.py: a small step, so that it cannot rot; what it measures has to add up."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_a_small_step_drains_and_runs_beside_the_loop() -> None:
    results = bench_json(
        "record_cost", "--frames", "40", "--rates", "50", "--seconds", "1", "--workers", "0,1", timeout=180
    )
    inline, workers = results["drain"]
    assert inline["workers"] == 0 and workers["workers"] == 1
    assert inline["written"] == workers["written"] == 40
    assert inline["bytes_per_frame"] == workers["bytes_per_frame"] > 10_000  # the same lines
    assert inline["workers_ms_per_frame"] == 0 < workers["workers_ms_per_frame"]
    assert workers["process_ms_per_frame"] < inline["process_ms_per_frame"]  # the mapping moved out
    baseline, *runs = results["beside_loop"]
    assert baseline["workers"] == "no recording" and baseline["loop_parses_per_s"] > 0
    assert [(r["workers"], r["rate"]) for r in runs] == [(0, 50), (1, 50)]
    assert all(r["dropped"] == 0 and r["written"] > 0 for r in runs)  # (written in time: a figure)
