"""A small step of bench/controller_views.py, so that it cannot rot: 40 nodes, findings on a
quarter of them; the page and ListNodes cover the whole fleet (its times are figures, not asserted)."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_the_views_of_a_built_fleet_are_timed() -> None:
    row = bench_json("controller_views", "--nodes", "40", "--repeat", "2", "--finding-share", "0.25")
    assert (row["nodes"], row["list_nodes_nodes"], row["list_nodes_pages"]) == (40, 40, 1)
    assert row["get_node_probes"] > 0  # the built nodes' results, found through the index
    assert row["findings"] == 20  # 10 nodes, a GPU finding and a node-level one each
    # node_health: a series per node and state (healthy, degraded, critical, stale), the last
    # frame's time per node, one finding_active per finding, then the controller's own families
    assert row["series"] > 40 * 4 + 40 + 20
    # a node's GPU states and samples, its probe records and their series at least
    assert row["tracked_objects_per_node"] >= 8 + 8 + 2 * 57
    keys = (
        "fleet_kb_per_node",
        "tracked_objects_per_node",
        "full_collection_s",
        "scrape_s",
        "page_s",
        "generate_latest_s",
        "list_nodes_s",
        "list_nodes_longest_page_s",
        "probe_pass_s",
        "get_node_s",
    )
    for key in keys:
        assert row[key] > 0, key
