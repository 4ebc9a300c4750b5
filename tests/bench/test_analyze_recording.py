"""bench/analyze_recording.py: a small step, so that it cannot rot; what it measures has to add up."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_a_small_step_analyzes_through_the_window_and_whole() -> None:
    results = bench_json("analyze_recording", "--nodes", "6", "--rounds", "4,8", "--window", "5", "--whole")
    assert [(r["rounds"], r["window"]) for r in results] == [(4, 5), (4, "whole"), (8, 5), (8, "whole")]
    assert [r["messages"] for r in results] == [30, 30, 54, 54]  # each node's Hello and its frames
    assert all(r["same_findings"] for r in results)
    # node 3's throttled GPU: one finding, from every way of reading
    assert all("54 messages (6 hellos, 48 frames)" in r["summary"] for r in results[2:])
    assert all("1 findings (1 active at the end)" in r["summary"] for r in results[2:])
    assert all(r["peak_rss_mb"] > 0 and r["cpu_s"] > 0 and r["wall_s"] > 0 for r in results)


def test_a_compressed_recording_is_smaller_and_gives_the_same_findings() -> None:
    plain, packed = (
        bench_json("analyze_recording", "--nodes", "6", "--rounds", "6", "--window", "5", *extra)[0]
        for extra in ((), ("--gzip",))
    )
    assert (plain["compressed"], packed["compressed"]) == (False, True)
    assert packed["file_mb"] < plain["file_mb"] / 4
    assert packed["summary"].split(": ", 2)[2] == plain["summary"].split(": ", 2)[2]  # all but the name
    assert "1 findings (1 active at the end)" in packed["summary"]
