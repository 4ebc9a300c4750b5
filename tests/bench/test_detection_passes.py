"""A small step of bench/detection_passes.py, so that it cannot rot: 24 nodes, pools of 1 and 3
detection processes, the same findings from each (its times are figures, not asserted)."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_passes_are_timed_for_each_pool_size() -> None:
    document = bench_json("detection_passes", "--nodes", "24", "--processes", "1,3", "--passes", "1")
    one, three = document["rows"]
    assert (one["processes"], three["processes"], document["nodes"]) == (1, 3, 24)
    assert one["findings"] == three["findings"]
    assert one["longest_share_s"] == one["detectors_s"]  # one process runs them all
    for row in (one, three):
        assert 0 < row["longest_share_s"] <= row["detectors_s"] and row["pass_s"] > 0
        assert row["copy_s"] > 0 and 0 <= row["loop_stall_s"] < row["copy_s"]


def test_fresh_passes_follow_a_frame_of_every_node() -> None:
    document = bench_json(
        "detection_passes", "--nodes", "16", "--processes", "1,2", "--passes", "2", "--fresh"
    )
    for row in document["rows"]:
        assert row["fresh"] and row["frames_s"] > 0 and row["pass_s"] > 0
    plain = bench_json("detection_passes", "--nodes", "16", "--processes", "1", "--passes", "1")
    [row] = plain["rows"]
    assert not row["fresh"] and row["frames_s"] == 0


def test_passes_after_hellos_follow_the_nodes_saying_hello_again() -> None:
    document = bench_json(
        "detection_passes", "--nodes", "16", "--processes", "1", "--passes", "2", "--hellos", "4"
    )
    [row] = document["rows"]
    assert row["hellos"] == 4 and not row["fresh"]
    assert row["frames_s"] > 0 and row["pass_s"] > 0  # the processes took the Hellos in before it
