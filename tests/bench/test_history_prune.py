"""A small step of bench/history_prune.py, so that it cannot rot: 6 nodes with 10 logged rounds; one
round pruned as before (one DELETE) and one through the store's prune, 4 nodes a job."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_an_old_stores_prune_is_timed_both_ways() -> None:
    row = bench_json("history_prune", "--nodes", "6", "--rounds", "10", "--fleet", "12")
    assert row["rows"] == 6 * 10 * 57
    assert row["before_removed"] == row["after_removed"] == 6 * 57  # one round each way
    assert row["after_jobs"] == 1 + 2  # the look, then 6 nodes 4 at a time
    assert 0 < row["after_longest_job_s"] <= row["after_jobs_s"]
    assert row["fleet_before_job_s"] == 2 * row["before_job_s"]  # twice the nodes: twice the scan
