"""A small step of bench/controller_startup.py, so that it cannot rot: 12 nodes with 5 probe rounds
of history each; the controller it starts loads all of it (its times are figures, not asserted)."""

from __future__ import annotations

import sys

from tests.bench.scripts import bench_json


def test_a_controller_start_on_a_filled_store_is_timed() -> None:
    row = bench_json("controller_startup", "--nodes", "12", "--rounds", "5")
    assert (row["nodes"], row["rounds"]) == (12, 5)
    # Every probe key of every node, each with its five rounds: the history came back from the store.
    assert row["probe_keys"] > 12 and row["history_points"] == 5 * row["probe_keys"]
    for key in ("start_s", "detection_s", "total_s", "controller_kb_per_node", "store_mb", "fill_s"):
        assert row[key] > 0, key
    if sys.platform == "linux":  # the load's high-water mark, read after resetting it
        assert row["load_peak_mb"] >= 0


def test_a_warm_standbys_takeover_is_timed() -> None:
    """--warm: the controller loads while another holder leads, then leads with that fleet; its
    first take-in reads every node again (all were written anew before the lead was let go)."""
    row = bench_json("controller_startup", "--nodes", "12", "--rounds", "5", "--warm")
    assert (row["nodes"], row["taken_in_nodes"]) == (12, 12)
    assert row["probe_keys"] > 12 and row["history_points"] == 5 * row["probe_keys"]
    for key in ("warm_load_s", "lead_wait_s", "led_to_serving_s", "first_take_in_s", "start_s"):
        assert row[key] > 0, key
    assert row["start_s"] >= row["lead_wait_s"] + row["led_to_serving_s"] - 0.01
