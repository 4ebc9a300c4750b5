"""A small step of bench/ingest_steps.py, so that it cannot rot: each step of taking a frame in is
timed for hosts of 8 and 64 CPUs (its times are figures, not asserted)."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_each_step_is_timed_for_each_host_size() -> None:
    document = bench_json("ingest_steps", "--cpus", "8,64", "--number", "20", "--repeat", "1")
    small, large = document
    assert (small["cpus"], large["cpus"]) == (8, 64)
    assert large["frame_bytes"] > small["frame_bytes"]  # a reading for each CPU
    for result in document:
        assert set(result["us"]) >= {"parse", "screen", "plan (screen, conditions)"}
        assert all(us > 0 for us in result["us"].values())
