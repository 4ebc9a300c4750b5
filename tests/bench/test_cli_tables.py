"""bench/cli_tables.py: a small step, so that it cannot rot, and its check that the table printed
without rich's per-cell layout is rich's, character for character."""

from __future__ import annotations

from tests.bench.scripts import bench_json


def test_a_small_step_prints_every_way_and_the_same_table_as_rich() -> None:
    results = bench_json("cli_tables", "--nodes", "300", "--repeat", "1")
    assert results["nodes"] == 300
    for way in ("table", "wide", "json", "table (rich's layout)"):
        assert results[way]["s"] > 0
    assert results["same_as_rich"] is True
    assert results["table_lines"] == 300 + 5  # title, top border, header, rule, rows, bottom border
