"""A small step of bench/ingest_steps.py, so that it cannot rot: each step of taking a frame in is
timed for hosts of 8 and 64 CPUs, in frames as agents send them and as older ones did (each CPU's
reading, each NVLink's traffic and peer), and over a small fleet with each frame new; its times are
figures, not asserted."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_each_step_is_timed_for_each_host_size() -> None:
    document = bench_json(
        "ingest_steps", "--cpus", "8,64", "--number", "20", "--repeat", "1", "--nodes", "20", "--rounds", "1"
    )
    small, large = document
    assert (small["cpus"], large["cpus"]) == (8, 64)
    # The frames count the CPUs per governor: a bigger host adds no bytes (a count's varint at most).
    assert abs(large["frame_bytes"] - small["frame_bytes"]) <= 2
    for result in document:  # the same path over a fleet: each step's CPU, and their sum
        fleet = result["fleet"]
        assert (fleet["nodes"], fleet["rounds"]) == (20, 1)
        steps = {k: v for k, v in fleet["us"].items() if k != "total"}
        assert set(steps) == {"parse", "checks", "plan", "write and apply", "to the detection process"}
        assert all(us > 0 for us in steps.values())
        assert abs(fleet["us"]["total"] - sum(steps.values())) < 1e-6
    no_fleet = ("--nodes", "0")
    per_cpu = bench_json(
        "ingest_steps", "--cpus", "8,64", "--per-cpu", "--number", "20", "--repeat", "1", *no_fleet
    )
    assert per_cpu[1]["frame_bytes"] > per_cpu[0]["frame_bytes"] > small["frame_bytes"]  # a reading each
    per_link = bench_json(
        "ingest_steps", "--cpus", "8", "--per-link", "--number", "20", "--repeat", "1", *no_fleet
    )
    assert "fleet" not in per_link[0]
    # Each of a frame's 144 NVLinks with its traffic and peer, as older agents sent them: 36 bytes more.
    assert per_link[0]["frame_bytes"] - small["frame_bytes"] >= 144 * 30
    for result in document + per_cpu + per_link:
        assert set(result["us"]) >= {"parse", "screen", "plan (screen, conditions)"}
        assert all(us > 0 for us in result["us"].values())
