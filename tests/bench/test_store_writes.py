"""A small step of bench/store_writes.py, so that it cannot rot: a replica's frames and latest
readings written alone and four at a time, on SQLite."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_a_replicas_writes_are_costed_per_frame() -> None:
    doc = bench_json("store_writes", "--nodes", "8", "--batches", "1,4", "--rounds", "5")
    alone, four = doc["rows"]
    assert (alone["batch"], alone["frames"], four["batch"], four["frames"]) == (1, 5, 4, 20)
    assert alone["cpu_ms_per_frame"] > 0 and four["wall_ms_per_frame"] > 0
    assert four["statements_per_frame"] < alone["statements_per_frame"]  # one transaction for four
    assert alone["batches_run_again"] == four["batches_run_again"] == 0
